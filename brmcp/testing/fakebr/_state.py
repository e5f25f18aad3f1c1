"""The state the parts of a fake brclient share: :class:`_FakeState`
declares every attribute :class:`~.server.FakeBRClient` sets up, so each part
(events, method handlers, websocket sessions, HTTP) can live in its own
module as a mixin over it (server.py documents the behaviour)."""

from __future__ import annotations

from typing import Any

import anyio

from ...clientrpc.types import VersionResponse
from ._conn import _Conn, _Stream
from .relay import FakeRelay, TipFailure
from .replaylog import ReplayLog

__all__ = ["_FakeState"]


class _FakeState:
    """Attributes shared by the mixins of :class:`~.server.FakeBRClient`
    (assigned in its ``__init__``; see there for their meaning)."""

    relay: FakeRelay
    nick: str
    name: str
    uid: str
    sig_key: bytes
    auth_mode: str
    rpcuser: str
    rpcpass: str
    ping_interval: float | None
    ping_timeout: float
    allow_remote_send_tip: bool
    max_remote_send_tip_amt: float
    version: VersionResponse
    max_in_flight: int
    wallet: bool
    pm_pacing: float
    tip_restart_delay: float
    logs: dict[str, ReplayLog[Any]]
    requests: list[tuple[str, Any]]
    frames_in: list[bytes]
    upgrade_headers: list[dict[str, str]]
    pings_received: list[bytes]
    total_connections: int
    max_in_flight_seen: int
    _started_at: float
    _streams: dict[str, list[_Stream]]
    _conns: list[_Conn]
    _serial: int
    _change: anyio.Event | None
    _paused: anyio.Event | None
    _holds: dict[str, anyio.Event]
    _tip_failures: list[TipFailure]

    def _changed(self) -> None:
        if self._change is not None:
            self._change.set()
            self._change = anyio.Event()
