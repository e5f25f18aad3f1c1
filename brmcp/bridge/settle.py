"""Deciding and making one payment: caps, approval, spend recording
(BRIDGE.md §The payment flow, §Security model "The caps apply in both modes").

Order of a settlement:

1. amount = the bot's shortfall when > 0, else its price; ≤ 0 is refused;
2. the per-call cap and the rolling 24-hour cap are checked (≤ 0 means
   never pay; an exact fill is allowed; both modes);
3. approval mode parks the payment until the user decides or the timeout;
4. under the spend lock the settings in force *now* are read again (caps,
   mode, allowed bots, enabled), and the entry is recorded ``pending`` and
   written to disk *before* any money moves, so concurrent calls can never
   reserve past the daily cap and a policy change made while a call waited
   binds it;
5. the payer runs with a ``tip_wait_secs`` deadline: success → ``paid``; an
   error → ``failed`` (no longer counted); deadline or cancellation → stays
   ``pending`` and counted, because the tip may still land.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio
import anyio.to_thread

from ..payment import PaymentRequired

if TYPE_CHECKING:
    from ..metrics import BridgeMetrics
from .approvals import ApprovalQueue, PendingPayment
from .clock import Clock, go_duration
from .errors import BridgeError
from .settings import Settings
from .spend import (
    STATUS_FAILED,
    STATUS_PAID,
    STATUS_PENDING,
    BotBalance,
    SpendLog,
    SpendSummary,
    SpendTicket,
)

__all__ = ["AGENT_GONE", "AGENT_GONE_PAID", "Payer", "Settler", "cap_refusal"]

log = logging.getLogger("brmcp.bridge")

#: Why no payment was made for a call whose agent went away.
AGENT_GONE = "the agent went away before paying; nothing was paid"
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
    stays ``pending`` with that reason in ``err``); any other marks it
    ``failed``. It may be cancelled (the tip wait expired or the
    call was abandoned); the payment's outcome is then unknown."""

    async def pay(self, payee_uid: str, atoms: int) -> None:
        """Pay ``atoms`` atoms to ``payee_uid``; raise with a reason on failure."""
        ...


def cap_refusal(settings: Settings, amount: int, spent: int) -> str | None:
    """The refusal text when paying ``amount`` atoms with ``spent`` atoms
    already counted in the rolling day breaks a cap, else None
    (BRIDGE.md §Settings for the caps: ≤ 0 means never pay, an exact fill
    is allowed; BRIDGE.md §The payment flow for the texts)."""
    cap = settings.per_call_cap_atoms
    if cap <= 0 or amount > cap:
        return f"{amount} atoms exceeds the per-call cap ({cap})"
    day = settings.per_day_cap_atoms
    if day <= 0 or spent + amount > day:
        return f"{amount} atoms would exceed the daily cap ({spent} spent of {day})"
    return None


def _policy_refusal(settings: Settings, bot: str, amount: int, spent: int) -> str | None:
    """:func:`cap_refusal`, and a refusal when the bridge was disabled or the
    bot de-listed after the call was admitted (the kill switches must stop
    payments already in flight)."""
    if not settings.enabled:
        return "the bridge is disabled"
    if not settings.allows(bot):
        return "bot is not allowed"
    return cap_refusal(settings, amount, spent)


