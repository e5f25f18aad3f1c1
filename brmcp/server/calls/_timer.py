"""The harness's bounded waits: the pay-alongside hold (its deadline and
re-checks) and the first-contact linger time themselves on
``HarnessConfig.timer`` -- a :class:`brmcp.Clock` (a test's
:class:`brmcp.ManualClock`) -- or, when it is None (the default), on
anyio's monotonic clock, as they always did."""

from __future__ import annotations

import anyio

from brmcp._ops.clock import Clock

__all__ = ["timer_now", "wait_event"]


def timer_now(timer: Clock | None) -> float:
    """Seconds on ``timer`` (its ``now()``), else anyio's monotonic time."""
    return timer.now() if timer is not None else anyio.current_time()


async def wait_event(event: anyio.Event, seconds: float, timer: Clock | None) -> bool:
    """Wait for ``event`` for at most ``seconds`` on ``timer``; True when it
    was set in time, False when the time ran out first. Cancellable."""
    if timer is None:
        with anyio.move_on_after(seconds) as scope:
            await event.wait()
        return not scope.cancelled_caught
    woke = False
    async with anyio.create_task_group() as tg:

        async def ring() -> None:
            await timer.sleep(seconds)
            tg.cancel_scope.cancel()

        tg.start_soon(ring)
        await event.wait()
        woke = True
        tg.cancel_scope.cancel()
    return woke
