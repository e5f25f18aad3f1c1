"""Demultiplex Bison Relay PMs into per-(peer, sid) MCP sessions.

The :class:`Router` is the I/O shell around the sans-I/O codec in
:mod:`brmcp.wire`: hosts feed it every inbound PM with :meth:`Router.handle_pm`
and give it a :class:`~brmcp.PMSender` for outbound parts. Semantics follow
WIRE.md §Sessions and the Go reference's ``brmcp.Router``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.abc
from mcp.types import JSONRPCNotification, JSONRPCRequest, JSONRPCResponse, jsonrpc_message_adapter
from pydantic import ValidationError

from .. import wire
from .._ops.clock import Clock, SystemClock
from ._batching import BatchPeers, consume_mark
from ._inbox import message_cost
from .conn import Conn
from .outbox import DEFAULT_PM_INTERVAL, Outbox
from .sender import PMSender

__all__ = ["AcceptFunc", "AllowFunc", "Router", "RouterOptions", "RouterStats"]

log = logging.getLogger("brmcp.transport")

_MIB = 1 << 20

#: Seconds a router leaving its ``async with`` block waits for the PMs still
#: queued in its outbox to be handed to the sender.
DRAIN_SECONDS = 2.0

#: Server role: serve one new inbound session; the session closes when it returns.
AcceptFunc = Callable[[Conn], Awaitable[None]]
#: Admission check for a peer uid, run before any reassembly or session state.
AllowFunc = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class RouterOptions:
    """Router tuning (WIRE.md §Sessions).

    * ``ttl``: seconds added to the send time and stamped (floored) as
      ``exp`` on every outgoing part; must be > 0, so ``exp=0`` is never sent.
    * ``chunk_size``: raw bytes per part before base64.
    * ``assembler``: reassembly bounds.
    * ``inbox_size``: decoded messages queued per session; overflow closes
      the session.
    * ``inbox_bytes``: estimated memory of the messages queued in one
      session (:func:`brmcp.transport._inbox.message_cost`, an upper estimate of the
      decoded form); ``peer_inbox_bytes``: the same across all sessions of
      one peer. A message that would pass either closes its session, which
      drops its unread messages; a message whose cost alone passes
      ``inbox_bytes`` is refused before it is decoded (WIRE.md §Inboxes).
    * ``idle_timeout``: seconds without a delivered inbound message or a
      write after which a session is closed. ``"auto"`` selects 600 s in the
      server role and no expiry in the client role; None disables it.
    * ``max_sessions_per_peer``: cap on sessions per peer, enforced when an
      inbound session would be created (dialed sessions count but are never
      refused); None means unbounded.
    * ``pm_interval``: seconds between two PMs handed to the sender for one
      peer (:mod:`brmcp.transport.outbox`; a real brclient delivers them
      about 104 ms apart, faster ones only wait in its queue); 0 hands
      them over at once.
    * ``batch``: accept, announce and send batch PMs (WIRE.md §Batches);
      ``batch_bytes``: the largest batch PM text, bytes (at most
      :data:`brmcp.wire.MAX_BATCH_BYTES`). Batch PMs that arrive are
      always accepted.

    Raises ValueError for out-of-range values.
    """

    ttl: float = 600.0
    chunk_size: int = wire.DEFAULT_CHUNK_SIZE
    assembler: wire.AssemblerConfig = field(default_factory=wire.AssemblerConfig)
    inbox_size: int = 128
    inbox_bytes: int = 32 * _MIB
    peer_inbox_bytes: int = 64 * _MIB
    idle_timeout: float | Literal["auto"] | None = "auto"
    max_sessions_per_peer: int | None = 8
    pm_interval: float = DEFAULT_PM_INTERVAL
    batch: bool = True
    batch_bytes: int = wire.MAX_BATCH_BYTES

    def __post_init__(self) -> None:
        if not self.ttl > 0:
            raise ValueError(f"ttl must be > 0 seconds, got {self.ttl!r}")
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be > 0 bytes, got {self.chunk_size!r}")
        if self.inbox_size < 1:
            raise ValueError(f"inbox_size must be >= 1, got {self.inbox_size!r}")
        for name in ("inbox_bytes", "peer_inbox_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 byte, got {getattr(self, name)!r}")
        if self.idle_timeout != "auto" and self.idle_timeout is not None and not self.idle_timeout > 0:
            raise ValueError(f"idle_timeout must be > 0 seconds, None or 'auto', got {self.idle_timeout!r}")
        if self.max_sessions_per_peer is not None and self.max_sessions_per_peer < 1:
            raise ValueError(
                f"max_sessions_per_peer must be >= 1 or None, got {self.max_sessions_per_peer!r}"
            )
        if not 0 <= self.pm_interval <= 10:
            raise ValueError(f"pm_interval must be within 0..10 seconds, got {self.pm_interval!r}")
        if not 4096 <= self.batch_bytes <= wire.MAX_BATCH_BYTES:
            raise ValueError(
                f"batch_bytes must be within 4096..{wire.MAX_BATCH_BYTES} bytes, got {self.batch_bytes!r}"
            )


@dataclass(slots=True)
class RouterStats:
    """Counters for observability and tests. Every inbound part (a PM, or
    one line of a batch PM) lands in exactly one of the
    ``pms_ignored``/``dropped_*``/``messages_delivered`` buckets or is still
    partial; ``pms_received`` counts PMs plus the lines of batches beyond
    their first, so the buckets still add up to it."""

    pms_received: int = 0
    pms_ignored: int = 0  #: not an envelope (chat), or arrived after close or :meth:`Router.stop_intake`
    dropped_denied: int = 0  #: allow(peer) refused
    dropped_expired: int = 0
    dropped_too_large: int = 0
    dropped_buffer_full: int = 0
    dropped_part_count: int = 0
    dropped_invalid_jsonrpc: int = 0
    dropped_unknown_session: int = 0  #: client role: no such sid
    dropped_session_cap: int = 0
    inbox_overflows: int = 0  #: sessions closed by a full inbox (count or bytes)
    dropped_unread: int = 0  #: unread messages dropped with an overflowing session
    messages_delivered: int = 0
    sessions_opened: int = 0
    sessions_closed: int = 0
    idle_expired: int = 0
    pms_sent: int = 0  #: PMs handed to the sender (a batch counts once)
    parts_sent: int = 0  #: envelope parts those PMs carried
    batches_sent: int = 0  #: PMs that carried more than one part
    batches_received: int = 0
    messages_sent: int = 0
    send_failures: int = 0  #: request/response PMs that failed (each closed its session)
    #: Notifications whose PM failed: dropped, their session kept open.
    notifications_dropped: int = 0
    #: Server role: requests delivered to a session whose answer was then written.
    requests_answered: int = 0
    #: PMs a host left in brclient unread because intake had stopped (the
    #: next start gets them; not counted in ``pms_received``).
    pms_held: int = 0


_WIRE_DROPS: dict[type[wire.WireError], str] = {
    wire.ExpiredError: "dropped_expired",
    wire.TooLargeError: "dropped_too_large",
    wire.BufferFullError: "dropped_buffer_full",
    wire.PartCountError: "dropped_part_count",
}


class Router:
    """Route PMs to MCP sessions; an async context manager owning its tasks.

    ``accept`` set means the server role: every new inbound (peer, sid)
    becomes a :class:`Conn` served by ``accept(conn)`` in a task the router
    owns. Without ``accept`` (client role) sessions come only from
    :meth:`dial` and inbound parts for unknown sids are dropped. ``allow`` is
    checked after parsing and before any reassembly or session state.

    ``clock`` is the time of every timer: the ``exp`` stamped on outgoing
    parts and checked on incoming ones (``ttl``, WIRE.md §Deadlines), session
    activity, and the idle sweeper, which sleeps on it, so a
    :class:`~brmcp.ManualClock` drives idle expiry without waiting. A
    :class:`~brmcp.Clock` (``now()`` unix seconds, ``sleep(seconds)``); a
    plain function returning unix seconds is still accepted (the sweeper then
    sleeps in real time). Default: :class:`~brmcp.SystemClock`.

    Use as ``async with Router(...) as router:``; the server role and idle
    expiry need the router entered. Leaving the block closes every session
    and cancels the router's tasks.
    """

    def __init__(
        self,
        sender: PMSender,
        *,
        accept: AcceptFunc | None = None,
        allow: AllowFunc | None = None,
        options: RouterOptions | None = None,
        clock: Clock | Callable[[], float] | None = None,
    ) -> None:
        self.sender = sender
        self.options = options or RouterOptions()
        self.stats = RouterStats()
        self._accept = accept
        self._allow = allow
        self._clock, self._sleep = _timers(clock)
        idle = self.options.idle_timeout
        self._idle: float | None = (600.0 if accept is not None else None) if idle == "auto" else idle
        self._assembler = wire.Assembler(self.options.assembler)
        self._sessions: OrderedDict[tuple[str, str], Conn] = OrderedDict()
        self._per_peer: dict[str, int] = {}
        self._peer_sessions: dict[str, dict[str, Conn]] = {}
        self._closed = False
        self._intake_stopped = False
        #: Server role: requests delivered to sessions and not yet answered.
        self._pending = 0
        #: Set whenever a pending request was answered or given up.
        self._settled_event = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._exiting = False
        self._outbox = Outbox(
            self._send_pm,
            interval=self.options.pm_interval,
            stats=self.stats,
            limit=self.batch_limit,
            spawn=self._spawn,
        )
        self._batch_peers = BatchPeers(self.options.batch_bytes)

    async def _send_pm(self, peer: str, text: str) -> None:
        await self.sender.send_pm(peer, text)

    def _spawn(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: object) -> bool:
        """Start one of the outbox's flushers in the router's task group."""
        if self._tg is None or self._exiting:
            return False
        self._tg.start_soon(fn, *args, name="brmcp-router-outbox")
        return True

    @property
    def task_group(self) -> anyio.abc.TaskGroup | None:
        """The task group the sessions run in while the router is entered
        (None before and after): work that must outlive one session, but not
        the router, starts here."""
        return None if self._exiting else self._tg

    # -- lifecycle -----------------------------------------------------------

    async def __aenter__(self) -> Router:
        if self._tg is not None:
            raise RuntimeError("Router already entered")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        if self._idle is not None:
            tg.start_soon(self._sweep, name="brmcp-router-idle-sweeper")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        # What sessions wrote is handed to the sender before they close (a
        # bot's last answers), for at most DRAIN_SECONDS.
        with anyio.CancelScope(shield=True), anyio.move_on_after(DRAIN_SECONDS):
            await self._outbox.drained()
        self._exiting = True
        self.close()
        tg = self._tg
        assert tg is not None
        tg.cancel_scope.cancel()
        return await tg.__aexit__(exc_type, exc_val, exc_tb)

    def close(self) -> None:
        """Close every session and refuse further traffic and dials. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for conn in list(self._sessions.values()):
            conn.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def stop_intake(self) -> None:
        """Take no new inbound traffic, ahead of a stop (the sessions stay
        open and what they write still goes out): every PM handed to
        :meth:`handle_pm` from now on is ignored (``stats.pms_ignored``). A
        host that acknowledges PMs should not hand them over at all once
        :attr:`intake_stopped` is true, and leave them unacknowledged, so
        that the next start gets them from brclient's replay log (run_bot
        does, counting them in ``stats.pms_held``). Idempotent."""
        self._intake_stopped = True

    @property
    def intake_stopped(self) -> bool:
        """True once :meth:`stop_intake` was called."""
        return self._intake_stopped

    @property
    def pending_requests(self) -> int:
        """Server role: JSON-RPC requests delivered to a session and not yet
        answered (its response written to the outbox), nor given up (the
        session closed, or the peer sent ``notifications/cancelled`` for it,
        which the MCP SDK never answers)."""
        return self._pending

    async def requests_answered(self) -> None:
        """Return once :attr:`pending_requests` is 0 (at once when it is)."""
        while self._pending:
            if self._settled_event.is_set():
                self._settled_event = anyio.Event()
            await self._settled_event.wait()

    def outbox_waiting(self) -> int:
        """Envelope parts queued for every peer, not yet handed to the sender."""
        return self._outbox.total_waiting()

    async def outbox_drained(self) -> None:
        """Return once nothing waits in the outbox (every PM written so far
        was handed to the sender, or failed); at once when it is empty. The
        outbox's flushers run in the router's task group, so the router
        must be entered and not cancelled for this to progress."""
        await self._outbox.drained()

    @property
    def idle_timeout(self) -> float | None:
        """The effective idle timeout in seconds (None: no expiry)."""
        return self._idle

    # -- observation -----------------------------------------------------------

    @property
    def assembler(self) -> wire.Assembler:
        """The reassembly state (read its counters; do not feed it)."""
        return self._assembler

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def sessions_of(self, peer: str) -> int:
        """Open sessions (dialed and accepted) with ``peer``."""
        return self._per_peer.get(peer, 0)

    def session(self, peer: str, sid: str) -> Conn | None:
        return self._sessions.get((peer, sid))

    def batch_limit(self, peer: str) -> int | None:
        """The largest batch PM (bytes) this router sends ``peer``; None
        while the peer has not announced that it accepts batches (WIRE.md
        §Batches), or when ``RouterOptions.batch`` is off."""
        if not self.options.batch:
            return None
        return self._batch_peers.limit(peer)

    def waiting_parts(self, peer: str) -> int:
        """Envelope parts queued for ``peer`` behind the pacing, not yet
        handed to the sender."""
        return self._outbox.waiting(peer)

    # -- traffic ---------------------------------------------------------------

    def dial(self, peer: str) -> Conn:
        """Open a client session to ``peer`` with a fresh random sid.

        Never limited by ``max_sessions_per_peer``. Raises RuntimeError
        (``brmcp: router closed``) after :meth:`close`.
        """
        if self._closed:
            raise RuntimeError("brmcp: router closed")
        sid = wire.new_id()
        while (peer, sid) in self._sessions:
            sid = wire.new_id()
        return self._register(peer, sid, self._clock())

    def handle_pm(self, peer: str, text: str) -> None:
        """Feed one inbound PM from ``peer`` (a lowercase 64-hex uid).

        Chat and anything else that is not an envelope is ignored. Never
        blocks and never raises for bad input: refusals are counted in
        :attr:`stats` and logged at debug level with the peer and the reason.
        Raises RuntimeError only when a server-role router is used before it
        was entered.
        """
        lines = wire.split_batch(text)
        if lines is None:
            self.stats.pms_received += 1
            self._handle_part(peer, text)
            return
        self.stats.batches_received += 1
        self.stats.pms_received += max(1, len(lines))
        if not lines:
            self.stats.pms_ignored += 1
        for position, line in enumerate(lines):
            self._handle_part(peer, line, position)

    def _handle_part(self, peer: str, text: str, position: int = 0) -> None:
        stats = self.stats
        part = wire.parse(text)
        if part is None or self._closed or self._intake_stopped:
            stats.pms_ignored += 1
            return
        allow = self._allow
        if allow is not None:
            try:
                admitted = bool(allow(peer))
            except Exception:
                log.exception("allow(%s) raised; treating the peer as not allowed", peer)
                admitted = False
            if not admitted:
                stats.dropped_denied += 1
                log.debug("drop part from %s: peer not allowed", peer)
                return
        now = self._clock()
        try:
            payload = self._assembler.add(peer, part, now)
        except wire.WireError as exc:
            name = _WIRE_DROPS.get(type(exc), "dropped_too_large")
            setattr(stats, name, getattr(stats, name) + 1)
            log.debug("drop part from %s sid=%s mid=%s: %s", peer, part.sid, part.mid, exc)
            return
        if payload is None:
            return
        cost = message_cost(payload)
        opts = self.options
        if cost > opts.inbox_bytes or cost > opts.peer_inbox_bytes:
            # No inbox can ever hold it: refused before it is decoded.
            stats.dropped_too_large += 1
            log.debug(
                "drop message from %s sid=%s: %d bytes decoded passes the inbox bound", peer, part.sid, cost
            )
            known = self._sessions.get((peer, part.sid))
            if known is not None:
                self._overflow(known, "a message larger than the inbox bound")
            return
        try:
            message = jsonrpc_message_adapter.validate_json(payload, by_name=False)
        except (ValidationError, ValueError) as exc:
            stats.dropped_invalid_jsonrpc += 1
            reason = exc.errors()[0]["type"] if isinstance(exc, ValidationError) else type(exc).__name__
            log.debug("drop message from %s sid=%s: not JSON-RPC (%s)", peer, part.sid, reason)
            return
        mark = consume_mark(message)
        if self.options.batch:
            self._batch_peers.heard(peer, mark, response=isinstance(message, JSONRPCResponse))
        key = (peer, part.sid)
        conn = self._sessions.get(key)
        if conn is None:
            if self._accept is None:
                stats.dropped_unknown_session += 1
                log.debug("drop message from %s: no session sid=%s and no accept", peer, part.sid)
                return
            cap = self.options.max_sessions_per_peer
            if cap is not None and self._per_peer.get(peer, 0) >= cap:
                stats.dropped_session_cap += 1
                log.debug("drop message from %s sid=%s: session cap %d reached", peer, part.sid, cap)
                return
            if self._tg is None:
                raise RuntimeError("server-role Router used before 'async with router' entered it")
            conn = self._register(peer, part.sid, now)
            # The task first runs after this (sync) method returned, so the
            # message below is already queued for it.
            self._tg.start_soon(self._serve, conn, name=f"brmcp-session-{peer[:8]}/{part.sid}")
        else:
            conn.last_activity = now
            self._sessions.move_to_end(key)
        del payload
        if conn.queued_bytes + cost > opts.inbox_bytes:
            self._overflow(conn, f"over {opts.inbox_bytes} bytes queued")
        elif self._peer_queued(peer) + cost > opts.peer_inbox_bytes:
            self._overflow(conn, f"over {opts.peer_inbox_bytes} bytes queued across the peer's sessions")
        elif conn._deliver(conn._make_message(message), cost, position):
            stats.messages_delivered += 1
            if self._accept is not None and not conn.closed:
                if isinstance(message, JSONRPCRequest):
                    conn._expect_answer(message.id)
                elif isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
                    params = message.params or {}
                    rid = params.get("requestId")
                    if isinstance(rid, int | str) and not isinstance(rid, bool):
                        conn._answered(rid, answered=False)
        else:
            self._overflow(conn, f"over {opts.inbox_size} messages queued")

    def _overflow(self, conn: Conn, why: str) -> None:
        """Close an overflowing session and drop what its reader has not read."""
        self.stats.inbox_overflows += 1
        self.stats.dropped_unread += conn._discard_unread()
        log.debug("inbox of session %s/%s overflowed (%s); closing it", conn.peer, conn.sid, why)
        conn.close()

    def queued_bytes(self, peer: str) -> int:
        """Estimated memory of the inbound messages of ``peer`` waiting in its
        sessions' inboxes (bounded by ``RouterOptions.peer_inbox_bytes``)."""
        return self._peer_queued(peer)

    def _peer_queued(self, peer: str) -> int:
        return sum(c.queued_bytes for c in self._peer_sessions.get(peer, {}).values())

    # -- internals -------------------------------------------------------------

    def _register(self, peer: str, sid: str, now: float) -> Conn:
        conn = Conn(self, peer, sid, self.options.inbox_size, now)
        self._sessions[(peer, sid)] = conn
        self._peer_sessions.setdefault(peer, {})[sid] = conn
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        self.stats.sessions_opened += 1
        return conn

    def _forget(self, conn: Conn) -> None:
        key = (conn.peer, conn.sid)
        if self._sessions.get(key) is not conn:
            return
        del self._sessions[key]
        mine = self._peer_sessions.get(conn.peer)
        if mine is not None:
            mine.pop(conn.sid, None)
            if not mine:
                del self._peer_sessions[conn.peer]
        self.stats.sessions_closed += 1
        count = self._per_peer.get(conn.peer, 0)
        if count <= 1:
            self._per_peer.pop(conn.peer, None)
        else:
            self._per_peer[conn.peer] = count - 1

    def _requests_settled(self, count: int, *, answered: bool) -> None:
        """``count`` pending requests were answered (``answered``) or given up."""
        self._pending -= count
        if answered:
            self.stats.requests_answered += count
        self._settled_event.set()

    def _request_pending(self) -> None:
        self._pending += 1

    def _touch(self, conn: Conn) -> None:
        key = (conn.peer, conn.sid)
        if self._sessions.get(key) is conn:
            self._sessions.move_to_end(key)

    async def _serve(self, conn: Conn) -> None:
        accept = self._accept
        assert accept is not None
        try:
            await accept(conn)
        except Exception:
            log.exception("session %s/%s: accept handler failed", conn.peer, conn.sid)
        finally:
            conn.close()

    async def _sweep(self) -> None:
        idle = self._idle
        assert idle is not None
        interval = min(max(idle / 4, 0.1), 60.0)
        sessions = self._sessions
        while True:
            await self._sleep(interval)
            now = self._clock()
            while sessions:
                conn = next(iter(sessions.values()))
                if now - conn.last_activity <= idle:
                    break
                log.debug("session %s/%s idle %.1fs; closing", conn.peer, conn.sid, now - conn.last_activity)
                self.stats.idle_expired += 1
                conn.close()


def _timers(
    clock: Clock | Callable[[], float] | None,
) -> tuple[Callable[[], float], Callable[[float], Awaitable[None]]]:
    """The router's ``(now, sleep)`` for its ``clock`` argument: a Clock's
    own pair, a bare time function with a real sleep, or the system clock's."""
    if clock is None:
        clock = SystemClock()
    if isinstance(clock, Clock):
        return clock.now, clock.sleep
    return clock, anyio.sleep
