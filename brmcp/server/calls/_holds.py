"""Pay alongside, the server's side (WIRE.md §Pay alongside): an
underfunded call marked ``brmcp/payAlongside`` is held until a credit
covers it, and a caller's new ``brmcp/callerEpoch`` drops the calls its
previous process left held.

:class:`HeldCalls` is owned by :class:`~._pipeline.CallPipeline`: it keeps
the held calls per caller, wakes them on every credit
(:meth:`HeldCalls.credited`), drops them on a new epoch
(:meth:`HeldCalls.observe_epoch`, with :class:`CallerEpochs` remembering
the epochs seen) and runs the hold itself (:meth:`HeldCalls.charge_or_hold`).
The hold's deadline and re-checks run on ``HarnessConfig.timer``
(:mod:`._timer`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable

import anyio

from brmcp.server.config import HarnessConfig

from ._callkeys import CallKeyRegistry, Claim
from ._refusal import DROPPED_TEXT, Refusal, RefusalReason, Refused
from ._timer import timer_now, wait_event

__all__ = ["DROPPED_TEXT", "HOLD_RECHECK", "CallerEpochs", "HeldCalls"]

log = logging.getLogger("brmcp.server")

#: While holding, the balance is re-read at least this often (seconds), so a
#: credit made outside the harness (an external ``Billing``) is seen too.
HOLD_RECHECK = 1.0


class CallerEpochs:
    """The latest ``brmcp/callerEpoch`` seen per caller uid
    (WIRE.md §Pay alongside), with the few epochs it replaced (``retired`` per caller),
    for at most ``capacity`` callers (least recently seen forgotten first).

    :meth:`observe` says whether an epoch is news: a caller's first, or one
    neither current nor retired. A retired epoch (a late message of a
    process already replaced) is not news, so it cannot drop the calls of
    the process that replaced it."""

    def __init__(self, capacity: int = 4096, retired: int = 8) -> None:
        self.capacity = capacity
        self._retired = retired
        self._seen: OrderedDict[str, tuple[str, deque[str]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def latest(self, peer: str) -> str | None:
        """The latest epoch seen from ``peer`` (None: none remembered)."""
        entry = self._seen.get(peer)
        return entry[0] if entry is not None else None

    def observe(self, peer: str, epoch: str) -> bool:
        """Record ``epoch`` from ``peer``; True when it is news (see the class)."""
        entry = self._seen.get(peer)
        if entry is None:
            self._seen[peer] = (epoch, deque(maxlen=self._retired))
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
            return True
        self._seen.move_to_end(peer)
        latest, retired = entry
        if epoch == latest or epoch in retired:
            return False
        retired.append(latest)
        self._seen[peer] = (epoch, retired)
        return True


class Hold:
    """One call held for a pay-alongside credit: its claim (None when
    unkeyed), the caller epoch it came under, whether a debit is in flight
    for it (then it cannot be dropped) and whether it was dropped."""

    __slots__ = ("charging", "claim", "dropped", "epoch")

    def __init__(self, claim: Claim | None, epoch: str | None) -> None:
        self.claim = claim
        self.epoch = epoch
        self.charging = False
        self.dropped = False


class HeldCalls:
    """The calls held right now for a pay-alongside credit, per caller.
    ``config`` is the harness's (read live: ``hold_seconds``,
    ``max_held_calls``, ``timer``); ``calls`` its callKey registry, whose
    claims a dropped call releases."""

    def __init__(self, config: HarnessConfig, calls: CallKeyRegistry) -> None:
        self.config = config
        self._calls = calls
        #: Per caller: an event set (and replaced) on every credit, for held calls.
        self._credit_events: dict[str, anyio.Event] = {}
        #: Per caller: calls held right now waiting for a pay-alongside credit.
        self._held: dict[str, list[Hold]] = {}
        #: The latest caller epoch per caller (bounded).
        self.epochs = CallerEpochs()
        #: Held calls dropped because their caller's epoch changed.
        self.dropped = 0
        #: Calls that were held at least once (observability and tests).
        self.holds = 0

    def credited(self, peer: str) -> None:
        """Wake the calls of ``peer`` held for a pay-alongside credit (the
        harness calls it after every credit to ``peer``)."""
        event = self._credit_events.pop(peer, None)
        if event is not None:
            event.set()

    def _credit_event(self, peer: str) -> anyio.Event:
        event = self._credit_events.get(peer)
        if event is None:
            event = self._credit_events[peer] = anyio.Event()
        return event

    def observe_epoch(self, peer: str, epoch: str | None) -> int:
        """Note a ``tools/call`` of ``peer`` under caller epoch ``epoch``
        (a validated ``brmcp/callerEpoch``; None, a caller without epochs,
        changes nothing). When the epoch is news (:class:`CallerEpochs`),
        every call of ``peer`` held right now under another epoch, and not
        in the middle of a debit, is dropped at once: its callKey claim is
        released here, synchronously, so the call that brought the news
        claims the key afresh and runs (and is charged) once; the held call
        ends uncharged with the tool error :data:`DROPPED_TEXT` (WIRE.md
        §Pay alongside, rule 6). Returns how many calls were dropped."""
        if epoch is None or not self.epochs.observe(peer, epoch):
            return 0
        dropped = 0
        for hold in self._held.get(peer, ()):
            if hold.epoch is None or hold.epoch == epoch or hold.charging or hold.dropped:
                continue
            hold.dropped = True
            dropped += 1
            if hold.claim is not None:
                refusal = Refusal.caller_restarted()
                self._calls.release(hold.claim, refusal.reason.value, refusal.result())
        if dropped:
            self.dropped += dropped
            log.info("dropped %d held call(s) of %s: its caller process changed", dropped, peer)
            self.credited(peer)  # wake them
        return dropped

    async def charge_or_hold(
        self,
        charge: Callable[[bool], Awaitable[int]],
        *,
        call_id: str,
        peer: str,
        tool: str,
        price: int,
        alongside: int,
        claim: Claim | None = None,
        epoch: str | None = None,
    ) -> tuple[int, bool]:
        """Charge ``price`` atoms with ``charge(quiet)`` (the pipeline's
        debit: returns the balance after it or raises :class:`._refusal.Refused`;
        ``quiet`` keeps a ``payment_required`` refusal out of the log). With a
        pay-alongside mark (``alongside`` > 0: the atoms being tipped), hold
        an underfunded call until a credit covers it (WIRE.md §Pay alongside):
        at most ``hold_seconds``, at most ``max_held_calls`` per caller, and
        only when the balance plus the announced tip could cover the price.
        Returns the balance after the charge and whether the call was held
        (WIRE.md §Pay alongside rule 7); raises :class:`Refused`
        with the ordinary ``payment_required`` refusal when it is not held or
        the hold ends unfunded, and with a
        :attr:`~._refusal.RefusalReason.CALLER_RESTARTED` refusal when
        :meth:`observe_epoch` dropped it (``claim`` and ``epoch`` are the
        call's callKey claim and caller epoch, for that)."""
        config = self.config
        holdable = alongside > 0 and config.hold_seconds > 0 and config.max_held_calls > 0
        event = self._credit_event(peer) if holdable else None
        try:
            return await charge(event is not None), False
        except Refused as refused:
            if event is None or refused.refusal.reason is not RefusalReason.PAYMENT_REQUIRED:
                raise
            balance = refused.refusal.balance_atoms
            waiting = sum(1 for other in self._held.get(peer, ()) if not other.dropped)
            if balance + alongside < price or waiting >= config.max_held_calls:
                refused.refusal.log_payment_required(peer)
                raise
            last = refused
        log.info(
            "holding call %s of %s to %s for %s atoms until the tip of %s atoms sent alongside arrives "
            "(balance %s; at most %s s)",
            call_id,
            peer,
            tool,
            f"{price:,}",
            f"{alongside:,}",
            f"{balance:,}",
            f"{config.hold_seconds:g}",
        )
        hold = Hold(claim, epoch)
        self._held.setdefault(peer, []).append(hold)
        self.holds += 1
        timer = config.timer
        deadline = timer_now(timer) + config.hold_seconds
        try:
            while True:
                if hold.dropped:
                    raise Refused(Refusal.caller_restarted())
                remaining = deadline - timer_now(timer)
                if remaining <= 0:
                    log.info("the tip sent alongside call %s did not arrive in time", call_id)
                    last.refusal.log_payment_required(peer)
                    raise last
                # Only the wait is bounded: a charge never runs under a
                # deadline that could interrupt it after the debit.
                await wait_event(event, min(remaining, HOLD_RECHECK), timer)
                event = self._credit_event(peer)
                if hold.dropped:
                    raise Refused(Refusal.caller_restarted())
                # A debit in flight cannot be dropped: its outcome decides.
                hold.charging = True
                try:
                    return await charge(True), True
                except Refused as refused:
                    if refused.refusal.reason is not RefusalReason.PAYMENT_REQUIRED:
                        raise
                    last = refused
                finally:
                    hold.charging = False
        finally:
            holds = self._held[peer]
            holds.remove(hold)
            if not holds:
                del self._held[peer]
