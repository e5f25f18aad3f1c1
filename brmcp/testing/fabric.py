"""An in-memory Bison Relay PM fabric with seeded, relay-like faults.

Every endpoint is a uid with a ``deliver(from_uid, text)`` callback (sync or
async), usually a :meth:`brmcp.Router.handle_pm`. PMs on one (from, to) link
arrive in send order, as BR's ordered, acknowledged delivery does, unless a
reordering fault holds one back. Faults are drawn from a seeded
:class:`random.Random` so a failing run can be replayed.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._ops.clock import Clock
from ..transport.router import AcceptFunc, AllowFunc, Router, RouterOptions

__all__ = ["Fabric", "FabricStats", "Faults", "LinkDownError", "LinkStats", "PMTooLargeError", "uid"]

log = logging.getLogger("brmcp.testing.fabric")

#: The largest PM text the fabric carries (bytes of UTF-8): BR's max message
#: size (1,887,437 bytes), which the recipient applies to the decompressed
#: routed message, less its 256 bytes of framing (docs/clientrpc.md).
MAX_PM_BYTES = 1_887_437 - 256

DeliverFunc = Callable[[str, str], Awaitable[None] | None]


def uid(n: int) -> str:
    """A deterministic test uid: 64 copies of the hex digit ``n & 0xf``
    (``uid(1)`` is 64 ``1``s), as the Go reference's ``brmcptest.UID``."""
    return format(n & 0xF, "x") * 64


class PMTooLargeError(Exception):
    """The PM exceeds the relay's routed-message limit and was refused."""


class LinkDownError(ConnectionError):
    """Sends from this uid are failing (an injected fault)."""


@dataclass(slots=True)
class Faults:
    """Relay behaviour, all off by default.

    ``latency`` and ``jitter`` are seconds (each PM is delayed by ``latency +
    uniform(0, jitter)``; per-link order is kept); ``drop_rate``,
    ``duplicate_rate`` and ``reorder_rate`` are probabilities per PM. A
    reordered PM is held back an extra ``reorder_delay`` seconds so later PMs
    overtake it.
    """

    latency: float = 0.0
    jitter: float = 0.0
    drop_rate: float = 0.0
    duplicate_rate: float = 0.0
    reorder_rate: float = 0.0
    reorder_delay: float = 0.05

    @property
    def instant(self) -> bool:
        return (
            self.latency <= 0
            and self.jitter <= 0
            and self.drop_rate <= 0
            and self.duplicate_rate <= 0
            and self.reorder_rate <= 0
        )


@dataclass(slots=True)
class LinkStats:
    """PMs and UTF-8 bytes delivered on one direction of a link."""

    pms: int = 0
    bytes: int = 0


@dataclass(slots=True)
class FabricStats:
    pms_sent: int = 0  #: accepted from senders
    pms_delivered: int = 0
    bytes_delivered: int = 0
    pms_dropped: int = 0  #: lost to the drop fault
    pms_duplicated: int = 0  #: extra copies made by the duplicate fault
    pms_refused: int = 0  #: over the size limit, or an injected send failure
    pms_undeliverable: int = 0  #: no endpoint and not marked offline
    pms_stored: int = 0  #: sent while the recipient was offline, held until it is back
    links: dict[tuple[str, str], LinkStats] = field(default_factory=dict)


class _FabricSender:
    __slots__ = ("_fabric", "_from")

    def __init__(self, fabric: Fabric, from_uid: str) -> None:
        self._fabric = fabric
        self._from = from_uid

    async def send_pm(self, peer: str, text: str) -> None:
        await self._fabric._send(self._from, peer, text)


