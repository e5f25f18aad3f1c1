"""The spend log as the settler keeps it (BRIDGE.md §Spend log and approvals):
every change written to disk under one lock in mutation order, the listeners
told of each change, the balances bots reported, late tip outcomes, and the
*in-doubt* entries a call may adopt.

Pending entries whose payment this process is not making (written before a
restart, or whose wait ended without an outcome) are in doubt:
:meth:`SpendBook.in_doubt` lists them and :meth:`SpendBook.adopt` lets one
call claim one, so a call after a restart can take over that entry's callKey
instead of paying again. Making a payment (:mod:`._paymaster`) and deciding
one (:mod:`._settle`) build on this class.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import anyio
import anyio.to_thread

from brmcp._ops.clock import Clock
from brmcp.bridge.base import BridgeError

from ._spend import STATUS_PAID, BotBalance, InDoubtSpend, SpendLog, SpendSummary

__all__ = ["LATE_OUTCOME_WAIT", "SpendBook"]

log = logging.getLogger("brmcp.bridge")

#: Most seconds (wall time) a late tip outcome waits for a payment of the
#: same payee and amount that this process is still finishing (its tip
#: stalled an instant ago) before it counts as matching nothing.
LATE_OUTCOME_WAIT = 10.0


class SpendBook:
    """Owns the spend log (``spend``, timed by ``clock``): its lock, its
    writes, the change listeners and the bots' reported balances."""

    def __init__(self, *, spend: SpendLog, clock: Clock) -> None:
        self._spend = spend
        self._clock = clock
        self._lock = anyio.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._balances: dict[str, BotBalance] = {}
        #: Set (and replaced) whenever a payment of this process finishes.
        self._finished = anyio.Event()
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
