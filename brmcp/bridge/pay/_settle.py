"""Deciding and making one payment: caps, approval, spend recording
(BRIDGE.md §The payment flow, §Security model "The caps apply in both modes").

Order of a settlement:

1. amount = the bot's shortfall when > 0, else its price; ≤ 0 is refused;
2. the per-call cap and the rolling 24-hour cap are checked (≤ 0 means
   never pay; an exact fill is allowed; both modes);
3. approval mode parks the payment until the user decides or the timeout
   (meanwhile the caller's ``while_parked`` runs, e.g. to keep the agent
   informed);
4. under the spend lock the settings in force *now* are read again (caps,
   mode, allowed bots, enabled), and the entry is recorded ``pending`` and
   written to disk *before* any money moves, so concurrent calls can never
   reserve past the daily cap and a policy change made while a call waited
   binds it;
5. the payer runs (:mod:`._paymaster`) with a ``tip_wait_secs`` deadline: success → ``paid``; an
   error → ``failed`` (no longer counted); an error that says the payment
   may still land (brclient retries the tip later), the deadline, or
   cancellation → stays ``pending`` and counted, because the tip may still
   land; a late tip outcome settles it (:meth:`Settler.resolve`).

While the agent's connection is detached (closed, within the resume grace;
:class:`~brmcp.bridge.links._relay.AgentGone`) no payment starts, approved or not:
it waits until the agent resumes or counts as gone, and then it is
withdrawn (BRIDGE.md §Resumability).

Pending entries whose payment this process is not making (written before a
restart, or whose wait ended without an outcome) are *in doubt*:
:meth:`Settler.in_doubt` lists them and :meth:`Settler.adopt` lets one call
claim one, so a call after a restart can take over that entry's callKey
instead of paying again (BRIDGE.md §Spend log and approvals); the spend log's
side of the settler is :class:`~._ledger.SpendBook`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable

import anyio

from brmcp._ops.clock import Clock, go_duration
from brmcp._ops.payhook import payment_scheduled
from brmcp.bridge.base import BridgeError, Settings
from brmcp.bridge.links import AgentGone
from brmcp.protocol.payment import PaymentRequired

from ._approvals import ApprovalQueue, PendingPayment
from ._paymaster import Payer, Paymaster, error_text
from ._spend import (
    SpendLog,
)

__all__ = [
    "AGENT_GONE",
    "DETACHED_HOLD_LIMIT",
    "Settler",
    "WhileParked",
    "cap_refusal",
    "payment_scheduled",
]

log = logging.getLogger("brmcp.bridge")

#: Why no payment was made for a call whose agent went away.
AGENT_GONE = "the agent went away before paying; nothing was paid"
#: Most seconds (wall time) a payment waits for a detached agent connection
#: to be resumed or given up (the HTTP layer gives up after its 3 s resume
#: grace); past this the agent counts as gone.
DETACHED_HOLD_LIMIT = 30.0


#: :meth:`Settler.settle`'s ``while_parked``: an async function run while a
#: payment waits for the user's decision, with the parked payment and the
#: time its wait times out (unix seconds on the bridge clock).
WhileParked = Callable[[PendingPayment, float], Awaitable[None]]


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


async def _while_parked(run: WhileParked, payment: PendingPayment, expires: float) -> None:
    """``run(payment, expires)``; what it raises (not a cancellation) is
    logged and dropped, so it never ends the wait for the decision."""
    try:
        await run(payment, expires)
    except Exception as exc:
        log.warning("while payment %s waits for approval: %s", payment.id, error_text(exc))


async def _attached(gone: anyio.Event | None) -> bool:
    """False when the agent is gone; for an
    :class:`~brmcp.bridge.links._relay.AgentGone`, waits while the agent's
    connection is detached (at most :data:`DETACHED_HOLD_LIMIT` s, then the
    agent counts as gone)."""
    if gone is None:
        return True
    if not isinstance(gone, AgentGone):
        return not gone.is_set()
    with anyio.move_on_after(DETACHED_HOLD_LIMIT):
        return await gone.wait_attached()
    return False


class Settler(Paymaster):
    """Owns the spend log (:class:`~._ledger.SpendBook`), the approval queue
    and the payer (:class:`~._paymaster.Paymaster`); decides each payment."""

    def __init__(
        self,
        *,
        spend: SpendLog,
        payer: Payer,
        clock: Clock,
        settings: Callable[[], Settings],
        approval_hint: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__(spend=spend, payer=payer, clock=clock)
        self._approval_hint = approval_hint
        self._settings = settings
        self.approvals = ApprovalQueue(clock, on_change=self._changed)

    def approval_hint(self, payment_id: str) -> str:
        """How the user decides the parked payment ``payment_id`` (the
        commands, and the approvals page when it is served), as the embedding
        bridge words it; empty when it gave no hint. Names no secret."""
        return self._approval_hint(payment_id) if self._approval_hint is not None else ""

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
        call_key: str | None = None,
        ask: bool = False,
        while_parked: WhileParked | None = None,
        args_hash: str | None = None,
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
        for approval is then withdrawn (a later decision for it is refused,
        :meth:`ApprovalQueue.withdrawn`), and none is started. When ``gone``
        is the call's :class:`~brmcp.bridge.links._relay.AgentGone`, no payment
        starts while the agent's connection is detached: an approval or an
        autopay decision waits until the agent resumes (then it proceeds) or
        counts as gone (then it is withdrawn). A payment already in flight
        completes (its credit stays at the bot) and its spend entry says so.

        ``call_key`` (the logical call's ``brmcp/callKey``) is recorded in
        the spend entry (``"callKey"``), and ``args_hash`` (the call's
        :func:`~brmcp.bridge.pay._spend.arguments_hash`) as ``"argsHash"``, both
        written and fsynced before the payer runs.
        ``ask``: the user must approve this payment even in autopay mode
        (e.g. a further payment for one logical call).

        ``while_parked`` (:data:`WhileParked`) runs, in a task this call
        owns, for as long as a payment is parked for the user's decision:
        it is called with the parked payment and the unix time (bridge
        clock) its wait times out, and cancelled the moment the decision
        comes, the wait times out or the agent goes away, before anything
        is paid. What it raises is logged and dropped."""
        amount = refusal.shortfall_atoms if refusal.shortfall_atoms > 0 else refusal.price_atoms
        reason, attempted = await self._settle(
            bot, tool, amount, gone, prepay, call_key, ask, while_parked, args_hash
        )
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
        self,
        bot: str,
        tool: str,
        amount: int,
        gone: anyio.Event | None,
        prepay: bool = False,
        call_key: str | None = None,
        ask: bool = False,
        while_parked: WhileParked | None = None,
        args_hash: str | None = None,
    ) -> tuple[str | None, bool]:
        """The refusal reason (None: paid) and whether the payer ran."""
        if amount <= 0:
            return "bot requested a nonpositive amount", False
        approved: str | None = None  # the id of the approved parked payment
        while True:
            settings = self._settings()
            async with self._lock:
                reason = _policy_refusal(settings, bot, amount, self._spend.day_total(self._now()))
            if reason is not None:
                return self._not_made(approved, reason), False
            if gone is not None and gone.is_set():
                return self._gone(approved), False
            if (ask or not settings.autopay) and approved is None:
                timeout = settings.approval_timeout_secs
                label = f"{tool} (prepayment)" if prepay else tool
                decision, payment_id = await self._park(bot, label, amount, timeout, gone, while_parked)
                if decision == "gone":
                    return AGENT_GONE, False
                if decision == "denied":
                    return "payment denied by the user", False
                if decision == "timeout":
                    return f"approval timed out after {go_duration(timeout)}", False
                approved = payment_id
            if not await _attached(gone):
                return self._gone(approved), False
            async with self._lock:
                settings = self._settings()
                if (ask or not settings.autopay) and approved is None:
                    continue  # switched to approval meanwhile: the user decides first
                now = self._now()
                reason = _policy_refusal(settings, bot, amount, self._spend.day_total(now))
                if reason is not None:
                    return self._not_made(approved, reason), False
                if gone is not None and gone.is_set():
                    return self._gone(approved), False
                if isinstance(gone, AgentGone) and gone.detached:
                    continue  # the connection dropped again: wait for it first
                ticket = self._spend.launch(
                    ts=now,
                    bot=bot,
                    tool=tool,
                    atoms=amount,
                    prepay=prepay,
                    call_key=call_key,
                    args_hash=args_hash,
                )
                if approved is not None:
                    self.approvals.note_spend(approved, ticket)
                try:
                    await self._persist()
                except BridgeError as exc:
                    self._spend.withdraw(ticket)
                    log.error("spend log not written, payment to %s not made: %s", bot, exc)
                    reason = f"could not record the spend, so nothing was paid: {exc}"
                    if approved is not None:
                        self.approvals.note_not_paid(approved, reason)
                    return reason, False
            spend_id = secrets.token_hex(4)
            log.info(
                "spend %s: paying %d atoms to bot %s for tool %s (%s%s; recorded pending in the spend log)",
                spend_id,
                amount,
                bot,
                tool,
                "approved" if approved is not None else settings.mode,
                # The bot logs the same prefix with the charge it makes for it.
                f", callKey {call_key[:8]}" if call_key else "",
            )
            # Shielded: once money may move, the agent going away or cancelling
            # does not interrupt it (the tip wait still bounds it).
            with anyio.CancelScope(shield=True):
                return await self._pay(ticket, bot, amount, settings.tip_wait_secs, spend_id, gone), True

    def _not_made(self, approved: str | None, reason: str) -> str:
        """``reason``, after an approved payment (id ``approved``) is not
        made after all: the approvals page says so instead of "being made"."""
        if approved is not None:
            self.approvals.note_not_paid(approved, reason)
        return reason

    def _gone(self, approved: str | None) -> str:
        """The agent went away before its payment started: an approval it
        had already got is withdrawn too (a repeated decision is refused)."""
        if approved is not None:
            self.approvals.note_withdrawn(approved)
            log.info("approved payment %s withdrawn: the agent went away before it started", approved)
        return AGENT_GONE

    async def _park(
        self,
        bot: str,
        tool: str,
        amount: int,
        approval_secs: float,
        gone: anyio.Event | None,
        while_parked: WhileParked | None = None,
    ) -> tuple[str, str]:
        """Wait for the user's decision, or ``"gone"`` as soon as the agent's
        request went away (the parked payment is withdrawn); returns it and
        the parked payment's id. ``while_parked`` runs in this task group
        from the moment the payment is listed until the wait ends."""
        parked_id = ""
        decision = "gone"
        async with anyio.create_task_group() as tg:

            def on_parked(payment: PendingPayment) -> None:
                nonlocal parked_id
                parked_id = payment.id
                self._parked(payment)
                if while_parked is not None:
                    expires = self._clock.now() + approval_secs
                    tg.start_soon(_while_parked, while_parked, payment, expires)

            async def _decide() -> None:
                nonlocal decision
                decision = await self.approvals.wait(
                    bot=bot, tool=tool, atoms=amount, timeout_secs=approval_secs, on_parked=on_parked
                )
                # The decision (or the timeout) ends the companion task too.
                tg.cancel_scope.cancel()

            if gone is None:
                await _decide()
            else:
                tg.start_soon(_decide)
                await gone.wait()
                tg.cancel_scope.cancel()
        if decision == "gone":
            log.info("payment of %d atoms to %s for %s withdrawn: the agent went away", amount, bot, tool)
        return decision, parked_id
