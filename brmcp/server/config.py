"""The harness's configuration: :class:`HarnessConfig` (what an operator
sets), its defaults, and :class:`HarnessError` (the harness cannot start)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from .._ops.clock import Clock
from ..protocol.receipts import ReceiptSigner
from ..transport.router import RouterOptions
from .billing import Billing
from .pool import PoolConfig

__all__ = [
    "HOLD_SECONDS",
    "MAX_HELD_CALLS",
    "RECEIPT_MODES",
    "HarnessConfig",
    "HarnessError",
    "ReceiptMode",
]

#: When a harness with a receipt signer signs a call
#: (WIRE.md §Signed receipts): ``"paid"`` every charged, successful, non-refunded call;
#: ``"all"`` free successful calls too (``atoms`` 0); ``"off"`` none.
ReceiptMode = Literal["paid", "all", "off"]
#: The values :data:`ReceiptMode` allows, in the order errors name them.
RECEIPT_MODES: tuple[ReceiptMode, ...] = ("paid", "all", "off")

#: Default bound on how long a call marked ``brmcp/payAlongside`` is held
#: waiting for its tip's credit (seconds; WIRE.md §Pay alongside).
HOLD_SECONDS = 30.0
#: Default bound on calls held at once per caller.
MAX_HELD_CALLS = 4


class HarnessError(Exception):
    """The harness cannot start: bad configuration or unusable storage
    (the message names the file)."""


@dataclass(slots=True)
class HarnessConfig:
    """Harness settings (the Go reference's ``HarnessConfig``: karamble/brmcp,
    ``server/harness.go``).

    * ``data_dir``: holds the SQLite database (balances, paid-call journal,
      processed tips, audit rows). Required unless ``billing`` is set or
      ``store`` names a PostgreSQL database.
    * ``store``: where that book is kept (brmcp/server/store/url.py):
      ``"sqlite:"`` (the default, ``<data_dir>/brmcp.sqlite3``) or a
      PostgreSQL URL ``postgresql://user@host/dbname`` (``postgres://``
      also; ``?host=/socket/dir`` for a Unix socket; needs
      ``pip install "brmcp[postgres]"``), which several harness processes
      may share as one book. A bad value is a :class:`HarnessError`.
    * ``allowed_peers``: default-deny allowlist of caller uids (exact
      strings; use lowercase hex). ``allow`` replaces it entirely when set.
    * ``calls_per_minute``: token bucket per caller (capacity = burst),
      taken by each tools/call, resources/read and prompts/get.
    * ``tool_visible(peer, tool)``: hide tools per caller (hidden tools are
      absent from tools/list and unknown to tools/call). Resources,
      templates, prompts and completions are visible to every allowed peer;
      their handlers see ``ctx.peer`` and may refuse with an ``MCPError``.
    * ``billing``: an external balance store instead of the built-in ledger.
    * ``router_options``: transport settings (ttl, chunk size, ...).
    * ``name``/``version``: the MCP server implementation info.
    * ``clock``: unix seconds, for journal expiry.
    * ``timer``: the :class:`brmcp.Clock` the harness's bounded waits run on
      (the pay-alongside hold's ``hold_seconds`` and re-checks, the
      first-contact linger); None (the default) is anyio's monotonic clock.
      Tests pass a :class:`brmcp.ManualClock` and move it instead of sleeping.
    * ``tools_list_changed``: declare ``tools: {"listChanged": true}``
      (for tool sets that change at run time, e.g. brmcp/gateway).
    * ``hold_seconds`` / ``max_held_calls``: the pay-alongside hold (WIRE.md
      §Pay alongside): an underfunded call marked ``brmcp/payAlongside``
      waits at most ``hold_seconds`` for a credit, with at most
      ``max_held_calls`` such calls per caller (more are refused at once);
      ``hold_seconds <= 0`` or ``max_held_calls <= 0`` turns holding off.
    * ``receipt_signer`` / ``receipts``: signed receipts
      (WIRE.md §Signed receipts). With a :class:`~brmcp.protocol.receipts.ReceiptSigner` the
      harness announces its key under ``brmcp/receiptKey`` in every
      ``tools/list`` answer and marked ``initialize``, and signs the calls
      ``receipts`` selects (:data:`ReceiptMode`, default ``"paid"``); None
      (the default) signs nothing and announces nothing. Both are read
      live, so they may be set after construction.
    * ``pool``: the bot pool this bot is a member of (WIRE.md §Pools;
      :class:`~brmcp.server.pool.PoolConfig`), or None. Needs a PostgreSQL
      ``store`` (the members' shared book) and a ``receipt_signer`` (the
      pool's shared key); announced as ``brmcp/pool`` once the signer names
      this bot's uid (``receipt_signer.bot``) and it is among the members.
    """

    data_dir: str | os.PathLike[str] | None = None
    store: str = "sqlite:"
    allowed_peers: Iterable[str] = ()
    allow: Callable[[str], bool] | None = None
    calls_per_minute: int = 30
    tool_visible: Callable[[str, str], bool] | None = None
    billing: Billing | None = None
    router_options: RouterOptions = field(default_factory=RouterOptions)
    name: str = "brmcp"
    version: str = "0.1.0"
    clock: Callable[[], float] = time.time
    #: Declare ``tools.listChanged`` and remember sessions that list tools,
    #: so :meth:`Harness.notify_tool_list_changed` reaches them (the gateway
    #: sets it; off by default, so a plain harness answers as the Go one).
    tools_list_changed: bool = False
    hold_seconds: float = HOLD_SECONDS
    max_held_calls: int = MAX_HELD_CALLS
    timer: Clock | None = None
    receipt_signer: ReceiptSigner | None = None
    receipts: ReceiptMode = "paid"
    pool: PoolConfig | None = None
