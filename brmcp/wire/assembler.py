"""Bounded reassembly of multi-part messages (WIRE.md §Reassembly).

Sans-I/O: the caller passes the current time. The assembler is not
thread-safe; the router drives it from one event loop.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from .envelope import Part
from .errors import BufferFullError, ExpiredError, PartCountError, TooLargeError

__all__ = ["Assembler", "AssemblerConfig"]

_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class AssemblerConfig:
    """Reassembly bounds (WIRE.md §Reassembly bounds).

    ``max_pending_per_peer``: messages one peer may have in reassembly at
    once. ``max_message_bytes``: decoded bytes of one message.
    ``max_total_bytes``: decoded bytes buffered across all peers.
    ``timeout``: seconds after which a partial message is evicted.
    As in the Go reference, a zero or negative value selects the default.
    """

    max_pending_per_peer: int = 8
    max_message_bytes: int = 16 * _MIB
    max_total_bytes: int = 64 * _MIB
    timeout: float = 600.0

    def resolved(self) -> AssemblerConfig:
        """Return a copy with every non-positive field replaced by its default."""
        d = AssemblerConfig()
        return AssemblerConfig(
            self.max_pending_per_peer if self.max_pending_per_peer > 0 else d.max_pending_per_peer,
            self.max_message_bytes if self.max_message_bytes > 0 else d.max_message_bytes,
            self.max_total_bytes if self.max_total_bytes > 0 else d.max_total_bytes,
            self.timeout if self.timeout > 0 else d.timeout,
        )


@dataclass(slots=True, eq=False)
class _Pending:
    peer: str
    total: int
    exp: int
    first_seen: float
    nbytes: int = 0
    chunks: dict[int, bytes] = field(default_factory=dict)


class Assembler:
    """Reassemble parts into messages with hard memory bounds.

    State is keyed by ``peer/sid/mid``. Use :meth:`add` for every accepted
    part; read :meth:`pending`, :attr:`buffered_bytes` and
    :attr:`pending_messages` to observe the bounds.
    """

    __slots__ = ("_bytes", "_cfg", "_counter", "_deadlines", "_pending", "_per_peer")

    def __init__(self, config: AssemblerConfig | None = None) -> None:
        self._cfg = (config or AssemblerConfig()).resolved()
        self._pending: dict[str, _Pending] = {}
        self._per_peer: dict[str, int] = {}
        self._bytes = 0
        # Lazy GC index: (when, strict, tiebreak, key, state). An entry fires
        # when now >= when (strict=False) or now > when (strict=True); stale
        # entries of finished messages are skipped by identity.
        # The int exp + 1 is kept as an int so huge deadlines compare exactly.
        self._deadlines: list[tuple[float | int, bool, int, str, _Pending]] = []
        self._counter = itertools.count()

    @property
    def config(self) -> AssemblerConfig:
        """The effective (defaulted) configuration."""
        return self._cfg

    def pending(self, peer: str) -> int:
        """Number of messages ``peer`` has in reassembly."""
        return self._per_peer.get(peer, 0)

    @property
    def pending_messages(self) -> int:
        """Number of partial messages across all peers."""
        return len(self._pending)

    @property
    def buffered_bytes(self) -> int:
        """Decoded chunk bytes held across all peers."""
        return self._bytes

    def add(self, peer: str, part: Part, now: float) -> bytes | None:
        """Ingest one part from ``peer`` at unix time ``now`` (seconds).

        Returns the whole payload when this part completes its message, and
        None while it is partial or when the part is a duplicate seq (the
        first copy wins). Single-part (1/1) messages bypass all state and are
        never de-duplicated.

        Raises :class:`ExpiredError` (the part's deadline passed; no state
        touched), :class:`BufferFullError` (the peer already has
        ``max_pending_per_peer`` messages; no state created),
        :class:`PartCountError` (``total`` disagrees; the message is
        dropped) and :class:`TooLargeError` (a byte bound would be exceeded;
        the message is dropped). WIRE.md §Reassembly lists the order.
        """
        if part.exp > 0 and now >= part.exp + 1:
            # floor(now) > exp, compared exactly (WIRE.md §Deadlines).
            raise ExpiredError()
        cfg = self._cfg
        if part.total == 1:
            if len(part.chunk) > cfg.max_message_bytes:
                raise TooLargeError()
            return part.chunk

        self._gc(now)
        key = f"{peer}/{part.sid}/{part.mid}"
        msg = self._pending.get(key)
        if msg is None:
            if self._per_peer.get(peer, 0) >= cfg.max_pending_per_peer:
                raise BufferFullError()
            msg = _Pending(peer, part.total, part.exp, now)
            self._pending[key] = msg
            self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
            self._schedule(key, msg)
        if part.total != msg.total:
            self._drop(key, msg)
            raise PartCountError(key)
        if part.seq in msg.chunks:
            return None
        size = len(part.chunk)
        if msg.nbytes + size > cfg.max_message_bytes or self._bytes + size > cfg.max_total_bytes:
            self._drop(key, msg)
            raise TooLargeError()
        msg.chunks[part.seq] = part.chunk
        msg.nbytes += size
        self._bytes += size
        if len(msg.chunks) < msg.total:
            return None
        chunks = msg.chunks
        payload = b"".join([chunks[i] for i in range(1, msg.total + 1)])
        self._drop(key, msg)
        return payload

    def clear_peer(self, peer: str) -> None:
        """Drop every partial message of ``peer`` (e.g. when it is de-listed)."""
        for key, msg in list(self._pending.items()):
            if msg.peer == peer:
                self._drop(key, msg)

    def _schedule(self, key: str, msg: _Pending) -> None:
        heap = self._deadlines
        # Timeout: evicted when now - first_seen > timeout.
        heapq.heappush(heap, (msg.first_seen + self._cfg.timeout, True, next(self._counter), key, msg))
        if msg.exp > 0:
            # Deadline of the first part seen: evicted when floor(now) > exp,
            # i.e. now >= exp + 1.
            heapq.heappush(heap, (msg.exp + 1, False, next(self._counter), key, msg))
        if len(heap) > 4 * len(self._pending) + 64:
            self._deadlines = [e for e in heap if self._pending.get(e[3]) is e[4]]
            heapq.heapify(self._deadlines)

    def _gc(self, now: float) -> None:
        heap = self._deadlines
        while heap:
            when, strict, _, key, msg = heap[0]
            if now < when or (strict and now == when):
                return
            heapq.heappop(heap)
            if self._pending.get(key) is msg:
                self._drop(key, msg)

    def _drop(self, key: str, msg: _Pending) -> None:
        if self._pending.pop(key, None) is not msg:
            return
        # The deadline heap may still reference ``msg`` until it is popped or
        # compacted: release the chunks now, so that the bytes held are the
        # bytes counted (a finished message keeps only its small header).
        msg.chunks = {}
        self._bytes -= msg.nbytes
        count = self._per_peer.get(msg.peer, 0)
        if count <= 1:
            self._per_peer.pop(msg.peer, None)
        else:
            self._per_peer[msg.peer] = count - 1
