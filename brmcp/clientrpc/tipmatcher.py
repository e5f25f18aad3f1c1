"""Match outbound tips with their terminal progress events (BRIDGE.md
§Embedding the library in another daemon, ``TipMatcher``).

brclient reports tip progress without the id of the attempt that caused it,
so a host that pays with tips registers what it is waiting for (payee uid and
amount in milliatoms) and feeds every terminal event ("completed", or "will
not retry") to :meth:`TipMatcher.resolve`. Waiters for the same payee and
amount are served oldest first; two identical concurrent payments may swap
outcomes, which is harmless since they are interchangeable.

A wait that ended because the attempt will be retried later
(:meth:`TipMatcher.stall`) leaves its tip in brclient's hands: its spend
stays pending. brclient pays one payee one tip at a time, and a tip that
cannot finish holds every later one to that payee (docs/clientrpc.md,
"Observed on a real network"), so the next events for that payee and amount
belong to the stalled tip: until its terminal event, the matcher routes
them past newer waiters (``resolve`` and ``stall`` return False, and the
host settles the spend log with the late outcome).
"""

from __future__ import annotations

from collections import deque

import anyio

__all__ = ["MAX_STALLED", "TipMatcher", "TipWaiter"]

#: Most (payee, amount) pairs with stalled tips remembered; past it a stall is
#: not remembered and the next event for that pair may serve a newer waiter
#: (an interchangeable payment, so the books still balance).
MAX_STALLED = 1024


class TipWaiter:
    """One expected tip. :meth:`wait` returns the terminal outcome exactly
    once it is known: None for success, or the attempt's error text."""

    __slots__ = ("_done", "_error", "_key", "_matcher", "_stalled", "matoms", "payee")

    def __init__(self, matcher: TipMatcher, payee: str, matoms: int) -> None:
        self._matcher = matcher
        self.payee = payee
        self.matoms = matoms
        self._key = (payee.lower(), matoms)
        self._done = anyio.Event()
        self._error: str | None = None
        self._stalled = False

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def error(self) -> str | None:
        """The error text once :attr:`done` (None: the tip completed)."""
        return self._error

    @property
    def stalled(self) -> bool:
        """True when the wait ended on an attempt that failed and that
        brclient will retry later (:meth:`TipMatcher.stall`): the tip did
        not complete now, but may still land."""
        return self._stalled

    async def wait(self) -> str | None:
        """Wait for the outcome; None when the tip completed, else the
        error text from the terminal event."""
        await self._done.wait()
        return self._error

    def cancel(self) -> None:
        """Stop waiting: this waiter is never matched afterwards. Idempotent."""
        self._matcher._remove(self)

    def _complete(self, error: str | None, *, stalled: bool = False) -> None:
        self._error = error
        self._stalled = stalled
        self._done.set()


class TipMatcher:
    """FIFO waiters per (payee uid, milliatoms); uids compare
    case-insensitively. Amounts are milliatoms, as brclient reports them
    (:func:`brmcp.protocol.units.milliatoms_from_atoms` of a payment's
    atoms; docs/clientrpc.md §Units)."""

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], deque[TipWaiter]] = {}
        #: Tips whose wait ended stalled and whose terminal event has not come.
        self._stalled: dict[tuple[str, int], int] = {}

    def expect(self, payee: str, matoms: int) -> TipWaiter:
        """Register a waiter for a tip of ``matoms`` milliatoms to ``payee``.
        Call before sending the tip so a fast outcome is not missed."""
        waiter = TipWaiter(self, payee, matoms)
        self._waiters.setdefault(waiter._key, deque()).append(waiter)
        return waiter

    def resolve(self, payee: str, matoms: int, error: str | None = None) -> bool:
        """Complete the oldest waiter for ``(payee, matoms)`` with ``error``
        (None: success). Returns False when nothing waits for it, e.g. a tip
        sent from chat or a different amount, and when the event is the
        terminal one of a stalled tip (see the module docs): the host then
        records it as a late outcome. Feed terminal events only."""
        key = (payee.lower(), matoms)
        if self._unstall(key):
            return False
        queue = self._waiters.get(key)
        if not queue:
            return False
        waiter = queue.popleft()
        if not queue:
            del self._waiters[key]
        waiter._complete(error)
        return True

    def stall(self, payee: str, matoms: int, error: str) -> bool:
        """An attempt of the oldest waiting tip for ``(payee, matoms)``
        failed and brclient will retry it later (a non-terminal event with
        ``willRetry``): end that wait at once with ``error``, marked
        :attr:`TipWaiter.stalled`. Its terminal event, when it comes, then
        matches no waiter (:meth:`resolve` returns False) and settles the
        spend as a late outcome. Returns False when nothing waits for it, and
        for a further retried attempt of a tip already stalled (newer
        waiters keep waiting)."""
        key = (payee.lower(), matoms)
        if self._stalled.get(key):
            return False
        queue = self._waiters.get(key)
        if not queue:
            return False
        waiter = queue.popleft()
        if not queue:
            del self._waiters[key]
        if len(self._stalled) < MAX_STALLED or key in self._stalled:
            self._stalled[key] = self._stalled.get(key, 0) + 1
        waiter._complete(error or "tip attempt failed", stalled=True)
        return True

    def stalled(self) -> int:
        """Stalled tips whose terminal event has not come yet."""
        return sum(self._stalled.values())

    def _unstall(self, key: tuple[str, int]) -> bool:
        count = self._stalled.get(key, 0)
        if not count:
            return False
        if count == 1:
            del self._stalled[key]
        else:
            self._stalled[key] = count - 1
        return True

    def waiting(self) -> int:
        """Registered waiters not yet resolved or cancelled."""
        return sum(len(q) for q in self._waiters.values())

    def _remove(self, waiter: TipWaiter) -> None:
        queue = self._waiters.get(waiter._key)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            return
        if not queue:
            del self._waiters[waiter._key]