def _error_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class Settler:
    """Owns the spend log, the approval queue and the payer."""

    def __init__(
        self,
        *,
        spend: SpendLog,
        payer: Payer,
        clock: Clock,
        settings: Callable[[], Settings],
        approval_hint: Callable[[str], str] | None = None,
    ) -> None:
        self._spend = spend
        self._approval_hint = approval_hint
        self._payer = payer
        self._clock = clock
        self._settings = settings
        self._lock = anyio.Lock()
        self.approvals = ApprovalQueue(clock, on_change=self._changed)
        self._listeners: list[Callable[[], None]] = []
        self._balances: dict[str, BotBalance] = {}
        #: Prometheus metrics to update (:class:`brmcp.metrics.BridgeMetrics`), or None.
        self.metrics: BridgeMetrics | None = None
        #: Bumped whenever the approvals or the spend log change.
        self.version = 0

    def watch(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` (from the event loop) whenever a payment is
        parked or decided or the spend log changes; returns the function that
        removes it."""
        self._listeners.append(listener)

        def unwatch() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unwatch

    def _changed(self) -> None:
        self.version += 1
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                log.exception("bridge change listener failed")

    def note_balance(self, bot: str, atoms: int) -> None:
        """Remember the balance ``bot`` reported for this user (atoms, from a
        receipt or a ``payment_required`` refusal)."""
        self._balances[bot.lower()] = BotBalance(atoms=atoms, ts=self._now())

    def balances(self) -> dict[str, BotBalance]:
        """The latest balance each bot reported, by lowercase uid."""
        return dict(self._balances)

    def _now(self) -> int:
        return math.floor(self._clock.now())

    async def _persist(self) -> None:
        """Write the log (pruned) in a worker thread; call with the lock
        held so writes land in mutation order. Raises BridgeError."""
        content = self._spend.prepare(self._now())
        try:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._spend.write, content)
        finally:
            self._changed()

    def summary(self) -> SpendSummary:
        """Entries and the rolling 24-hour total (failed excluded)."""
        return self._spend.summary(self._now())

    async def resolve(self, payee: str, atoms: int, err: str | None) -> bool:
        """Late outcome for a pending payment (see :meth:`SpendLog.resolve`);
        persisted. Raises BridgeError when the write fails (the change stays
        in memory and is written with the next change)."""
        async with self._lock:
            if not self._spend.resolve(payee, atoms, err):
                return False
            await self._persist()
            return True

    def precheck(self, bot: str, amount: int, *, unasked: bool = True) -> str | None:
        """The reason a payment of ``amount`` atoms to ``bot`` would be
        refused by the policy in force right now (disabled, de-listed, caps;
        with ``unasked``, approval mode, where nothing is paid without a
        decision on the spot), else None. Reserves nothing: :meth:`settle`
        decides again."""
        settings = self._settings()
        if unasked and not settings.autopay:
            return "approval mode"
        return _policy_refusal(settings, bot, amount, self._spend.day_total(self._now()))

    async def settle(
        self,
        bot: str,
        tool: str,
        refusal: PaymentRequired,
        *,
        gone: anyio.Event | None = None,
        prepay: bool = False,
    ) -> str | None:
        """Pay what ``bot`` asked for ``tool``. Returns None once the payment
        is confirmed, else the reason nothing (certain) was paid, as shown
        to the agent after ``<name>: payment not made: ``. ``prepay``: a
        payment ahead of need (BRIDGE.md §Pay alongside and prepay), marked so in the spend
        log and in the approval queue (``<tool> (prepayment)``); the caps
        and the approval mode apply as to any payment.

        The policy is decided on the settings in force when the spend is
        reserved, not on those read when the call arrived: a cap lowered, a
        switch to approval, a de-listed bot or a disabled bridge while this
        call waited (for the spend lock or for the user) is honoured.

        ``gone`` is set when the agent's request went away: a payment parked
        for approval is then withdrawn, and none is started. A payment
        already in flight completes (its credit stays at the bot) and its
        spend entry says so."""
        amount = refusal.shortfall_atoms if refusal.shortfall_atoms > 0 else refusal.price_atoms
        reason, attempted = await self._settle(bot, tool, amount, gone, prepay)
        if reason is not None:
            log.info("payment to bot %s for tool %s (%d atoms) not made: %s", bot, tool, amount, reason)
            if not attempted and self.metrics is not None:
                self.metrics.payments.labels("refused").inc()
        return reason

    def _parked(self, payment: PendingPayment) -> None:
        hint = self._approval_hint(payment.id) if self._approval_hint is not None else ""
        log.info(
            "payment %s waits for approval: %d atoms to bot %s for tool %s%s",
            payment.id,
            payment.atoms,
            payment.bot,
            payment.tool,
            f"; {hint}" if hint else "",
        )

    async def _settle(
        self, bot: str, tool: str, amount: int, gone: anyio.Event | None, prepay: bool = False
    ) -> tuple[str | None, bool]:
        """The refusal reason (None: paid) and whether the payer ran."""
        if amount <= 0:
            return "bot requested a nonpositive amount", False
        approved = False
        while True:
            settings = self._settings()
            async with self._lock:
                reason = _policy_refusal(settings, bot, amount, self._spend.day_total(self._now()))
            if reason is not None:
                return reason, False
            if gone is not None and gone.is_set():
                return AGENT_GONE, False
            if not settings.autopay and not approved:
                timeout = settings.approval_timeout_secs
                label = f"{tool} (prepayment)" if prepay else tool
                decision = await self._park(bot, label, amount, timeout, gone)
                if decision == "gone":
                    return AGENT_GONE, False
                if decision == "denied":
                    return "payment denied by the user", False
                if decision == "timeout":
                    return f"approval timed out after {go_duration(timeout)}", False
                approved = True
            async with self._lock:
                settings = self._settings()
                if not settings.autopay and not approved:
                    continue  # switched to approval meanwhile: the user decides first
                now = self._now()
                reason = _policy_refusal(settings, bot, amount, self._spend.day_total(now))
                if reason is not None:
                    return reason, False
                if gone is not None and gone.is_set():
                    return AGENT_GONE, False
                ticket = self._spend.launch(ts=now, bot=bot, tool=tool, atoms=amount, prepay=prepay)
                try:
                    await self._persist()
                except BridgeError as exc:
                    self._spend.withdraw(ticket)
                    log.error("spend log not written, payment to %s not made: %s", bot, exc)
                    return f"could not record the spend, so nothing was paid: {exc}", False
            spend_id = secrets.token_hex(4)
            log.info(
                "spend %s: paying %d atoms to bot %s for tool %s (%s; recorded pending in the spend log)",
                spend_id,
                amount,
                bot,
                tool,
                "approved" if approved else settings.mode,
            )
            # Shielded: once money may move, the agent going away or cancelling
            # does not interrupt it (the tip wait still bounds it).
            with anyio.CancelScope(shield=True):
                return await self._pay(ticket, bot, amount, settings.tip_wait_secs, spend_id, gone), True

    async def _park(
        self, bot: str, tool: str, amount: int, approval_secs: float, gone: anyio.Event | None
    ) -> str:
        """Wait for the user's decision, or ``"gone"`` as soon as the agent's
        request went away (the parked payment is withdrawn)."""
        if gone is None:
            return await self.approvals.wait(
                bot=bot, tool=tool, atoms=amount, timeout_secs=approval_secs, on_parked=self._parked
            )
        decision = "gone"
        async with anyio.create_task_group() as tg:

            async def _decide() -> None:
                nonlocal decision
                decision = await self.approvals.wait(
                    bot=bot, tool=tool, atoms=amount, timeout_secs=approval_secs, on_parked=self._parked
                )
                tg.cancel_scope.cancel()

            tg.start_soon(_decide)
            await gone.wait()
            tg.cancel_scope.cancel()
        if decision == "gone":
            log.info("payment of %d atoms to %s for %s withdrawn: the agent went away", amount, bot, tool)
        return decision

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
                    await self._payer.pay(bot, amount)
                except Exception as exc:
                    reason = _error_text(exc)
                    if getattr(exc, "may_land", False):
                        # It did not complete now: failed (not counted), and the
                        # entry says it may still land; a late completion of
                        # it turns the entry paid (SpendLog.resolve).
                        status, err = STATUS_FAILED, reason
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
                    try:
                        await self._persist()
                    except BridgeError as exc:
                        log.error("spend log not written after paying %s: %s", bot, exc)
        return None if status == STATUS_PAID else reason
