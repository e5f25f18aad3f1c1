"""What the host supplies to build a bridge (BRIDGE.md §Embedding the library
in another daemon): :class:`BridgeConfig`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from brmcp._ops.clock import Clock, SystemClock
from brmcp._ops.listener import ListenerLimits
from brmcp.bridge.agent import MAX_BODY_BYTES
from brmcp.bridge.links import CONNECT_TIMEOUT, RetryPolicy
from brmcp.bridge.pay import Payer
from brmcp.transport.router import RouterOptions
from brmcp.transport.sender import PMSender

__all__ = ["BridgeConfig"]


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """What the host supplies (BRIDGE.md §Embedding the library in another daemon).

    * ``data_dir``: directory for ``mcpclient.json`` (settings),
      ``mcpspend.json`` (spend log) and ``mcpadmin.token``. Required.
    * ``sender``: the host's :class:`~brmcp.PMSender`. Required.
    * ``payer``: :class:`~brmcp.bridge.Payer`; ``pay(uid, atoms)`` returns
      only once the payment is confirmed. Required.
    * ``listen``: ``"host:port"`` on loopback for a listener the bridge owns
      and binds only while enabled; None when the host serves
      :attr:`Bridge.asgi_app` itself. Port 0 picks a free port.
    * ``name``: the MCP client name (version ``"1"``) and the prefix of
      refusal notes.
    * ``router_options``: transport settings for the bridge's router.
    * ``clock``: time source for timestamps, the spending window, approval
      timeouts and credit polls.
    * ``max_body_bytes``: largest MCP request body accepted (413 above).
    * ``connect_timeout``: seconds allowed for initialize (re-sent on the
      backoff meanwhile) and for the ``tools/list`` snapshot.
    * ``retry``: re-send timing and the initialize answer timeout
      (BRIDGE.md §Deadlines and re-sends).
    * ``uid``: this bridge's own BR uid, named in the hint an agent gets
      when a bot does not answer (None: not known).
    * ``listener_limits``: header-read and keep-alive timeouts and the
      connection cap of the owned listener (BRIDGE.md "Listener limits").
    """

    data_dir: str | os.PathLike[str]
    sender: PMSender
    payer: Payer
    listen: str | None = None
    name: str = "brmcp-bridge"
    router_options: RouterOptions = field(default_factory=RouterOptions)
    clock: Clock = field(default_factory=SystemClock)
    max_body_bytes: int = MAX_BODY_BYTES
    connect_timeout: float = CONNECT_TIMEOUT
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    uid: str | None = None
    listener_limits: ListenerLimits = field(default_factory=ListenerLimits)
