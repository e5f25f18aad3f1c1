"""Paying before the bot asks: the known balance, pay alongside and prepay
(BRIDGE.md §Pay alongside and prepay).

Per bot, the bridge keeps the caller's **known balance** at the bot: the
``brmcp/balanceAtoms`` of the last receipt or refusal, plus payments
confirmed since (WIRE.md §Receipts). It is None until the bot said
anything; None counts as empty.

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

One prepayment is in flight per bot at a time; a call that finds one under
way is marked with its amount and waits for it instead of paying again. Each
call that pays alongside pays its own shortfall.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio

from ..protocol.payment import (
    BALANCE_ATOMS_KEY,
    HELD_KEY,
    REFUNDED_ATOMS_KEY,
    PaymentRequired,
    parse_payment_required,
    parse_receipt,
)
from .budget import Listing
from .settings import Settings
from .settle import Settler

__all__ = ["Funding", "Payment"]

log = logging.getLogger("brmcp.bridge")


class _Unset:
    """The type of :data:`_UNSET` (an argument not given)."""

    __slots__ = ()


_UNSET = _Unset()


def _whole(value: Any) -> int | None:
    """``value`` when it is a JSON integer ≥ 0, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


class Payment:
    """One payment ahead of need: ``amount`` atoms; :meth:`wait` returns
    None once it is confirmed, else the reason nothing (certain) was paid."""

    __slots__ = ("_done", "_reason", "amount", "attached", "claimed", "included", "prepay")

    def __init__(self, amount: int, *, prepay: bool) -> None:
        self.amount = amount
        self.prepay = prepay
        self._done = anyio.Event()
        self._reason: str | None = "not finished"
        #: Calls sent marked with this payment (a prepayment covers one).
        self.attached = 0
        #: False once the call it was made alongside was withdrawn: its
        #: credit is then for later calls.
        self.claimed = True
        #: Whether a receipt already counts this payment's credit: True (a
        #: call the bot held for it), False (a call charged without it: the
        #: credit is on top), None (no receipt seen yet).
        self.included: bool | None = None

    def _finish(self, reason: str | None) -> None:
        self._reason = reason
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def confirmed(self) -> bool:
        """True once the payment is confirmed (it was made)."""
        return self._done.is_set() and self._reason is None

    @property
    def settled(self) -> anyio.Event:
        """Set once the payment is confirmed or failed."""
        return self._done

    async def wait(self) -> str | None:
        await self._done.wait()
        return self._reason


