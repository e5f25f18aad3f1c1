"""Time, for every role: the wall clock, a controllable test clock, and
Go's duration text.

The bridge reads the time (spend-log timestamps, the rolling 24-hour
window, approval ``created``) and waits (the 3 s credit polls, the approval
timeout) only through a :class:`Clock`, so tests can move time forward
instead of sleeping (BRIDGE.md §Embedding the library in another daemon,
``clock``); the router, the bot links and the harness's pipeline take the
same protocol.
"""

from __future__ import annotations

import math
import time
from typing import Protocol, runtime_checkable

import anyio
import anyio.lowlevel

__all__ = ["Clock", "ManualClock", "SystemClock", "go_duration"]


@runtime_checkable
class Clock(Protocol):
    """``now()`` is unix time in seconds; ``sleep(seconds)`` returns once
    that much time has passed on this clock (Go's ``Clock.After``)."""

    def now(self) -> float:
        """Current unix time in seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock; cancellable."""
        ...


class SystemClock:
    """The real clock: :func:`time.time` and :func:`anyio.sleep`."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(max(seconds, 0.0))


class _Timer:
    __slots__ = ("deadline", "event")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.event = anyio.Event()


class ManualClock:
    """A clock that moves only when told to, for tests and simulations.

    ``start`` is the initial unix time in seconds. :meth:`advance` moves the
    time forward and wakes every sleeper whose deadline has been reached.
    With ``auto=True`` a :meth:`sleep` advances the clock by its own
    duration and returns at once (Go's test clock "auto" mode), so polling
    loops run instantly. :attr:`sleeps` records every requested duration.
    """

    __slots__ = ("_now", "_timers", "auto", "sleeps")

    def __init__(self, start: float = 1_800_000_000.0, *, auto: bool = False) -> None:
        self._now = float(start)
        self.auto = auto
        self.sleeps: list[float] = []
        self._timers: list[_Timer] = []

    def now(self) -> float:
        return self._now

    def set(self, now: float) -> None:
        """Jump to ``now`` (never backwards; raises ValueError)."""
        if now < self._now:
            raise ValueError(f"ManualClock cannot go back from {self._now} to {now}")
        self.advance(now - self._now)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (≥ 0; raises ValueError) and wake
        the sleepers that are due."""
        if seconds < 0 or math.isnan(seconds):
            raise ValueError(f"ManualClock.advance needs seconds >= 0, got {seconds!r}")
        self._now += seconds
        due = [t for t in self._timers if t.deadline <= self._now]
        if due:
            self._timers = [t for t in self._timers if t.deadline > self._now]
            for timer in due:
                timer.event.set()

    @property
    def sleepers(self) -> int:
        """Sleeps currently waiting for time to advance."""
        return len(self._timers)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.auto:
            self.advance(max(seconds, 0.0))
            await anyio.lowlevel.checkpoint()
            return
        timer = _Timer(self._now + max(seconds, 0.0))
        if timer.deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        self._timers.append(timer)
        try:
            await timer.event.wait()
        finally:
            if timer in self._timers:
                self._timers.remove(timer)


def go_duration(seconds: float) -> str:
    """Format a duration as Go's ``time.Duration.String`` does: ``2m0s`` for
    120 s, ``1m30s``, ``30s``, ``1h0m0s``, ``1.5s``, ``250ms``, ``0s``
    (BRIDGE.md §The payment flow: ``approval timed out after 2m0s``)."""
    ns = round(seconds * 1_000_000_000)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000_000_000:
        # Sub-second: the largest unit that keeps a non-zero integer part.
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if u >= size:
                return sign + _fraction(u, size) + unit
    secs_ns = u % 60_000_000_000
    minutes_total = u // 60_000_000_000
    text = _fraction(secs_ns, 1_000_000_000) + "s"
    if minutes_total > 0:
        hours, minutes = divmod(minutes_total, 60)
        text = f"{minutes}m" + text
        if hours > 0:
            text = f"{hours}h" + text
    return sign + text


def _fraction(value: int, unit: int) -> str:
    whole, rest = divmod(value, unit)
    if rest == 0:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}." + f"{rest:0{digits}d}".rstrip("0")
