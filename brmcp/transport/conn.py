"""One MCP session over Bison Relay PMs: the SDK transport pair.

A :class:`Conn` is created by a :class:`~brmcp.Router` (``dial`` for the
client role, ``accept`` for the server role). Its :attr:`Conn.read_stream`
and :attr:`Conn.write_stream` satisfy the MCP SDK transport protocols, so
``ClientSession(conn.read_stream, conn.write_stream)`` and
``server.run(conn.read_stream, conn.write_stream, ...)`` work unmodified.
"""

from __future__ import annotations

import logging
import math
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp.types import (
    INTERNAL_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
)

from .. import wire
from ._batching import BatchPeers, marked_payload
from .outbox import Outbox
from .sender import PMSender, SendError

__all__ = ["Conn", "SendReceipt", "SessionHost", "send_deadline", "send_receipt"]


class _SendOptions(Protocol):
    """The parts of ``RouterOptions`` a session's writes use."""

    @property
    def ttl(self) -> float: ...

    @property
    def chunk_size(self) -> int: ...

    @property
    def batch(self) -> bool: ...

    @property
    def batch_bytes(self) -> int: ...


class _SendStats(Protocol):
    """The ``RouterStats`` counters a session's writes update."""

    messages_sent: int
    send_failures: int
    notifications_dropped: int


class SessionHost(Protocol):
    """What a :class:`Conn` needs from the router that owns it. The
    :class:`~brmcp.Router` implements it; ``conn`` depends on this protocol,
    never on ``router`` (no import cycle)."""

    sender: PMSender
    _outbox: Outbox
    _batch_peers: BatchPeers

    @property
    def options(self) -> _SendOptions: ...

    def batch_limit(self, peer: str) -> int | None: ...

    @property
    def stats(self) -> _SendStats: ...

    def _clock(self) -> float: ...

    def _forget(self, conn: Conn) -> None: ...

    def _touch(self, conn: Conn) -> None: ...

    def _request_pending(self) -> None: ...

    def _requests_settled(self, count: int, *, answered: bool) -> None: ...


log = logging.getLogger("brmcp.transport")

#: Bytes a part's header and a batch's tag line take at most (a 32-hex sid
#: and mid, seq 64/64, a 20-digit exp): what a part's base64 leaves of a batch PM.
_PART_OVERHEAD = 256

#: When set (unix seconds on the router's clock), messages written from this
#: context carry ``exp`` no later than it, so every re-sent copy of a request
#: expires with the first one (BRIDGE.md §Deadlines and re-sends): a bot that
#: comes online after the caller's deadline drops all of them.
send_deadline: ContextVar[float | None] = ContextVar("brmcp_send_deadline", default=None)


class SendReceipt:
    """When one outbound request left this side. Set it in
    :data:`send_receipt` before writing the request; the first JSON-RPC
    request a :class:`Conn` writes in that context *claims* it (later writes
    there, and notifications or responses, leave it alone) and it records:

    * ``claimed`` / ``started_at``: the write began (its first PM call);
    * ``left_at``: the PM call of its last part returned, i.e. the host's
      :class:`~brmcp.PMSender` (brclient) accepted every part;
    * ``failed``: the write raised or was cancelled before that
      (``left_at`` stays None);
    * ``parts``: PMs the message took.

    ``settled`` is set once ``left_at`` or ``failed`` is. Times are
    :func:`anyio.current_time` seconds (monotonic). A re-send loop starts a
    copy's retransmission timer at ``left_at`` (BRIDGE.md §Deadlines and
    re-sends): the time a copy waits in brclient's PM queue is this side's
    queueing, neither a round trip nor a reason for one more copy."""

    __slots__ = ("claimed", "failed", "left_at", "parts", "settled", "started_at")

    def __init__(self) -> None:
        self.claimed = False
        self.failed = False
        self.started_at: float | None = None
        self.left_at: float | None = None
        self.parts = 0
        self.settled = anyio.Event()

    def _claim(self, parts: int) -> None:
        self.claimed = True
        self.parts = parts
        self.started_at = anyio.current_time()

    def _left(self) -> None:
        self.left_at = anyio.current_time()
        self.settled.set()

    def _fail(self) -> None:
        self.failed = True
        self.settled.set()


