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
5. the payer runs with a ``tip_wait_secs`` deadline: success → ``paid``; an
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
instead of paying again (BRIDGE.md §Spend log and approvals).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio
import anyio.to_thread

from brmcp._ops.payhook import SCHEDULED_CALLBACK, payment_scheduled
from brmcp.protocol.payment import PaymentRequired

if TYPE_CHECKING:
    from brmcp.metrics import BridgeMetrics
from brmcp._ops.clock import Clock, go_duration
from brmcp.bridge.base import BridgeError, Settings
from brmcp.bridge.links import AgentGone

from ._approvals import ApprovalQueue, PendingPayment
from ._spend import (
    STATUS_FAILED,
    STATUS_PAID,
    STATUS_PENDING,
    BotBalance,
    InDoubtSpend,
    SpendLog,
    SpendSummary,
    SpendTicket,
)

__all__ = [
    "AGENT_GONE",
    "AGENT_GONE_PAID",
    "DETACHED_HOLD_LIMIT",
    "LATE_OUTCOME_WAIT",
    "InDoubtSpend",
    "Payer",
    "Settler",
    "WhileParked",
    "cap_refusal",
    "payment_scheduled",
]

log = logging.getLogger("brmcp.bridge")

#: Why no payment was made for a call whose agent went away.
AGENT_GONE = "the agent went away before paying; nothing was paid"
#: The spend entry's note for a payment completed after its agent went away.
AGENT_GONE_PAID = (
    "the agent went away while this payment was in flight; the credit stays at the bot for later calls"
)
#: Most seconds (wall time) a payment waits for a detached agent connection
#: to be resumed or given up (the HTTP layer gives up after its 3 s resume
#: grace); past this the agent counts as gone.
DETACHED_HOLD_LIMIT = 30.0
#: Most seconds (wall time) a late tip outcome waits for a payment of the
#: same payee and amount that this process is still finishing (its tip
#: stalled an instant ago) before it counts as matching nothing.
LATE_OUTCOME_WAIT = 10.0


#: :meth:`Settler.settle`'s ``while_parked``: an async function run while a
#: payment waits for the user's decision, with the parked payment and the
#: time its wait times out (unix seconds on the bridge clock).
WhileParked = Callable[[PendingPayment, float], Awaitable[None]]


@runtime_checkable
class Payer(Protocol):
    """Moves money to a bot. ``pay`` returns only once settlement of
    ``atoms`` atoms to ``payee_uid`` is confirmed and raises otherwise; the
    exception's text is shown to the agent verbatim, so make it a
    human-readable reason. An exception with a true ``may_land`` attribute
    means the payment did not complete now but may still land (the spend
    stays ``pending``, counted against the day cap, with that reason in
    ``err``, until a late outcome settles it through
    :meth:`Settler.resolve`); any other marks it ``failed``. It may be
    cancelled (the tip wait expired); the payment's outcome is then
    unknown and the spend stays ``pending`` too."""

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