class Fabric:
    """In-memory PM network. Use as ``async with Fabric(...) as fabric:``.

    ``seed`` makes faults reproducible; ``max_pm_bytes`` is the routed
    message limit (BR's, :data:`MAX_PM_BYTES`); ``faults`` may be replaced at any time.
    """

    def __init__(
        self,
        *,
        seed: int | None = None,
        faults: Faults | None = None,
        max_pm_bytes: int = MAX_PM_BYTES,
    ) -> None:
        self.faults = faults or Faults()
        self.max_pm_bytes = max_pm_bytes
        self.stats = FabricStats()
        self._rng = random.Random(seed)
        self._endpoints: dict[str, DeliverFunc] = {}
        self._offline: dict[str, anyio.Event] = {}
        self._failing: dict[str, int | None] = {}
        self._links: dict[tuple[str, str], MemoryObjectSendStream[tuple[float, str]]] = {}
        self._backlog: dict[tuple[str, str], int] = {}  # PMs queued on a link, not yet delivered
        self._routers: list[Router] = []
        self._taps: list[Callable[[str, str, str], None]] = []
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    async def __aenter__(self) -> Fabric:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        self.close()
        tg = self._tg
        assert tg is not None
        tg.cancel_scope.cancel()
        return await tg.__aexit__(exc_type, exc_val, exc_tb)

    def close(self) -> None:
        """Stop delivering and close every router built by :meth:`router`."""
        if self._closed:
            return
        self._closed = True
        for router in self._routers:
            router.close()
        for link in self._links.values():
            link.close()

    # -- endpoints ---------------------------------------------------------------

    def attach(self, uid: str, deliver: DeliverFunc) -> None:
        """Register (or replace) the endpoint at ``uid``."""
        self._endpoints[uid] = deliver

    def detach(self, uid: str) -> None:
        self._endpoints.pop(uid, None)

    def sender(self, from_uid: str) -> _FabricSender:
        """A :class:`~brmcp.PMSender` whose PMs come from ``from_uid``."""
        return _FabricSender(self, from_uid)

    def router(
        self,
        uid: str,
        *,
        accept: AcceptFunc | None = None,
        allow: AllowFunc | None = None,
        clock: Clock | Callable[[], float] | None = None,
        **options: Any,
    ) -> Router:
        """Build a :class:`~brmcp.Router` at ``uid`` that sends through the
        fabric and is attached to it; ``options`` are :class:`~brmcp.RouterOptions`
        fields and ``clock`` is the router's (a :class:`~brmcp.Clock` or a
        function returning unix seconds; default the system clock). The
        caller enters it (``async with``); :meth:`close` closes it."""
        router = Router(
            self.sender(uid), accept=accept, allow=allow, options=RouterOptions(**options), clock=clock
        )
        self.attach(uid, router.handle_pm)
        self._routers.append(router)
        return router

    # -- faults --------------------------------------------------------------------

    def set_offline(self, uid: str) -> None:
        """Hold PMs for ``uid`` instead of delivering them (BR's store and
        forward). Each link's PMs stay queued, in send order, until
        :meth:`set_online`. Needs the fabric entered."""
        if uid not in self._offline:
            self._offline[uid] = anyio.Event()

    def set_online(self, uid: str) -> None:
        """Resume delivery to ``uid``: every held PM is delivered, per link in
        send order, ahead of anything sent later."""
        event = self._offline.pop(uid, None)
        if event is not None:
            event.set()

    def is_offline(self, uid: str) -> bool:
        return uid in self._offline

    def fail_sends(self, from_uid: str, count: int | None = None) -> None:
        """Make the next ``count`` sends from ``from_uid`` raise
        :class:`LinkDownError` (None: until :meth:`restore_sends`)."""
        self._failing[from_uid] = count

    def restore_sends(self, from_uid: str) -> None:
        self._failing.pop(from_uid, None)

    def add_tap(self, tap: Callable[[str, str, str], None]) -> None:
        """Call ``tap(from_uid, to_uid, text)`` for every PM just before it is
        delivered (observation only: exceptions are logged and ignored)."""
        self._taps.append(tap)

    def remove_tap(self, tap: Callable[[str, str, str], None]) -> None:
        if tap in self._taps:
            self._taps.remove(tap)

    def link(self, from_uid: str, to_uid: str) -> LinkStats:
        """Delivered PMs and bytes from ``from_uid`` to ``to_uid``."""
        return self.stats.links.get((from_uid, to_uid)) or LinkStats()

    # -- delivery --------------------------------------------------------------------

    async def _send(self, from_uid: str, to_uid: str, text: str) -> None:
        if from_uid in self._failing:
            left = self._failing[from_uid]
            if left is None or left > 0:
                if left is not None:
                    if left <= 1:
                        del self._failing[from_uid]
                    else:
                        self._failing[from_uid] = left - 1
                self.stats.pms_refused += 1
                raise LinkDownError(f"fabric: sends from {from_uid[:8]} are failing")
        size = len(text) if text.isascii() else len(text.encode())
        if size > self.max_pm_bytes:
            self.stats.pms_refused += 1
            raise PMTooLargeError(
                f"fabric: PM of {size} bytes exceeds the {self.max_pm_bytes}-byte routed message limit"
            )
        if self._closed:
            return
        self.stats.pms_sent += 1
        faults = self.faults
        if faults.instant and to_uid not in self._offline and not self._backlog.get((from_uid, to_uid)):
            # Nothing queued on this link: hand the PM over in the sender's task.
            await self._deliver(from_uid, to_uid, text)
            return
        copies = 1
        rng = self._rng
        if faults.drop_rate > 0 and rng.random() < faults.drop_rate:
            self.stats.pms_dropped += 1
            return
        if faults.duplicate_rate > 0 and rng.random() < faults.duplicate_rate:
            self.stats.pms_duplicated += 1
            copies = 2
        for _ in range(copies):
            self._route(from_uid, to_uid, text)

    def _route(self, from_uid: str, to_uid: str, text: str) -> None:
        faults = self.faults
        rng = self._rng
        delay = max(faults.latency, 0.0)
        if faults.jitter > 0:
            delay += rng.uniform(0, faults.jitter)
        tg = self._tg
        if tg is None:
            raise RuntimeError("Fabric with delays or offline peers must be entered ('async with fabric')")
        if faults.reorder_rate > 0 and rng.random() < faults.reorder_rate:
            if to_uid in self._offline:
                self.stats.pms_stored += 1
            tg.start_soon(self._deliver_later, from_uid, to_uid, text, delay + faults.reorder_delay)
            return
        if to_uid in self._offline:
            self.stats.pms_stored += 1
        key = (from_uid, to_uid)
        link = self._links.get(key)
        if link is None:
            send, recv = anyio.create_memory_object_stream[tuple[float, str]](math.inf)
            self._links[key] = link = send
            tg.start_soon(self._link_worker, from_uid, to_uid, recv)
        self._backlog[key] = self._backlog.get(key, 0) + 1
        link.send_nowait((time.monotonic() + delay, text))

    async def _link_worker(
        self, from_uid: str, to_uid: str, recv: MemoryObjectReceiveStream[tuple[float, str]]
    ) -> None:
        # One worker per (from, to) link delivers its PMs strictly in queue
        # order; a PM for an offline recipient blocks the link (and so keeps
        # its place ahead of later PMs) until the recipient is back.
        key = (from_uid, to_uid)
        async with recv:
            async for due, text in recv:
                wait = due - time.monotonic()
                if wait > 0:
                    await anyio.sleep(wait)
                await self._until_online(to_uid)
                self._backlog[key] -= 1
                await self._deliver(from_uid, to_uid, text)

    async def _deliver_later(self, from_uid: str, to_uid: str, text: str, delay: float) -> None:
        await anyio.sleep(delay)
        await self._until_online(to_uid)
        await self._deliver(from_uid, to_uid, text)

    async def _until_online(self, to_uid: str) -> None:
        event = self._offline.get(to_uid)
        while event is not None:
            await event.wait()
            event = self._offline.get(to_uid)

    async def _deliver(self, from_uid: str, to_uid: str, text: str) -> None:
        if self._closed:
            return
        deliver = self._endpoints.get(to_uid)
        if deliver is None:
            self.stats.pms_undeliverable += 1
            return
        stats = self.stats
        size = len(text) if text.isascii() else len(text.encode())
        stats.pms_delivered += 1
        stats.bytes_delivered += size
        link = stats.links.get((from_uid, to_uid))
        if link is None:
            link = stats.links[(from_uid, to_uid)] = LinkStats()
        link.pms += 1
        link.bytes += size
        for tap in self._taps:
            try:
                tap(from_uid, to_uid, text)
            except Exception:
                log.exception("fabric: tap failed")
        try:
            result = deliver(from_uid, text)
            if result is not None and inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("fabric: endpoint %s failed to take a PM from %s", to_uid[:8], from_uid[:8])
