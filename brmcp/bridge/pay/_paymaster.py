"""Making one payment the settler decided (BRIDGE.md §The payment flow, step 5):
the payer runs with a ``tip_wait_secs`` deadline, and its outcome is written
to the spend log. Success → ``paid``; an error → ``failed`` (no longer
counted); an error that says the payment may still land (brclient retries the
tip later), the deadline, or cancellation → stays ``pending`` and counted,
because the tip may still land; a late tip outcome settles it
(:meth:`~._ledger.SpendBook.resolve`). The moment the wallet takes the payment
(:func:`~brmcp._ops.payhook.payment_scheduled`) is recorded on disk too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio

from brmcp._ops.clock import Clock, go_duration
from brmcp._ops.payhook import SCHEDULED_CALLBACK
from brmcp.bridge.base import BridgeError

from ._ledger import SpendBook
from ._spend import STATUS_FAILED, STATUS_PAID, STATUS_PENDING, SpendLog, SpendTicket

if TYPE_CHECKING:
    from brmcp.metrics import BridgeMetrics

__all__ = ["AGENT_GONE_PAID", "Payer", "Paymaster", "error_text"]

log = logging.getLogger("brmcp.bridge")


#: The spend entry's note for a payment completed after its agent went away.
AGENT_GONE_PAID = (
    "the agent went away while this payment was in flight; the credit stays at the bot for later calls"
)


@runtime_checkable
class Payer(Protocol):
    """Moves money to a bot. ``pay`` returns only once settlement of
    ``atoms`` atoms to ``payee_uid`` is confirmed and raises otherwise; the
    exception's text is shown to the agent verbatim, so make it a
    human-readable reason. An exception with a true ``may_land`` attribute
    means the payment did not complete now but may still land (the spend
    stays ``pending``, counted against the day cap, with that reason in
    ``err``, until a late outcome settles it through
    :meth:`~._ledger.SpendBook.resolve`); any other marks it ``failed``. It may be
    cancelled (the tip wait expired); the payment's outcome is then
    unknown and the spend stays ``pending`` too."""

    async def pay(self, payee_uid: str, atoms: int) -> None:
        """Pay ``atoms`` atoms to ``payee_uid``; raise with a reason on failure."""
        ...


def error_text(exc: BaseException) -> str:
    """What an exception says to the agent: its text, else its type's name."""
    return str(exc) or type(exc).__name__


class Paymaster(SpendBook):
    """A :class:`~._ledger.SpendBook` that pays through ``payer`` and records
    each payment's outcome."""

    def __init__(self, *, spend: SpendLog, payer: Payer, clock: Clock) -> None:
        super().__init__(spend=spend, clock=clock)
        self._payer = payer
        #: Prometheus metrics to update (:class:`brmcp.metrics.BridgeMetrics`), or None.
        self.metrics: BridgeMetrics | None = None

    async def _pay_recording(self, ticket: SpendTicket, bot: str, amount: int) -> None:
        """``payer.pay``, recording in the spend log (on disk) the moment the
        payer says the wallet took the payment (:func:`payment_scheduled`)."""
        taken = anyio.Event()
        failure: Exception | None = None
        token = SCHEDULED_CALLBACK.set(taken.set)
        try:
            async with anyio.create_task_group() as tg:

                async def record() -> None:
                    await taken.wait()
                    async with self._lock:
                        self._spend.mark_scheduled(ticket)
                        try:
                            await self._persist()
                        except BridgeError as exc:
                            log.error("spend log not written after the wallet took a payment: %s", exc)

                tg.start_soon(record)
                try:
                    await self._payer.pay(bot, amount)
                except Exception as exc:
                    # Raised below, as itself (not wrapped in a group).
                    failure = exc
                finally:
                    if not taken.is_set():
                        tg.cancel_scope.cancel()
        finally:
            SCHEDULED_CALLBACK.reset(token)
        if failure is not None:
            raise failure

    async def _pay(
        self,
        ticket: SpendTicket,
        bot: str,
        amount: int,
        wait_secs: int,
        spend_id: str,
        gone: anyio.Event | None = None,
    ) -> str | None:
        status, err, reason = STATUS_PENDING, "", None
        try:
            with anyio.move_on_after(wait_secs) as scope:
                try:
                    await self._pay_recording(ticket, bot, amount)
                except Exception as exc:
                    reason = error_text(exc)
                    if getattr(exc, "may_land", False):
                        # It did not complete now but brclient's retry may
                        # still land it: pending and counted, with the reason;
                        # its late outcome settles it (SpendLog.resolve).
                        status, err = STATUS_PENDING, reason
                    elif not scope.cancel_called:
                        status, err = STATUS_FAILED, reason
                else:
                    status = STATUS_PAID
            if scope.cancelled_caught:
                reason = f"tip not confirmed within {go_duration(wait_secs)}; the attempt keeps running"
                err = f"{reason}, so it may still land"
        finally:
            if self.metrics is not None:
                outcome = {STATUS_PAID: "paid", STATUS_FAILED: "failed"}.get(status, "unknown")
                self.metrics.payments.labels(outcome).inc()
                if status == STATUS_PAID:
                    self.metrics.paid_atoms.inc(amount)
            if status == STATUS_PAID and gone is not None and gone.is_set():
                err = AGENT_GONE_PAID
            if status == STATUS_PAID:
                log.info("spend %s: paid %d atoms to bot %s", spend_id, amount, bot)
            elif status == STATUS_FAILED:
                log.info("spend %s: payment of %d atoms to bot %s failed: %s", spend_id, amount, bot, err)
            else:
                log.info(
                    "spend %s: outcome of %d atoms to bot %s unknown (%s); it stays pending and counted",
                    spend_id,
                    amount,
                    bot,
                    reason or "cancelled",
                )
            with anyio.CancelScope(shield=True):
                async with self._lock:
                    self._spend.finish(ticket, status, err)
                    finished, self._finished = self._finished, anyio.Event()
                    finished.set()
                    try:
                        await self._persist()
                    except BridgeError as exc:
                        log.error("spend log not written after paying %s: %s", bot, exc)
        return None if status == STATUS_PAID else reason
