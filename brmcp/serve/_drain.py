"""How a stop of :class:`~brmcp.serve.ServeApp` drains: the two graces (for
the answers of the requests in flight, then for handing them to brclient),
the bounded wait each runs under, and the :class:`DrainReport` it returns.
Kept apart from the app, which only decides when to stop."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from .._ops.clock import Clock

__all__ = ["FLUSH_GRACE", "STOP_GRACE", "DrainReport", "log_stopped", "within"]

log = logging.getLogger("brmcp.serve")

#: Seconds a stop (SIGINT/SIGTERM, :meth:`ServeApp.stop`) waits for the
#: requests in flight to be answered before cancelling them (a paid call cut
#: off there is refunded, and a re-send of its callKey replays the refund).
STOP_GRACE = 10.0
#: Seconds a stop then waits for the answers already written to be handed to
#: brclient (the outbox paces PMs about 0.1 s apart per caller).
FLUSH_GRACE = 5.0


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What one stop drained (:meth:`ServeApp.stop`).

    * ``answered``: requests in flight whose answers were written during the drain;
    * ``cut``: requests still unanswered when the grace ran out (cancelled
      with the rest; a paid call among them is refunded);
    * ``pms_flushed``: PMs handed to brclient during the drain;
    * ``parts_left``: envelope parts still queued when the flush bound ran
      out (0 unless it did);
    * ``pms_held``: PMs left unread in brclient, replayed to the next start;
    * ``seconds``: how long the drain took (anyio's clock).
    """

    answered: int
    cut: int
    pms_flushed: int
    parts_left: int
    pms_held: int
    seconds: float


async def within(wait: Callable[[], Awaitable[None]], seconds: float, timer: Clock | None) -> bool:
    """Run ``wait()`` for at most ``seconds`` on ``timer`` (None: anyio's
    clock); True when it returned in time, False when it was cut off."""
    done = False
    async with anyio.create_task_group() as tg:

        async def waiter() -> None:
            nonlocal done
            await wait()
            done = True
            tg.cancel_scope.cancel()

        tg.start_soon(waiter)
        await (anyio.sleep(seconds) if timer is None else timer.sleep(seconds))
        tg.cancel_scope.cancel()
    return done


def log_stopped(since: float | None) -> None:
    """The last line of a stop a signal asked for, with how long it took."""
    if since is not None:
        log.info("stopped (%.1f s after the signal)", anyio.current_time() - since)
