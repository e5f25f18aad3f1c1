"""Per-caller token buckets (WIRE.md §Payments, server order step 2)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["RATE_LIMITED_TEXT", "RateLimiter"]

#: What a caller whose bucket is empty is told (WIRE.md §Payments).
RATE_LIMITED_TEXT = "rate limited; retry later"


class RateLimiter:
    """One bucket per caller uid: capacity ``per_minute`` tokens, a new
    bucket starts full (burst = capacity), refill is continuous at
    ``per_minute / 60`` tokens per second. A call takes one token.

    ``per_minute`` must be >= 1; it can be changed at run time (existing
    buckets keep their tokens, capped to the new capacity). ``clock`` returns
    seconds (monotonic by default).
    """

    __slots__ = ("_buckets", "_clock", "_rate")

    #: Buckets idle long enough to be full again are forgotten past this many.
    _PRUNE_AT = 10_000

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = 0
        self.per_minute = per_minute
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    @property
    def per_minute(self) -> int:
        return self._rate

    @per_minute.setter
    def per_minute(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"calls_per_minute must be >= 1, got {value!r}")
        self._rate = value

    def take(self, peer: str) -> bool:
        """Consume one token of ``peer``; False when none is available."""
        now = self._clock()
        tokens = self._available(peer, now)
        if tokens < 1.0:
            self._buckets[peer] = (tokens, now)
            return False
        self._buckets[peer] = (tokens - 1.0, now)
        if len(self._buckets) > self._PRUNE_AT:
            self._prune(now)
        return True

    def tokens(self, peer: str) -> float:
        """Tokens ``peer`` has now (for tests and diagnostics)."""
        return self._available(peer, self._clock())

    def _available(self, peer: str, now: float) -> float:
        """``peer``'s tokens at ``now``: its bucket refilled since its last
        call, capped to the capacity (a new bucket is full)."""
        capacity = float(self._rate)
        state = self._buckets.get(peer)
        if state is None:
            return capacity
        tokens, last = state
        return min(capacity, tokens + (now - last) * capacity / 60.0)

    def _prune(self, now: float) -> None:
        capacity = float(self._rate)
        full_after = 60.0  # any bucket refills completely within a minute
        for peer, (tokens, last) in list(self._buckets.items()):
            if tokens >= capacity or now - last >= full_after:
                del self._buckets[peer]
