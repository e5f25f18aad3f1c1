"""Paying before the bot asks: the known balance, pay alongside and prepay
(BRIDGE.md §Pay alongside and prepay).

Per bot, the bridge keeps the caller's **known balance** at the bot: the
``brmcp/balanceAtoms`` of the last receipt or refusal, plus payments
confirmed since (WIRE.md §Receipts). It is None until the bot said
anything, and again when a payment's credit may or may not be counted
(below). None counts as empty with a bot this bridge never paid; otherwise
the call goes unmarked and its answer tells.

* **Pay alongside.** When a tool has a fixed price (``brmcp/priceAtoms`` in
  the snapshot) and the known balance is short, the call's first send goes
  out marked ``brmcp/payAlongside`` while the shortfall is paid at the same
  time (autopay within the caps only: approval mode never pays unasked). A
  harness that understands the mark holds the call until the credit lands
  (WIRE.md §Pay alongside): 2 PMs plus the tip. One that does not answers
  ``payment_required``; the call then waits for that payment and reissues
  the same call, as after any payment, without paying again.
* **Prepay.** For a bot on ``prepay_bots``, after each paid call whose
  receipt leaves the balance below the tool's price, the bridge tips the
  difference in the background, so the next call of that tool finds its
  credit there: 2 PMs, no tip on its path. A prepayment is an ordinary
  payment (caps, spend log; in approval mode it waits for the user's
  decision, labelled ``<tool> (prepayment)``), marked ``"prepay": true``.

**One payment to a bot at a time** (autopay). While the bot's balance is
unknown to the bridge, or a payment to that bot is in flight (one made
alongside a call whose answer has not come yet, a prepayment, or one
answering a refusal), at most one call pays. The other calls that would pay
wait (:meth:`Funding.alongside`, :meth:`Funding.turn`) for that call's
answer: its receipt's ``brmcp/balanceAtoms``, its refusal's balance, or its
payment's confirmation (a bot that does not know the mark answers
``payment_required``: the confirmed payment then decides). Then each decides
again with the credit reported: a call the known balance covers goes out
unmarked and pays nothing; if the balance does not cover it, again at most
one of them pays (the next round).

* A call sent unmarked on known credit counts on its price
  (:attr:`Share.reserved`) until its own answer comes, so concurrent calls
  never count on the same atoms; a call whose own payment was confirmed
  counts on it likewise until its reissue is answered.
* A call sent unmarked while the balance is unknown (:attr:`Share.blind`:
  after a restart, or at a bot that gives no receipts) may be charged from
  any credit there. A payment waits until no such call, and no call
  counting on credit that may not be there after all, is in flight:
  otherwise one of them could take the credit of the call that paid,
  which would then be refused having paid.
* A refused call pays what the known balance, less what other calls count
  on, leaves short (at most the price the agent was shown and the per-call
  cap), not simply the shortfall its refusal names: concurrent refusals read
  the same balance, and each paying that would leave one of them short.
* A payment's credit the balance known may or may not count (its call was
  charged at once before it was confirmed, or other calls were charged
  while it landed) makes the balance unknown again: the next calls go
  unmarked and their answers tell. Guessing could count credit that is not
  there, and a call counting on it would take another's.
* A waiting call keeps its own deadline (:class:`TimeoutError`) and stops
  waiting when its agent goes away. When the paying call fails or its agent
  gives up, its payment's credit (once confirmed) is for the others and a
  waiter takes over: never a stall, never two tips for one shortfall.
* A prepayment under way covers one call, which is marked with its amount
  and waits for it.
* Calls that pay nothing unasked never wait: approval mode (the user
  decides each payment), a payment the caps refuse now, a tool without a
  fixed price.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio

from brmcp.bridge.base import Settings
from brmcp.protocol.payment import (
    PaymentRequired,
    parse_receipt,
)

from ._balance import KnownBalance
from ._settle import Settler
from ._shares import Payment, Share

__all__ = ["Funding"]

log = logging.getLogger("brmcp.bridge")


#: Seconds a first send waits for another call's payment round before it
#: pays alongside itself: a round normally ends within a round trip, but
#: the paying call may be a tool that runs for minutes, and the calls behind
#: it must not wait for its result.
ROUND_PATIENCE = 5.0


class _Wait:
    """The type of :data:`_WAIT`."""

    __slots__ = ()


#: :meth:`Funding._decide`: another call's payment ahead of need decides first.
_WAIT = _Wait()


class Funding(KnownBalance):
    """The known balance at one bot and the payments made ahead of need.
    ``bot`` is the bot's uid, or for a bot pool (WIRE.md §Pools; one balance
    for all its members) a function naming the member to pay now;
    ``price_of(tool)`` reads the snapshot; ``spawn(fn, *args)`` starts a task
    the bridge owns (a payment outlives the call that started it)."""

    def __init__(
        self,
        bot: str | Callable[[], str],
        settler: Settler,
        settings: Callable[[], Settings],
        price_of: Callable[[str], int | None],
        spawn: Callable[..., None],
    ) -> None:
        super().__init__(bot, price_of)
        self._settler = settler
        self._settings = settings
        self._spawn = spawn
        self._inflight: Payment | None = None  # the prepayment under way
        #: Payments started ahead of need (alongside or prepay), for tests and metrics.
        self.started = 0
        #: Calls waiting right now for another call's payment to decide (observability).
        self.waiting = 0

    # -- payments ahead of need -------------------------------------------------------

    async def alongside(
        self,
        tool: str,
        gone: anyio.Event | None = None,
        *,
        call_key: str | None = None,
        args_hash: str | None = None,
        deadline: float | None = None,
    ) -> Share:
        """The share of a first send of ``tool`` (:class:`Share`): marked
        with the prepayment in flight that covers it, or with a new payment
        of the shortfall when the price is fixed, the known balance short
        and the policy lets it go unasked; else unmarked, counting on the
        known balance when that covers the price. While another call's
        payment ahead of need decides (module docstring) this waits, until
        ``deadline`` (:func:`anyio.current_time`; then :class:`TimeoutError`)
        or ``gone`` is set (then the call goes unmarked, paying nothing)."""
        began = anyio.current_time()
        while True:
            patient = anyio.current_time() - began < ROUND_PATIENCE
            decided = self._decide(tool, gone, call_key, patient=patient, args_hash=args_hash)
            if isinstance(decided, Share):
                return decided
            self.waiting += 1
            try:
                limit = began + ROUND_PATIENCE
                if deadline is not None and deadline < limit:
                    await self._wait(gone, deadline)
                else:
                    with anyio.move_on_after(max(0.0, limit - anyio.current_time())):
                        await self._wait(gone, deadline)
            finally:
                self.waiting -= 1

    async def _wait(self, gone: anyio.Event | None, deadline: float | None) -> None:
        """Until the next change, ``gone`` or ``deadline`` (TimeoutError)."""
        changed = self._changed
        timeout = None if deadline is None else deadline - anyio.current_time()
        with anyio.fail_after(timeout):
            if gone is None:
                await changed.wait()
                return
            async with anyio.create_task_group() as tg:

                async def until_set(event: anyio.Event) -> None:
                    await event.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(until_set, changed)
                tg.start_soon(until_set, gone)

    def _decide(
        self,
        tool: str,
        gone: anyio.Event | None,
        call_key: str | None,
        *,
        patient: bool = True,
        args_hash: str | None = None,
    ) -> Share | _Wait:
        """:meth:`alongside`'s decision now, without waiting (``patient``
        False: past :data:`ROUND_PATIENCE`, it no longer waits for a round)."""
        price = self._price_of(tool) or 0
        share = Share(price)
        if self.distrusted or price <= 0 or (gone is not None and gone.is_set()):
            return self._unmarked(share)
        if self.balance is None and not self.round_open and self._settler.has_paid(self.bot):
            # Unknown (this bridge restarted, or a bot that gives no
            # receipts) but paid before: credit may be there already; the
            # call goes unmarked and its answer tells.
            return self._unmarked(share)
        have = (self.balance or 0) - self._reserved
        if self.balance is not None and have >= price:
            self._reserve(share, trusting=True)
            return share
        inflight = self._inflight
        if inflight is not None and not inflight.done and have + inflight.amount >= price:
            # A prepayment on its way covers this call: it waits for it, and
            # counts on its credit (no other call takes it when it lands).
            inflight.attached += 1
            share.payment = inflight
            self._reserve(share, trusting=True)
            return share
        shortfall = price - max(0, have)
        if self._settler.precheck(self.bot, shortfall) is not None:
            # Nothing would be paid alongside (approval mode, the caps): as
            # when no other payment is under way, the call goes unmarked.
            return self._unmarked(share)
        if self._busy and patient:
            return _WAIT
        payment = self._start(
            tool, price, max(0, have), prepay=False, gone=gone, call_key=call_key, args_hash=args_hash
        )
        if payment is None:
            return self._unmarked(share)
        payment.attached = 1
        share.payment = payment
        return share

    async def turn(
        self,
        share: Share,
        asked: int,
        *,
        limit: int,
        cap: int,
        gone: anyio.Event | None = None,
        deadline: float | None = None,
        covered_ok: bool = True,
    ) -> Payment | None:
        """A refused call's turn to pay (autopay, the call's first payment;
        ``asked`` atoms is what the bot's refusal asked). While another
        payment to the bot is in flight this waits, until ``deadline``
        (:class:`TimeoutError`) or ``gone``. Then: None when the credit now
        known covers the call (it counts on it and asks again, paying
        nothing; only with ``covered_ok``); else the payment to make, whose
        round is under way until :meth:`finish`: ``asked`` raised to what
        the known balance, less what other calls count on, leaves short, at
        most ``limit`` (the price the agent was shown) and ``cap`` (the
        per-call cap, when > 0). Concurrent refusals read the same balance:
        each paying the shortfall it names would leave one of them short.
        Calls sent blind (:attr:`Share.blind`) are waited for too: one of
        them could be charged from this payment's credit, leaving this call
        refused after paying."""
        self._release(share)  # it counts on nothing now
        while True:
            if gone is not None and gone.is_set():
                # Nothing is paid for a call nobody waits for (the settler
                # says so): no round.
                return Payment(asked, prepay=False)
            if not self._busy:
                have = (self.balance or 0) - self._reserved
                if covered_ok and self.balance is not None and have >= share.price:
                    self._reserve(share, trusting=True)
                    return None
                raised = min(limit, share.price - max(0, have))
                if cap > 0:
                    raised = min(raised, cap)
                payment = Payment(max(asked, raised), prepay=False, observed=self._observed)
                payment.answered = True
                self._round = payment
                return payment
            self.waiting += 1
            try:
                await self._wait(gone, deadline)
            finally:
                self.waiting -= 1

    def finish(self, payment: Payment, reason: str | None, share: Share) -> None:
        """The payment of :meth:`turn` was made (``reason`` None) or not:
        its credit is known at once, and ``share``'s call counts on it until
        its reissue is answered; its round is over."""
        payment._finish(reason)
        if reason is None:
            self._count(payment)
            self._reserve(share)
        self._notify()

    def after_call(self, tool: str, result: Any, ahead: Payment | None = None) -> None:
        """A call of ``tool`` succeeded: top the balance up for the next one
        when prepay is on for this bot (see the module docstring). ``ahead``:
        the payment that call was marked with."""
        if self.distrusted or not self._settings().prepays(self.bot):
            return
        if self.round_open and not (ahead is self._round and ahead is not None and ahead.included is True):
            # A payment under way may still add credit: nothing more until it did.
            return
        inflight = self._inflight
        if inflight is not None and not inflight.done and inflight is not ahead:
            return
        receipt = parse_receipt(getattr(result, "meta", None))
        # Only a tool with a listed fixed price is prepaid, and never more
        # than that price: a receipt's word does not set an amount.
        price = self._price_of(tool) or 0
        have = (self.balance or 0) - self._reserved
        if receipt is None or price <= 0 or self.balance is None or have >= price:
            return
        self._start(tool, price, max(0, have), prepay=True)

    def _start(
        self,
        tool: str,
        price: int,
        have: int,
        *,
        prepay: bool,
        gone: anyio.Event | None = None,
        call_key: str | None = None,
        args_hash: str | None = None,
    ) -> Payment | None:
        amount = price - have
        # A prepayment may wait for the user's approval (it is not on any
        # call's path); a payment alongside a call may not.
        if self._settler.precheck(self.bot, amount, unasked=not prepay) is not None:
            return None
        payment = Payment(amount, prepay=prepay, observed=self._observed)
        if prepay:
            # Only a prepayment is shared: an alongside payment's credit is
            # its own call's (another call may find it already spent).
            self._inflight = payment
        self._round = payment
        self.started += 1
        refusal = PaymentRequired(tool=tool, price_atoms=price, balance_atoms=have, shortfall_atoms=amount)
        self._spawn(self._pay, tool, refusal, payment, gone, call_key, args_hash)
        return payment

    async def _pay(
        self,
        tool: str,
        refusal: PaymentRequired,
        payment: Payment,
        gone: anyio.Event | None,
        call_key: str | None = None,
        args_hash: str | None = None,
    ) -> None:
        reason: str | None = "payment abandoned"
        try:
            reason = await self._settler.settle(
                self.bot,
                tool,
                refusal,
                gone=gone,
                prepay=payment.prepay,
                call_key=call_key,
                args_hash=args_hash,
            )
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            log.error("payment ahead of need to %s failed: %s", self.bot[:8], reason)
        finally:
            shared = payment.prepay or not payment.claimed or (gone is not None and gone.is_set())
            if self._inflight is payment:
                self._inflight = None
            payment._finish(reason)
            if payment.included is False and payment.confirmed:
                # Its call was charged at once, before this confirmation: the
                # tip landed before that charge (the receipt counts it) or
                # after (it is on top). The balance is unknown again: the
                # next calls go unmarked and their answers tell.
                payment.counted = True
                self.balance = None
            elif shared and payment.included is None:
                # A prepayment, or one whose call was withdrawn: the balance
                # now includes it. A payment made alongside a call still in
                # flight is that call's: counting it here would let another
                # call spend it first.
                self._count(payment, since=payment.observed)
            if reason is not None and payment.prepay:
                log.info("prepayment of %d atoms to %s not made: %s", payment.amount, self.bot[:8], reason)
            self._notify()