async def _while_parked(run: WhileParked, payment: PendingPayment, expires: float) -> None:
    """``run(payment, expires)``; what it raises (not a cancellation) is
    logged and dropped, so it never ends the wait for the decision."""
    try:
        await run(payment, expires)
    except Exception as exc:
        log.warning("while payment %s waits for approval: %s", payment.id, _error_text(exc))


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
        #: Set (and replaced) whenever a payment of this process finishes.
        self._finished = anyio.Event()
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

    def approval_hint(self, payment_id: str) -> str:
        """How the user decides the parked payment ``payment_id`` (the
        commands, and the approvals page when it is served), as the embedding
        bridge words it; empty when it gave no hint. Names no secret."""
        return self._approval_hint(payment_id) if self._approval_hint is not None else ""

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
        """Late outcome for a pending payment (see :meth:`SpendLog.resolve`):
        ``err`` None marks it ``paid``, a text ``failed``; persisted. This
        is how an entry whose tip brclient retries later, whose tip wait
        ran out, or that an earlier process left pending is settled. When
        no entry is claimable yet but this process is finishing a payment of
        the same payee and amount (its tip stalled an instant ago), waits
        for it, at most :data:`LATE_OUTCOME_WAIT` s. Returns False when
        nothing matches. Raises BridgeError when the write fails (the change
        stays in memory and is written with the next change)."""
        with anyio.move_on_after(LATE_OUTCOME_WAIT):
            while True:
                async with self._lock:
                    if self._spend.resolve(payee, atoms, err):
                        await self._persist()
                        return True
                    if not self._spend.paying(payee, atoms):
                        return False
                    finished = self._finished
                await finished.wait()
        return False

    def in_doubt(self, bot: str) -> list[InDoubtSpend]:
        """The spend entries to ``bot`` (case-insensitive) that are
        ``pending`` and that this process is not making right now, oldest
        first: written by an earlier process (it stopped or crashed with the
        tip in flight), or whose tip wait ran out, or whose tip brclient
        retries later. Their money may have moved; each is settled by a late
        tip outcome (:meth:`resolve`). Each exposes ``.tool``, ``.atoms``,
        ``.call_key`` (None for entries of older versions), ``.ts`` (unix
        seconds), ``.status``, ``.adopted`` and ``await .wait_settled()``
        (see :class:`~brmcp.bridge.pay._spend.InDoubtSpend`)."""
        return self._spend.in_doubt(bot)

    def adopt(
        self,
        bot: str,
        tool: str,
        *,
        newer_than: float | None = None,
        scheduled_newer_than: float | None = None,
        args_hash: str | None = None,
        paid_newer_than: float | None = None,
    ) -> InDoubtSpend | None:
        """Claim the oldest in-doubt entry (:meth:`in_doubt`) to ``bot`` for
        ``tool`` that no other call has claimed, for one call: it is marked
        adopted in memory until :meth:`release_adopted`, so two calls never
        take over the same entry (and its callKey). None when there is
        none, or when every one was written at or before ``newer_than``
        (unix seconds; ``scheduled_newer_than`` for entries the wallet took,
        :func:`payment_scheduled`). The entry stays ``pending`` and counted; claiming
        it moves no money and writes nothing.

        ``args_hash`` (:func:`~brmcp.bridge.pay._spend.arguments_hash` of the
        call's arguments): an entry recorded with the same hash and a callKey
        is the same call's payment and is preferred (the newest such), whatever the tip wait
        (only ``scheduled_newer_than`` bounds its age): one in doubt, or one
        an earlier process left pending that a late outcome has settled
        ``paid`` since (its call may never have been answered; its callKey
        lets the bot answer it from its record). An entry recorded with
        another hash paid for other arguments and is never claimed (the bot
        ran or refused that call, not this one). Entries without a hash
        (older versions) are claimed by tool alone. An entry whose adopting
        call was answered (:meth:`mark_answered`) is never claimed again: a
        later identical call is a new call, and taking over that callKey
        would answer it with the earlier call's stored result. An entry an
        earlier process left ``paid`` and unanswered (:meth:`SpendLog.inherited`)
        is claimed only when written after ``paid_newer_than`` (the bot's
        replay window: past it the bot no longer holds that call's outcome)."""
        if args_hash is not None:
            # The newest first: an agent's retry follows the call it
            # repeats, and an older entry of the same arguments belongs to
            # an earlier call (answered, or given up on) as often as not.
            same_calls = dict.fromkeys((*self._spend.in_doubt(bot), *self._spend.inherited(bot)))
            for same in sorted(same_calls, key=lambda e: e.ts, reverse=True):
                if (
                    same.tool == tool
                    and not same.adopted
                    and not same.answered
                    and same.args_hash == args_hash
                    and same.call_key is not None
                    and (scheduled_newer_than is None or same.ts > scheduled_newer_than)
                    and (paid_newer_than is None or same.status != STATUS_PAID or same.ts > paid_newer_than)
                ):
                    same._row.adopted = True
                    return same
        candidates = [
            c for c in self._spend.in_doubt(bot) if c.tool == tool and not c.adopted and not c.answered
        ]
        for candidate in candidates:
            if candidate.args_hash is not None and candidate.args_hash != args_hash:
                continue
            limit = scheduled_newer_than if candidate.scheduled else newer_than
            if limit is not None and candidate.ts <= limit:
                continue
            candidate._row.adopted = True
            return candidate
        return None

    async def mark_answered(self, entry: InDoubtSpend) -> None:
        """The call that adopted ``entry`` was answered under its callKey:
        record it (:meth:`SpendLog.mark_answered`, persisted), so no later
        identical call, in this process or after a restart, takes that
        callKey over and is answered with that call's stored result. The
        entry stays pending (and in the day's total) until its own outcome.
        A write that fails is logged; the mark is written with the next
        change."""
        async with self._lock:
            if self._spend.mark_answered(entry):
                try:
                    await self._persist()
                except BridgeError as exc:
                    log.warning("spend log not written after an answered call: %s", exc)

    async def mark_call_answered(self, call_key: str) -> None:
        """The logical call ``call_key`` was answered with its result: mark
        every spend entry paid under that callKey
        (:meth:`SpendLog.mark_key_answered`, persisted) so that none is
        taken over by a later identical call, in this process or after a
        restart, even while its own tip is still in doubt (the bot would
        answer that call with this one's stored result, charging nothing).
        A write that fails is logged; the mark is written with the next
        change."""
        async with self._lock:
            if self._spend.mark_key_answered(call_key):
                try:
                    await self._persist()
                except BridgeError as exc:
                    log.warning("spend log not written after an answered call: %s", exc)

    def release_adopted(self, entry: InDoubtSpend) -> None:
        """Let another call adopt ``entry`` again (idempotent)."""
        entry._row.adopted = False

    def has_paid(self, bot: str) -> bool:
        """True when the spend log holds a payment to ``bot`` that did not
        fail (made, or still pending)."""
        return any(e.bot == bot and e.counts for e in self._spend.entries)

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
                    reason = _error_text(exc)
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
