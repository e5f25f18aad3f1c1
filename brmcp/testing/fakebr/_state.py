"""The small parts of a fake brclient that the others share, each with its
own behaviour (server.py documents the fake as a whole):

* :class:`Settings`: the brclient it plays (identity, clientrpc options,
  ``TipUser`` guards, speed options), read live by every part;
* :class:`Record`: what it observed, for tests (requests, frames, upgrade
  headers, pings, keepalive round trips, connection and in-flight counts);
* :class:`Changes`: the "state changed" signal :meth:`FakeBRClient.wait_for`
  waits on;
* :class:`Controls`: the switches tests flip (paused reading, held
  methods, queued tip failures).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from ...clientrpc.types import VersionResponse
from .relay import TipFailure

__all__ = ["Changes", "Controls", "Record", "Settings"]


@dataclass(slots=True)
class Settings:
    """The brclient a fake plays; :class:`~.server.FakeBRClient` documents
    each field (its constructor arguments of the same names). ``uid`` is
    empty until the relay registers the user."""

    nick: str
    name: str
    sig_key: bytes
    version: VersionResponse
    auth_mode: str = ""
    rpcuser: str = ""
    rpcpass: str = ""
    ping_interval: float | None = 30.0
    ping_timeout: float = 10.0
    allow_remote_send_tip: bool = True
    max_remote_send_tip_amt: float = -1.0
    max_in_flight: int = 16
    pm_pacing: float = 0.0
    tip_restart_delay: float = 0.0
    uid: str = ""


@dataclass(slots=True)
class Record:
    """What a fake observed (the public counters of :class:`~.server.FakeBRClient`)."""

    #: Every request accepted: ``(method as sent, params as a plain value)``.
    requests: list[tuple[str, Any]] = field(default_factory=list)
    #: Every websocket data message received, as bytes.
    frames_in: list[bytes] = field(default_factory=list)
    #: Headers of every request to ``/ws`` (before auth and upgrade).
    upgrade_headers: list[dict[str, str]] = field(default_factory=list)
    #: Payloads of the pings clients sent (each answered with a 16-byte pong).
    pings_received: list[bytes] = field(default_factory=list)
    #: Keepalive round trips completed (an identical pong to the fake's own ping).
    keepalive_pongs: int = 0
    #: Websocket connections accepted so far.
    total_connections: int = 0
    #: The most requests seen in flight on one connection.
    max_in_flight_seen: int = 0


class Changes:
    """A level-triggered "something changed" signal: :meth:`changed` wakes
    every :meth:`wait_for`, which re-checks its predicate. Inactive (waits
    raise RuntimeError) until :meth:`start`."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def start(self) -> None:
        """Activate the signal (the fake is running)."""
        self._event = anyio.Event()

    def changed(self) -> None:
        """Wake every waiter."""
        if self._event is not None:
            self._event.set()
            self._event = anyio.Event()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` is true, re-checked at every change;
        RuntimeError while the signal is inactive."""
        while not predicate():
            if self._event is None:
                raise RuntimeError("FakeBRClient is not running")
            await self._event.wait()


class Controls:
    """The test switches: reading paused on every connection, unary methods
    held until released, and failures queued for the next ``TipUser`` calls."""

    __slots__ = ("_holds", "_paused", "_tip_failures")

    def __init__(self) -> None:
        self._paused: anyio.Event | None = None
        self._holds: dict[str, anyio.Event] = {}
        self._tip_failures: list[TipFailure] = []

    def pause_reading(self) -> None:
        if self._paused is None:
            self._paused = anyio.Event()

    def resume_reading(self) -> None:
        paused, self._paused = self._paused, None
        if paused is not None:
            paused.set()

    async def wait_reading(self) -> bool:
        """Wait while reading is paused; True when it was (the reader then
        re-checks), False at once when it is not."""
        paused = self._paused
        if paused is None:
            return False
        await paused.wait()
        return True

    def hold(self, method: str) -> None:
        self._holds.setdefault(method, anyio.Event())

    def release(self, method: str) -> None:
        gate = self._holds.pop(method, None)
        if gate is not None:
            gate.set()

    async def pass_hold(self, method: str) -> None:
        """Wait while ``method`` (``Service.Method``) is held."""
        gate = self._holds.get(method)
        if gate is not None:
            await gate.wait()

    def fail_next_tip(self, failure: TipFailure) -> None:
        self._tip_failures.append(failure)

    def next_tip_failure(self) -> TipFailure | None:
        """The failure queued for this ``TipUser`` call, if any (first in, first out)."""
        return self._tip_failures.pop(0) if self._tip_failures else None