#: The :class:`SendReceipt` the next request written from this context fills
#: (None: no receipt).
send_receipt: ContextVar[SendReceipt | None] = ContextVar("brmcp_send_receipt", default=None)


#: The inbox constructor, parametrized once (not per session).
_new_inbox = anyio.create_memory_object_stream[SessionMessage | Exception]


class _WriteStream:
    """SDK ``WriteStream[SessionMessage]``: serialize compactly, split into
    envelope parts and send them in seq order through the host's PMSender."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    async def send(self, item: SessionMessage, /) -> None:
        await self._conn._write(item)

    async def aclose(self) -> None:
        self._conn.close()

    async def __aenter__(self) -> _WriteStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Conn:
    """One (peer, sid) session.

    Attributes: :attr:`peer` (the remote uid), :attr:`sid` (16 hex for dialed
    sessions, whatever the peer chose for accepted ones), :attr:`session_id`
    (``"<peer>/<sid>"``), :attr:`read_stream` (``SessionMessage | Exception``
    items; inbound messages carry ``ServerMessageMetadata(request_context=peer)``)
    and :attr:`write_stream`. :meth:`close` is idempotent and sends nothing to
    the peer: the protocol has no close frame (WIRE.md §Sessions).

    A failed PM send of a request or a response closes the session; the SDK
    then sees a transport error (``anyio.BrokenResourceError``, reported by
    the SDK as "Connection closed") and :attr:`error` holds the
    :class:`~brmcp.SendError`. A notification whose PM fails is dropped
    (``RouterStats.notifications_dropped``) and the session stays open: it
    is best effort, and losing it must not end a running (paid) call.
    """

    __slots__ = (
        "__weakref__",
        "_closed",
        "_inbox_limit",
        "_inbox_recv",
        "_inbox_send",
        "_meta",
        "_notification_drop_logged",
        "_pending",
        "_queued",
        "_queued_bytes",
        "_router",
        "_write_stream",
        "error",
        "last_activity",
        "peer",
        "sid",
    )

    def __init__(self, router: SessionHost, peer: str, sid: str, inbox_size: int, now: float) -> None:
        self._router = router
        self.peer = peer
        self.sid = sid
        self._inbox_send: MemoryObjectSendStream[SessionMessage | Exception]
        self._inbox_recv: MemoryObjectReceiveStream[SessionMessage | Exception]
        # Room for one whole batch beyond the bound (see _deliver).
        self._inbox_limit = inbox_size
        self._inbox_send, self._inbox_recv = _new_inbox(inbox_size + wire.MAX_BATCH_PARTS)
        self._write_stream = _WriteStream(self)
        self._meta = ServerMessageMetadata(request_context=peer)
        self._closed = False
        self.error: BaseException | None = None
        self._notification_drop_logged = False
        self.last_activity = now
        # The costs (brmcp.transport._inbox.message_cost) of the messages still in the
        # inbox buffer, oldest first; settled lazily against the buffer's size.
        # Allocated when a message first waits in the buffer (most messages go
        # straight to a waiting reader) and a list, not a deque: an idle
        # session whose last message waited keeps one small list, not a
        # deque's 64-slot block. At most inbox_size + MAX_BATCH_PARTS long.
        self._queued: list[int] | None = None
        self._queued_bytes = 0
        # Server role: the requests delivered and not yet answered, by
        # request id (its correlation key, _request_key), with how many
        # copies of that id wait (a peer may reuse an id; each is answered).
        self._pending: dict[int | str, int] | None = None

    @property
    def session_id(self) -> str:
        """``"<peer>/<sid>"``, unique within a router."""
        return f"{self.peer}/{self.sid}"

    @property
    def read_stream(self) -> MemoryObjectReceiveStream[SessionMessage | Exception]:
        """Inbound JSON-RPC messages, FIFO; ends (EOF) when the session closes."""
        return self._inbox_recv

    @property
    def write_stream(self) -> _WriteStream:
        """Outbound JSON-RPC messages; each becomes one or more PMs."""
        return self._write_stream

    @property
    def streams(self) -> tuple[MemoryObjectReceiveStream[SessionMessage | Exception], _WriteStream]:
        """``(read_stream, write_stream)``, the SDK transport pair."""
        return self._inbox_recv, self._write_stream

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (explicitly, by idle expiry, inbox
        overflow, a send failure or the router closing)."""
        return self._closed

    def close(self) -> None:
        """Close the session: readers get EOF, writers get
        ``ClosedResourceError``, the router forgets it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._inbox_send.close()
        # Unread messages stay reachable only through the receive stream,
        # which the reader drains or drops; the byte tally no longer counts them.
        self._queued = None
        self._queued_bytes = 0
        pending, self._pending = self._pending, None
        if pending:
            # Nobody can answer them any more.
            self._router._requests_settled(sum(pending.values()), answered=False)
        self._router._forget(self)

    async def __aenter__(self) -> Conn:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def queued_bytes(self) -> int:
        """The estimated memory (bytes) of the inbound messages waiting in the
        inbox, not yet read (WIRE.md §Inboxes)."""
        self._settle()
        return self._queued_bytes

    def _discard_unread(self) -> int:
        """Drop every message still waiting in the inbox (an overflowing
        session is closed and its unread messages must not stay in memory
        behind a reader that does not read); returns how many."""
        dropped = 0
        while True:
            try:
                self._inbox_recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            dropped += 1
        self._queued = None
        self._queued_bytes = 0
        return dropped

    def _settle(self) -> None:
        """Forget the costs of messages the reader took (the inbox is FIFO)."""
        queued = self._queued
        if not queued:
            return
        used = self._inbox_send.statistics().current_buffer_used if not self._closed else 0
        taken = len(queued) - used
        if taken <= 0:
            return
        if not used:
            self._queued_bytes = 0
            self._queued = None
            return
        self._queued_bytes -= sum(queued[:taken])
        del queued[:taken]

    def _deliver(self, message: SessionMessage | Exception, cost: int = 0, position: int = 0) -> bool:
        """Queue an inbound message of estimated memory ``cost`` without
        blocking; False when the inbox is full (the router then closes the
        session). ``position``: the lines of the same batch PM handled
        before this one, which arrived together and so get room beyond the
        bound (WIRE.md §Inboxes). A message handed straight to a waiting
        reader is not counted. A session whose reader has gone (the read stream was closed)
        is closed here: nobody can ever read it again, so it must not keep
        its slot under the per-peer cap."""
        self._settle()
        before = self._inbox_send.statistics().current_buffer_used
        if before >= self._inbox_limit + position:
            return False
        try:
            self._inbox_send.send_nowait(message)
        except anyio.WouldBlock:
            return False
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.close()
            return True
        if self._inbox_send.statistics().current_buffer_used > before:
            queued = self._queued
            if queued is None:
                queued = self._queued = []
            queued.append(cost)
            self._queued_bytes += cost
        return True

    def _expect_answer(self, request_id: int | str) -> None:
        """A request was delivered (server role): it is pending until its
        response is written (:meth:`_answered`) or the session closes."""
        pending = self._pending
        if pending is None:
            pending = self._pending = {}
        key = _request_key(request_id)
        pending[key] = pending.get(key, 0) + 1
        self._router._request_pending()

    def _answered(self, request_id: int | str, *, answered: bool = True) -> None:
        """The request ``request_id`` was answered (or, ``answered`` False,
        cancelled by the peer: never answered). Ids that are not pending
        are ignored."""
        pending = self._pending
        if not pending:
            return
        key = _request_key(request_id)
        count = pending.get(key)
        if count is None:
            return
        if count > 1:
            pending[key] = count - 1
        else:
            del pending[key]
        self._router._requests_settled(1, answered=answered)

    async def _write(self, item: SessionMessage) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        router = self._router
        now = router._clock()
        self.last_activity = now
        router._touch(self)
        message = item.message
        options = router.options
        payload: bytes | None = None
        if options.batch:
            # WIRE.md §Batches: requests ask every peer that has not
            # refused; responses answer peers that asked.
            peers = router._batch_peers
            if isinstance(message, JSONRPCRequest):
                marked = peers.mark_request(self.peer)
            else:
                marked = isinstance(message, JSONRPCResponse) and peers.mark_response(self.peer)
            if marked:
                payload = marked_payload(message, options.batch_bytes)
        if payload is None:
            payload = message.model_dump_json(by_alias=True, exclude_unset=True).encode()
        exp = math.floor(now + options.ttl)
        cap = send_deadline.get()
        if cap is not None:
            exp = max(1, min(exp, math.floor(cap)))
        batch_bytes = router.batch_limit(self.peer)
        chunk_size = options.chunk_size
        if batch_bytes is not None:
            # Larger parts for a peer that takes batches: one part, with its
            # header, fills a batch PM (WIRE.md §Batches).
            chunk_size = max(chunk_size, (batch_bytes - _PART_OVERHEAD) // 4 * 3)
        try:
            parts = wire.encode(payload, sid=self.sid, exp=exp, chunk_size=chunk_size)
        except wire.TooLargeError:
            if not isinstance(message, JSONRPCResponse | JSONRPCError) or message.id is None:
                raise
            # A response too large for 64 parts becomes a short error
            # response for the same request, so the caller learns why instead
            # of waiting for a reply that can never be sent.
            limit = wire.MAX_PARTS * chunk_size
            refusal = JSONRPCError(
                jsonrpc="2.0",
                id=message.id,
                error=ErrorData(
                    code=INTERNAL_ERROR,
                    message=f"result of {len(payload)} bytes exceeds the transport limit of {limit} bytes",
                ),
            )
            payload = refusal.model_dump_json(by_alias=True, exclude_unset=True).encode()
            parts = wire.encode(payload, sid=self.sid, exp=exp, chunk_size=chunk_size)
        receipt = send_receipt.get()
        if receipt is not None and (receipt.claimed or not isinstance(message, JSONRPCRequest)):
            receipt = None
        if receipt is not None:
            receipt._claim(len(parts))
        if self._pending and isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            # Answered from here on: its parts are the outbox's to hand over
            # (they count there, in Outbox.total_waiting, from this very step).
            self._answered(message.id)
        # A notification (progress, logging, list_changed, ...) is best
        # effort: one brclient cannot take is dropped and the session stays
        # open, so a paid run keeps going and its response still goes out.
        # Only a request's or a response's failure closes the session.
        essential = not isinstance(message, JSONRPCNotification)
        on_error = self._send_failed if essential else self._notification_failed
        sent = False
        try:
            # Only a request whose departure is timed waits for its PM; other
            # writes return once queued (WIRE.md §Batches, "Pacing").
            await router._outbox.send(self.peer, parts, wait=receipt is not None, on_error=on_error)
            sent = True
        except Exception as exc:  # the host's sender may raise anything
            if not essential:
                # Counted and logged by _notification_failed (the outbox
                # called it); the writer, often a tool reporting progress,
                # carries on as if it had been sent.
                return
            failure = self._send_failed(exc)
            raise anyio.BrokenResourceError(str(failure)) from failure
        finally:
            if receipt is not None and sent:
                receipt._left()
            elif receipt is not None:
                # Raised or cancelled: some parts may have left, not all.
                receipt._fail()
        router.stats.messages_sent += 1

    def _send_failed(self, exc: Exception) -> SendError:
        """A PM carrying this session's parts failed: the session closes
        (once) with :attr:`error` set. Returns the error."""
        if isinstance(self.error, SendError):
            return self.error
        failure = SendError(self.peer, exc)
        failure.__cause__ = exc
        self.error = failure
        log.warning("%s; closing session %s", failure, self.sid)
        self._router.stats.send_failures += 1
        self.close()
        return failure

    def _notification_failed(self, exc: Exception) -> None:
        """A PM carrying one of this session's notifications failed: the
        notification is dropped (``notifications_dropped``), the session
        stays open. Logged once per session at INFO, then at DEBUG."""
        self._router.stats.notifications_dropped += 1
        level = logging.DEBUG if self._notification_drop_logged else logging.INFO
        self._notification_drop_logged = True
        log.log(level, "notification to %s dropped (%s); session %s stays open", self.peer, exc, self.sid)

    def _make_message(self, message: Any) -> SessionMessage:
        return SessionMessage(message, metadata=self._meta)


def _request_key(request_id: int | str) -> int | str:
    """A request id's correlation key: a string holding an integer is that
    integer (``"7"`` and ``7`` are one id, as the MCP SDK correlates them)."""
    if isinstance(request_id, str):
        try:
            return int(request_id)
        except ValueError:
            return request_id
    return request_id