class Funding:
    """The known balance at one bot and the payments made ahead of need.
    ``price_of(tool)`` reads the snapshot; ``spawn(fn, *args)`` starts a task
    the bridge owns (a payment outlives the call that started it)."""

    def __init__(
        self,
        bot: str,
        settler: Settler,
        settings: Callable[[], Settings],
        price_of: Callable[[str], int | None],
        spawn: Callable[..., None],
    ) -> None:
        self.bot = bot
        self._settler = settler
        self._settings = settings
        self._price_of = price_of
        self._spawn = spawn
        #: The caller's balance at the bot as far as known (atoms), None: never told.
        self.balance: int | None = None
        self._observed = 0  # bumped by every receipt
        self._inflight: Payment | None = None
        #: Payments started ahead of need (alongside or prepay), for tests and metrics.
        self.started = 0
        #: True while the bot's refusals contradict its listing (:meth:`distrust`).
        self.distrusted = False

    # -- the known balance --------------------------------------------------------

    def observe(
        self,
        tool: str,
        result: Any,
        ahead: Payment | None = None,
        *,
        refusal: PaymentRequired | _Unset | None = _UNSET,
        listing: Listing | None = None,
    ) -> None:
        """Learn the balance from a tool result: a receipt or a refusal sets
        it; a successful result without a receipt from a fixed-price tool
        (a Go bot) lowers a known balance by the price.

        ``refusal``: the refusal the caller found in ``result`` (None: none,
        e.g. refusal-shaped tool output from a bot that marks its genuine
        refusals); parsed from ``result`` when not given. ``listing``: what
        the agent was shown for ``tool``; a refusal or receipt that keeps to
        it ends a :meth:`distrust`.

        ``ahead``: the payment made alongside this call and not counted yet.
        A receipt counts that payment's credit when the bot held the call
        for it (``_meta`` ``brmcp/held``; WIRE.md §Pay alongside), or when
        the payment was confirmed before this answer came (its tip landed
        before the call); otherwise the call was charged at once from
        credit already there, and the payment is added on top when it
        confirms (so that credit is used, not paid for again and again).
        """
        meta = getattr(result, "meta", None)
        receipt = parse_receipt(meta)
        if isinstance(refusal, _Unset):
            refusal = parse_payment_required(result)
        if receipt is not None and ahead is not None and ahead.included is None:
            held = isinstance(meta, dict) and meta.get(HELD_KEY) is True
            ahead.included = held or ahead.confirmed
        if listing is not None and listing.kind == "fixed" and self.distrusted:
            asked = receipt.charged_atoms if receipt is not None else None
            if refusal is not None:
                asked = max(refusal.price_atoms, refusal.shortfall_atoms)
            if asked is not None and asked <= listing.price_atoms:
                self.distrusted = False
                log.info("bot %s keeps to its listed prices again: paying alongside resumes", self.bot[:8])
        if receipt is not None:
            self._set(receipt.balance_atoms)
        elif refusal is not None:
            # A refusal says the credit of a payment under way had not covered
            # the call yet: it does not stop that payment from being added.
            self.balance = max(0, refusal.balance_atoms)
        elif isinstance(meta, dict) and _whole(meta.get(REFUNDED_ATOMS_KEY)) is not None:
            balance = _whole(meta.get(BALANCE_ATOMS_KEY))
            if balance is not None:
                self._set(balance)
        elif not getattr(result, "is_error", False) and self.balance is not None:
            price = self._price_of(tool)
            if price:
                self._set(max(0, self.balance - price))

    def distrust(self) -> None:
        """The bot asked more than the price it listed: pay nothing
        alongside its calls, and prepay nothing, until a refusal or receipt
        of it keeps to its listing again (BRIDGE.md §Pay alongside and
        prepay)."""
        if not self.distrusted:
            log.info(
                "bot %s asked more than its listed price: no payment alongside until it agrees", self.bot[:8]
            )
        self.distrusted = True

    def _set(self, balance: int) -> None:
        self.balance = balance
        self._observed += 1

    def paid(self, amount: int) -> None:
        """A payment of ``amount`` made in answer to a refusal was confirmed."""
        self.balance = (self.balance or 0) + amount

    # -- payments ahead of need -------------------------------------------------------

    def alongside(
        self, tool: str, gone: anyio.Event | None = None, *, call_key: str | None = None
    ) -> Payment | None:
        """The payment to make alongside a first send of ``tool``: the one
        already in flight, or a new one for the shortfall when the price is
        fixed, the known balance short and the policy lets it go unasked.
        None: send the call unmarked."""
        if self.distrusted:
            return None
        price = self._price_of(tool)
        inflight = self._inflight
        if inflight is not None and not inflight.done:
            covered = (self.balance or 0) + inflight.amount - inflight.attached * (price or 0)
            if price and covered >= price:
                # A prepayment on its way covers this call: it waits for it.
                inflight.attached += 1
                return inflight
        if not price:
            return None
        if self.balance is None and self._settler.has_paid(self.bot):
            # Unknown (this bridge restarted) but paid before: credit may be
            # there already; the call goes unmarked and its answer tells.
            return None
        have = self.balance or 0
        if inflight is not None and not inflight.done:
            have = max(0, have + inflight.amount - inflight.attached * price)
        if have >= price:
            return None
        payment = self._start(tool, price, have, prepay=False, gone=gone, call_key=call_key)
        if payment is not None:
            payment.attached = 1
        return payment

    def after_call(self, tool: str, result: Any) -> None:
        """A call of ``tool`` succeeded: top the balance up for the next one
        when prepay is on for this bot (see the module docstring)."""
        if self.distrusted or not self._settings().prepays(self.bot):
            return
        inflight = self._inflight
        if inflight is not None and not inflight.done:
            return
        receipt = parse_receipt(getattr(result, "meta", None))
        # Only a tool with a listed fixed price is prepaid, and never more
        # than that price: a receipt's word does not set an amount.
        price = self._price_of(tool) or 0
        if receipt is None or price <= 0 or self.balance is None or self.balance >= price:
            return
        self._start(tool, price, self.balance, prepay=True)

    def _start(
        self,
        tool: str,
        price: int,
        have: int,
        *,
        prepay: bool,
        gone: anyio.Event | None = None,
        call_key: str | None = None,
    ) -> Payment | None:
        amount = price - have
        # A prepayment may wait for the user's approval (it is not on any
        # call's path); a payment alongside a call may not.
        if self._settler.precheck(self.bot, amount, unasked=not prepay) is not None:
            return None
        payment = Payment(amount, prepay=prepay)
        if prepay:
            # Only a prepayment is shared: an alongside payment's credit is
            # its own call's (another call may find it already spent).
            self._inflight = payment
        self.started += 1
        refusal = PaymentRequired(tool=tool, price_atoms=price, balance_atoms=have, shortfall_atoms=amount)
        self._spawn(self._pay, tool, refusal, payment, gone, call_key)
        return payment

    async def _pay(
        self,
        tool: str,
        refusal: PaymentRequired,
        payment: Payment,
        gone: anyio.Event | None,
        call_key: str | None = None,
    ) -> None:
        observed = self._observed
        reason: str | None = "payment abandoned"
        try:
            reason = await self._settler.settle(
                self.bot, tool, refusal, gone=gone, prepay=payment.prepay, call_key=call_key
            )
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            log.error("payment ahead of need to %s failed: %s", self.bot[:8], reason)
        finally:
            shared = payment.prepay or not payment.claimed or (gone is not None and gone.is_set())
            if reason is None and (
                payment.included is False
                or (shared and payment.included is None and self._observed == observed)
            ):
                # The receipt seen left it out, or (a prepayment, or one whose
                # call was withdrawn) no receipt since: the balance now
                # includes it. A payment made alongside a call still in
                # flight is that call's: counting it here would let another
                # call spend it first.
                self.balance = (self.balance or 0) + payment.amount
            if reason is not None and payment.prepay:
                log.info("prepayment of %d atoms to %s not made: %s", payment.amount, self.bot[:8], reason)
            if self._inflight is payment:
                self._inflight = None
            payment._finish(reason)
