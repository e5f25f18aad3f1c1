"""The PMs to each peer, scheduled: paced and, where the peer accepts it,
batched (WIRE.md §Batches; BRIDGE.md §Deadlines and re-sends).

A Bison Relay client delivers the PMs of one direction of a conversation
about 100 ms apart, but its ``PM`` call returns at once: PMs handed to it
faster than that wait in its queue, where nobody can see them. A sender that
piles PMs into that queue times the wait as part of each round trip, and
copies it sends again join the same queue (congestion collapse). The
:class:`Outbox` therefore hands brclient at most one PM per ``interval``
per peer and keeps the rest here, in order, where their wait is visible.

While PMs wait, the parts queued for a peer that accepts batches travel
together: each PM carries as many queued parts as fit the peer's limit (a
lone part goes as an ordinary PM, byte for byte WIRE.md v1). Other peers
get one part per PM, in order.

Each peer's queue is emptied by one flusher task, spawned on the owner's
task group while parts wait (``spawn``). A write that needs to know when
its PM left (``wait=True``: a request whose re-send timer starts then)
returns once the PM carrying its last part was handed over; any other
write returns as soon as it is queued, unless the queue is full
(:data:`QUEUED_PARTS`, :data:`QUEUED_BYTES`), so a writer that sends one
message after the other (a server streaming notifications) still fills
batches. Without ``spawn``, or without pacing, every write waits and the
writers take turns sending the head of the queue (a combining queue);
without pacing, a lone part with nothing queued ahead of it is handed over
at once, as that queue would hand it over, without its bookkeeping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import anyio.lowlevel

from .. import wire

__all__ = ["DEFAULT_PM_INTERVAL", "QUEUED_BYTES", "QUEUED_PARTS", "Outbox"]

#: Seconds from the return of one PM handed to brclient for a peer to the
#: next hand-over. brclient's ``PM`` call returns when the relay acked the
#: PM, and the recipient fetches the next one about 100 ms after it got the
#: last: back-to-back PMs of one direction arrive one ``PM`` call plus
#: 100 ms apart (104 ms on loopback, 357 ms with 250 ms of one-way latency;
#: docs/clientrpc.md §Observed on a real network). Pacing from the return
#: follows that pace at any latency, so brclient's own queue stays empty.
DEFAULT_PM_INTERVAL = 0.1

#: A write that need not wait returns at once while at most this many parts
#: and :data:`QUEUED_BYTES` bytes wait for the peer (itself included);
#: past either it waits until they are below again, which bounds the memory
#: a fast writer can queue per peer.
QUEUED_PARTS = wire.MAX_BATCH_PARTS
QUEUED_BYTES = wire.MAX_BATCH_BYTES

#: Idle lanes kept before the ones past their slot are forgotten.
_LANES_KEPT = 1024

Spawn = Callable[..., bool]
"""``spawn(fn, *args)``: run ``fn(*args)`` in a task the owner owns; False
when it cannot (not started, or closed)."""


class _OutboxStats(Protocol):
    """The ``RouterStats`` counters the outbox updates."""

    pms_sent: int
    parts_sent: int
    batches_sent: int


class _Item:
    """One message's parts, waiting; ``next`` is the first part not sent."""

    __slots__ = ("done", "error", "next", "on_error", "parts", "withdrawn")

    def __init__(self, parts: list[str], on_error: Callable[[Exception], object] | None) -> None:
        self.parts = parts
        self.next = 0
        self.done = anyio.Event()
        self.error: Exception | None = None
        self.on_error = on_error
        self.withdrawn = False

    def fail(self, exc: Exception) -> None:
        self.error = exc
        self.done.set()
        if self.on_error is not None:
            self.on_error(exc)


class _Lane:
    """The queue and the pacing of one peer."""

    __slots__ = ("bytes", "flushing", "free_at", "lock", "queue", "sending", "writers")

    def __init__(self) -> None:
        self.queue: deque[_Item] = deque()
        self.lock = anyio.Lock()
        #: :func:`anyio.current_time` of the next slot.
        self.free_at = 0.0
        self.writers = 0
        self.flushing = False
        #: Bytes of the parts not yet handed over.
        self.bytes = 0
        #: 1 while a lone part goes out on the direct path (see Outbox.send).
        self.sending = 0

    def waiting(self) -> int:
        queued = sum(len(item.parts) - item.next for item in self.queue if not item.withdrawn)
        return queued + self.sending


