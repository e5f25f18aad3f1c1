"""Deciding a payment the bot asked for, within one logical call's hard bound
(BRIDGE.md §The payment flow, §The hard bound): :class:`Decider` judges a
refusal against the listing the agent was shown and the per-call cap
(:mod:`.budget`), waits its turn behind another call's payment to the bot
(:mod:`.funding`), and pays through the :class:`~.settle.Settler` (caps, the
day total, approval mode, the spend log). While a payment waits for the
user's approval, an agent that asked for progress is told so every
:data:`APPROVAL_PROGRESS_INTERVAL` s (:meth:`Decider.approval_progress`).
The payment loop (:mod:`.payloop`) owns one and calls it for each refusal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from brmcp._ops.clock import Clock, go_duration
from brmcp.bridge.base import Settings
from brmcp.bridge.links import AgentCall, BotLink, LinkError
from brmcp.protocol.payment import PaymentRequired

from ._approvals import PendingPayment
from ._budget import CallBudget, listing_of
from ._funding import Funding
from ._money import already
from ._settle import Settler, WhileParked
from ._shares import Payment, Share
from ._spend import DAY_SECONDS, STATUS_FAILED, STATUS_PAID, InDoubtSpend

__all__ = [
    "APPROVAL_PROGRESS_INTERVAL",
    "APPROVAL_PROGRESS_STEP",
    "COVERED",
    "MAX_PAYMENTS",
    "Covered",
    "Decider",
]

log = logging.getLogger("brmcp.bridge")

#: Most payments one logical call makes, each after the first approved by
#: the user (approval mode only; autopay pays a call once), within the
#: per-call cap for the whole call.
MAX_PAYMENTS = 3

#: Seconds (bridge clock) between the progress notifications sent to an
#: agent that asked for progress while its call's payment waits for the
#: user's approval; the first goes out as soon as the payment is parked.
#: Clients that restart their request timeout on progress keep waiting.
APPROVAL_PROGRESS_INTERVAL = 10.0
#: What each of those notifications adds to the last progress value the
#: agent saw: small, so the tool's own progress after the approval (which
#: starts over, and of which only increasing values reach the agent) is
#: not swallowed.
APPROVAL_PROGRESS_STEP = 0.001


class Covered:
    """The type of :data:`COVERED`."""

    __slots__ = ()


#: :meth:`Decider.decide`: the credit known now covers the refused call; ask
#: again, paying nothing.
COVERED = Covered()


class Decider:
    """The payment decisions of the calls to the bot of ``link``: payments go
    through ``settler``; ``settings`` reads the policy in force; ``clock``
    (the bridge's) paces the approval keepalive."""

    def __init__(
        self, link: BotLink, settler: Settler, clock: Clock, *, settings: Callable[[], Settings]
    ) -> None:
        self.link = link
        self._settler = settler
        self._clock = clock
        self._settings = settings

    async def decide(
        self,
        tool: str,
        refusal: PaymentRequired,
        budget: CallBudget,
        key: str,
        gone: anyio.Event | None,
        *,
        payee: str | None = None,
        funding: Funding | None = None,
        waiting: AgentCall | None = None,
        share: Share | None = None,
        deadline: float | None = None,
        covered_ok: bool = True,
        args_hash: str | None = None,
    ) -> str | Covered | None:
        """Pay for ``refusal`` within the call's hard bound (:mod:`.budget`)
        and the policy (:class:`Settler`). Returns None once a payment was
        confirmed (counted in ``budget``), else the reason nothing was paid
        (shown after ``<name>: payment not made: ``). ``waiting``: the agent
        call that asked for progress; while the payment is parked for
        approval it is told so (:meth:`_approval_progress`). ``payee``: the
        bot that refused (a pool member; None: :attr:`link`'s); ``funding``:
        the call's (its pool's, or :attr:`funding`).

        ``share``: the call's share of the credit at the bot (:mod:`.funding`).
        In autopay mode its first payment waits, until ``deadline``, while
        another payment to the bot is in flight, and is then sized by the
        credit known (:meth:`Funding.turn`); :data:`COVERED` when that
        credit covers the call (only with ``covered_ok``).

        A payment in doubt the call counts (``budget.doubt``) is waited for
        first, until ``deadline`` (:func:`anyio.current_time`; None: the
        ``tip_wait_secs`` in force): paid, None (ask again on its credit);
        failed, the call pays as any; still unknown, the reason says what is
        in doubt and that a retry uses it. ``args_hash``: the call's
        :func:`~brmcp.bridge.pay._spend.arguments_hash`, recorded with a payment."""
        settings = self._settings()
        doubt = budget.doubt
        if doubt is not None and budget.in_doubt:
            # The call counts a payment whose outcome is not known yet (made
            # before a restart, or its tip wait ran out): its outcome decides
            # whether anything is paid now, so wait for it, within the
            # call's deadline, instead of paying twice or giving up at once.
            # It counts only for as long as it blocks a second payment
            # (BRIDGE.md §The hard bound): a day once the wallet took it,
            # else tip_wait_secs from when it was made, since a tip whose
            # TipUser never returned may never have left and nothing may
            # ever report it.
            window = DAY_SECONDS if doubt.scheduled else settings.tip_wait_secs
            left = doubt.ts + window - self._clock.now()
            moment = anyio.current_time()
            own = deadline if deadline is not None else moment + settings.tip_wait_secs
            limit = min(own, moment + max(0.0, left))
            status = await _outcome(doubt, limit, gone)
            if status is None and doubt.ts + window > self._clock.now():
                unknown = _in_doubt_text(doubt, tool)
                log.info("payment to bot %s for tool %s not made: %s", self.link.uid[:8], tool, unknown)
                return unknown
            if status is None:
                # Its window ran out with no outcome: it no longer blocks a
                # payment. The entry stays pending (and in the day's total)
                # until a late outcome settles it; this call pays as any,
                # under the callKey it took over, so a late tip is credit at
                # the bot, never a second run.
                log.info(
                    "payment of %d atoms to bot %s for tool %s (spend log entry of %d) still in doubt"
                    " after %d s; it no longer blocks this call",
                    doubt.atoms,
                    self.link.uid[:8],
                    tool,
                    doubt.ts,
                    window,
                )
                budget.settle_doubt(STATUS_FAILED)
            else:
                budget.settle_doubt(status)
                log.info(
                    "payment of %d atoms in doubt to bot %s for tool %s settled %s",
                    doubt.atoms,
                    self.link.uid[:8],
                    tool,
                    status,
                )
            if status == STATUS_PAID:
                # Its credit is at the bot (or on its way): ask again on it.
                return None
            # It failed: nothing was paid for this call; it pays as any call.
        judgement = budget.judge(tool, refusal, settings.per_call_cap_atoms)
        reason = judgement.decline
        no_more = budget.payments and (settings.autopay or budget.payments >= MAX_PAYMENTS)
        if no_more and (reason is None or judgement.over_cap):
            if budget.in_doubt:
                reason = (
                    f"a payment of {budget.in_doubt} atoms to this bot for {tool} whose outcome is not"
                    " known yet (see the spend log) counts for this call; nothing more is paid for it;"
                    " a retry of this call once brclient reports that outcome uses it"
                )
            else:
                reason = (
                    f"already paid {budget.paid_atoms} atoms for this call and the bot still asks for"
                    " payment; one call is paid once unless you approve more (approval mode); that"
                    " credit stays at the bot for later calls"
                )
            log.info("payment to bot %s for tool %s not made: %s", self.link.uid[:8], tool, reason)
            return reason
        if judgement.contradicts_listing:
            if funding is not None:
                funding.distrust()
            shown = budget.listing.describe()
            try:
                await self.link.refresh()
            except LinkError:
                now = "the listing could not be refreshed"
            else:
                current = listing_of(self.link.tool(tool))
                now = f"now {current.describe()}" if current != budget.listing else f"still {shown}"
            reason = f"{reason} ({now}); nothing was paid; a new price applies only to a new call of {tool}"
        if reason is not None:
            if budget.payments and "already paid" not in reason:
                reason += already(budget)
            log.info("payment to bot %s for tool %s not made: %s", self.link.uid[:8], tool, reason)
            return reason
        amount = judgement.amount
        turn: Payment | None = None
        if (
            funding is not None
            and share is not None
            and settings.autopay
            and not judgement.further
            and budget.payments == 0
            and budget.listing.kind == "fixed"
        ):
            # One payment to a bot in flight at a time: this one waits for
            # the one under way, then pays what the credit known leaves short.
            try:
                turn = await funding.turn(
                    share,
                    amount,
                    limit=budget.listing.price_atoms,
                    cap=settings.per_call_cap_atoms,
                    gone=gone,
                    deadline=deadline,
                    covered_ok=covered_ok,
                )
            except TimeoutError:
                reason = "the call's deadline passed while it waited for another call's payment to this bot"
                log.info("payment to bot %s for tool %s not made: %s", self.link.uid[:8], tool, reason)
                return reason
            if turn is None:
                return COVERED
            amount = turn.amount
        asked = PaymentRequired(
            tool=tool,
            price_atoms=refusal.price_atoms,
            balance_atoms=refusal.balance_atoms,
            shortfall_atoms=amount,
        )
        settled: str | None = "not paid"
        try:
            settled = await self._settler.settle(
                payee or self.link.uid,
                tool,
                asked,
                gone=gone,
                call_key=key,
                args_hash=args_hash,
                ask=judgement.further,
                while_parked=self.approval_progress(waiting) if waiting is not None else None,
            )
        finally:
            if turn is not None and funding is not None and share is not None:
                funding.finish(turn, settled, share)
        if settled is not None:
            if budget.payments:
                settled += already(budget)
            return settled
        budget.add(amount)
        if funding is not None and turn is None:
            funding.paid(amount, share)
        return None

    def approval_progress(self, call: AgentCall) -> WhileParked:
        """The ``while_parked`` task of :meth:`Settler.settle` for ``call``
        (an agent request with a progress token): at once and then every
        :data:`APPROVAL_PROGRESS_INTERVAL` s on the bridge clock it sends a
        ``notifications/progress`` under the agent's token, its value
        :data:`APPROVAL_PROGRESS_STEP` above the last one the agent saw (no
        ``total``), its message what the payment waits for (not how to
        approve it: the user decides, not the agent). None is sent while the agent's connection is detached.
        The settler cancels it when the decision comes, the wait times out
        or the agent goes away."""

        async def remind(payment: PendingPayment, expires: float) -> None:
            while True:
                if call.gone.is_set():
                    return
                if not call.detached:
                    left = go_duration(max(0, round(expires - self._clock.now())))
                    # Addressed to the agent: it says what waits and for whom,
                    # not how to approve (the user decides, not the agent).
                    text = (
                        f"waiting for the user to approve or deny a payment of {payment.atoms} atoms to"
                        f" bot {payment.bot[:8]} for {payment.tool} (payment {payment.id}, {left} left)"
                    )
                    # AgentCall.progress drops a value that does not increase.
                    last = call.last_progress
                    await call.progress((last or 0.0) + APPROVAL_PROGRESS_STEP, None, text)
                await self._clock.sleep(APPROVAL_PROGRESS_INTERVAL)

        return remind


async def _outcome(doubt: InDoubtSpend, deadline: float, gone: anyio.Event | None) -> str | None:
    """The status (``paid`` or ``failed``) a late tip outcome settles
    ``doubt`` with, waited for until ``deadline`` (:func:`anyio.current_time`)
    or until ``gone`` is set; None when it is still unknown then."""
    if doubt.settled:
        return doubt.status
    status: str | None = None
    with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
        async with anyio.create_task_group() as tg:

            async def settled() -> None:
                nonlocal status
                status = await doubt.wait_settled()
                tg.cancel_scope.cancel()

            tg.start_soon(settled)
            if gone is not None:
                await gone.wait()
                tg.cancel_scope.cancel()
    return status


def _in_doubt_text(doubt: InDoubtSpend, tool: str) -> str:
    """What the agent is told when the call's deadline passes while a payment
    it counts is still in doubt: what is in doubt, and that a retry uses it."""
    key = f", callKey {doubt.call_key[:8]}" if doubt.call_key else ""
    return (
        f"a payment of {doubt.atoms} atoms to this bot for {tool} (spend log entry of {doubt.ts}{key})"
        " is still in doubt: brclient has not reported whether its tip landed within this call's"
        " deadline; nothing more was paid; a retry of this call with the same arguments uses that"
        " payment (its credit, or the bot's answer to it) instead of paying again"
    )
