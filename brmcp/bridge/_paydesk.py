"""The bridge's payments as its admin surface, approvals page and daemon see
them (BRIDGE.md §Spend log and approvals): the approvals queue, the spend
log, the balances bots reported, change notifications and metrics, all kept
by the bridge's :class:`~brmcp.bridge.pay.Settler`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from brmcp.bridge.pay import BotBalance, PendingPayment, Settler, SpendSummary
from brmcp.transport.router import Router

if TYPE_CHECKING:
    from brmcp.metrics import BridgeMetrics

__all__ = ["PayDesk"]


class PayDesk:
    """The payments of the bridge whose settler is ``_settler`` (and whose
    router ``_router`` the metrics watch)."""

    _settler: Settler
    _router: Router

    def pending_payments(self) -> list[PendingPayment]:
        """Payments waiting for approval, sorted by ``created`` then ``id``."""
        return self._settler.approvals.pending()

    def resolve_payment(self, payment_id: str, approve: bool) -> bool:
        """Approve or deny a parked payment; False for an unknown id. The
        first decision wins."""
        return self._settler.approvals.resolve(payment_id, approve)

    def spend_log(self) -> SpendSummary:
        """A copy of the spend log and its rolling 24-hour total (atoms,
        failed entries excluded)."""
        return self._settler.summary()

    def bot_balances(self) -> dict[str, BotBalance]:
        """The balance each bot last reported for this user (lowercase uid →
        :class:`BotBalance`), from the receipts on paid results and from
        ``payment_required`` refusals seen since the bridge started."""
        return self._settler.balances()

    def watch(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` from the event loop whenever a payment is
        parked or decided or the spend log changes (the approvals page and
        the daemon's notification hook use it); returns the function that
        removes the listener."""
        return self._settler.watch(listener)

    def use_metrics(self, metrics: BridgeMetrics) -> None:
        """Count calls, payments and errors in ``metrics`` from now on, and
        export the router's sessions and reassembly bytes and the number of
        waiting approvals through it."""
        self._settler.metrics = metrics
        metrics.watch_router(lambda: self._router)
        metrics.watch_pending(lambda: len(self._settler.approvals.pending()))

    @property
    def change_version(self) -> int:
        """A counter bumped on every change :meth:`watch` reports."""
        return self._settler.version

    async def resolve_spend(self, payee: str, atoms: int, err: str | BaseException | None) -> bool:
        """Record a late outcome for a pending payment (e.g. a tip confirmed
        after the wait budget, or after a restart): claims the oldest pending
        entry of exactly ``atoms`` atoms to ``payee`` (case-insensitive);
        ``err`` None marks it paid, otherwise failed with the error text.
        Returns False when nothing matches. Raises :class:`BridgeError` when
        the log cannot be written."""
        text = None if err is None else (str(err) or type(err).__name__)
        return await self._settler.resolve(payee, atoms, text)