class Outbox:
    """Paced, batched PM sending for one router.

    ``send`` hands one PM text to brclient (the router's
    :class:`~brmcp.PMSender`); ``interval`` is the seconds between two PMs
    to one peer (<= 0: no pacing); ``limit(peer)`` the largest batch PM the
    peer accepts (None: one part per PM), asked at every PM; ``spawn``
    starts the flusher tasks (None: writers send themselves); ``stats``
    gets ``pms_sent``, ``parts_sent`` and ``batches_sent``.
    """

    __slots__ = ("_lanes", "_limit", "_progress", "_send", "_spawn", "interval", "stats")

    def __init__(
        self,
        send: Callable[[str, str], Awaitable[None]],
        *,
        interval: float,
        stats: _OutboxStats,
        limit: Callable[[str], int | None] = lambda _peer: None,
        spawn: Spawn | None = None,
    ) -> None:
        self._send = send
        self._limit = limit
        self._spawn = spawn
        self.interval = interval
        self.stats = stats
        self._lanes: dict[str, _Lane] = {}
        #: Set whenever a PM was handed over or parts were given up.
        self._progress = anyio.Event()

    def waiting(self, peer: str) -> int:
        """Parts queued here for ``peer``, not yet handed to brclient."""
        lane = self._lanes.get(peer)
        return 0 if lane is None else lane.waiting()

    def total_waiting(self) -> int:
        """Parts queued here for every peer."""
        return sum(lane.waiting() for lane in self._lanes.values())

    async def drained(self) -> None:
        """Return once nothing waits here (for any peer)."""
        while self.total_waiting():
            await self._next_progress()

    async def _next_progress(self) -> None:
        """Wait for the next PM handed over (or parts given up)."""
        if self._progress.is_set():
            self._progress = anyio.Event()
        await self._progress.wait()

    async def send(
        self,
        peer: str,
        parts: list[str],
        *,
        wait: bool = True,
        on_error: Callable[[Exception], object] | None = None,
    ) -> None:
        """Send ``parts`` (one message's envelope strings, in seq order) to
        ``peer``, behind what is queued for it. With ``wait`` (or without
        ``spawn``, or when the queue is full) return when the PM carrying
        the last part was handed over, else once queued.

        A failed PM fails every message with a part in it: a waiting write
        raises the sender's exception, and ``on_error(exc)`` is called in
        every case (parts sent before stay sent). A write cancelled while
        it waits withdraws the parts not yet handed over."""
        if not parts:
            return
        lane = self._lanes.get(peer)
        if lane is None:
            if len(self._lanes) >= _LANES_KEPT:
                self._forget_idle()
            lane = self._lanes[peer] = _Lane()
        if len(parts) == 1 and self.interval <= 0 and not lane.queue and not lane.lock.locked():
            # Unpaced and nothing ahead of it: a lone part goes as one PM at
            # once, exactly as the queue below would send it, without the
            # queue's bookkeeping (an item, its event, a lock checkpoint).
            await self._send_direct(peer, lane, parts[0], on_error)
            return
        item = _Item(parts, on_error)
        lane.queue.append(item)
        lane.bytes += sum(len(p) for p in parts)
        if not lane.flushing and self._spawn is not None and self.interval > 0:
            lane.flushing = True
            if not self._spawn(self._flusher, peer, lane):
                lane.flushing = False
        if lane.flushing:
            if not wait:
                # Queued is enough; a full queue holds the writer until it
                # has room again (not until its own PM left).
                queued = False
                try:
                    await anyio.lowlevel.checkpoint()
                    while lane.flushing and (lane.waiting() > QUEUED_PARTS or lane.bytes > QUEUED_BYTES):
                        await self._next_progress()
                    queued = True
                finally:
                    if not queued and not item.done.is_set():
                        # Cancelled before the write returned: its parts
                        # must not leave behind the writer's back, nor keep
                        # the queue past its bound.
                        item.withdrawn = True
                if item.error is not None:
                    raise item.error
                return
            try:
                await item.done.wait()
            finally:
                if not item.done.is_set():
                    item.withdrawn = True
        else:
            lane.writers += 1
            try:
                while not item.done.is_set():
                    async with lane.lock:
                        if item.done.is_set():
                            break
                        delay = lane.free_at - anyio.current_time()
                        if delay > 0:
                            await anyio.sleep(delay)
                        await self._flush_one(peer, lane)
            finally:
                lane.writers -= 1
                if not item.done.is_set():
                    item.withdrawn = True
                if not lane.lock.locked():
                    # No PM is being handed over: forget the writes given up
                    # (this one, or others that gave up while it sent) now,
                    # not at a next write that may never come.
                    self._drop_withdrawn(lane)
        if item.error is not None:
            raise item.error

    async def _send_direct(
        self, peer: str, lane: _Lane, text: str, on_error: Callable[[Exception], object] | None
    ) -> None:
        """Hand ``text`` to brclient holding ``lane``'s lock, so writes that
        come meanwhile queue behind it; a failure calls ``on_error`` and is
        raised, as a failed queued PM is."""
        lane.lock.acquire_nowait()
        lane.writers += 1
        lane.sending = 1
        try:
            await self._send(peer, text)
        except Exception as exc:
            self._progress.set()
            if on_error is not None:
                on_error(exc)
            raise
        finally:
            lane.sending = 0
            lane.writers -= 1
            lane.lock.release()
        stats = self.stats
        stats.pms_sent += 1
        stats.parts_sent += 1
        self._progress.set()

    async def _flusher(self, peer: str, lane: _Lane) -> None:
        """Empty ``lane``, one PM per slot; ends when it is empty."""
        try:
            while True:
                self._drop_withdrawn(lane)
                if not lane.queue:
                    return
                delay = lane.free_at - anyio.current_time()
                if delay > 0:
                    await anyio.sleep(delay)
                async with lane.lock:
                    await self._flush_one(peer, lane)
        finally:
            lane.flushing = False
            if lane.queue:
                # Cancelled with parts left (the owner is closing): those
                # writes fail rather than wait for a flusher that never comes.
                failure = anyio.ClosedResourceError("brmcp: router closed before the PM was handed over")
                while lane.queue:
                    item = lane.queue.popleft()
                    item.fail(failure)
                lane.bytes = 0
                self._progress.set()

    def _drop_withdrawn(self, lane: _Lane) -> None:
        """Forget the items whose writers gave up before their parts left."""
        kept = deque(item for item in lane.queue if not (item.withdrawn and not item.done.is_set()))
        if len(kept) != len(lane.queue):
            for item in lane.queue:
                if item.withdrawn and not item.done.is_set():
                    lane.bytes -= sum(len(p) for p in item.parts[item.next :])
                    item.done.set()
            lane.queue = kept
            self._progress.set()

    async def _flush_one(self, peer: str, lane: _Lane) -> None:
        """Hand brclient one PM from the head of ``lane``."""
        self._drop_withdrawn(lane)
        batch_bytes = self._limit(peer)
        texts: list[str] = []
        taken: list[tuple[_Item, int]] = []
        size = len(wire.BATCH_TAG)
        for item in lane.queue:
            count = 0
            for part in item.parts[item.next :]:
                if texts and (
                    batch_bytes is None
                    or len(texts) >= wire.MAX_BATCH_PARTS
                    or size + 1 + len(part) > batch_bytes
                ):
                    break
                texts.append(part)
                size += 1 + len(part)
                count += 1
            if count:
                taken.append((item, count))
            if count < len(item.parts) - item.next:
                break
        if not texts:
            return
        text = texts[0] if len(texts) == 1 else wire.encode_batch(texts)
        try:
            await self._send(peer, text)
        except Exception as exc:
            # Every message with a part in this PM failed; the rest stay queued.
            lane.free_at = anyio.current_time() + self.interval
            for item, _ in taken:
                lane.bytes -= sum(len(p) for p in item.parts[item.next :])
                if item in lane.queue:
                    lane.queue.remove(item)
                item.fail(exc)
            self._progress.set()
            return
        # (Cancelled while handing over: nobody knows whether it left, so
        # the parts stay queued and go again with the next PM; a duplicate
        # part is ignored by reassembly, a duplicate request replays.)
        # The next slot counts from the return (see DEFAULT_PM_INTERVAL).
        lane.free_at = anyio.current_time() + self.interval
        stats = self.stats
        stats.pms_sent += 1
        stats.parts_sent += len(texts)
        if len(texts) > 1:
            stats.batches_sent += 1
        lane.bytes -= size - len(wire.BATCH_TAG) - len(texts)
        self._progress.set()
        for item, count in taken:
            item.next += count
            if item.next == len(item.parts):
                item.done.set()
                if item in lane.queue:
                    lane.queue.remove(item)

    def _forget_idle(self) -> None:
        now = anyio.current_time()
        for peer, lane in list(self._lanes.items()):
            if lane.writers == 0 and not lane.flushing and not lane.queue and lane.free_at <= now:
                del self._lanes[peer]
