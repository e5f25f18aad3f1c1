"""The caller's known balance at one bot (BRIDGE.md §Pay alongside and
prepay; the rules: :mod:`._funding`): what receipts and refusals say, the
atoms calls in flight count on, and the payments' credit counted once.
:class:`~._funding.Funding` builds the payments ahead of need on it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio

from brmcp.protocol.payment import (
    BALANCE_ATOMS_KEY,
    HELD_KEY,
    REFUNDED_ATOMS_KEY,
    PaymentRequired,
    parse_payment_required,
    parse_receipt,
)

from ._budget import Listing
from ._shares import Payment, Share

__all__ = ["KnownBalance"]

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


class KnownBalance:
    """The known balance at one bot: ``bot`` is the bot's uid, or for a bot
    pool (WIRE.md §Pools; one balance for all its members) a function naming
    the member to pay now; ``price_of(tool)`` reads the snapshot."""

    def __init__(self, bot: str | Callable[[], str], price_of: Callable[[str], int | None]) -> None:
        self._bot = bot
        self._price_of = price_of
        #: The caller's balance at the bot as far as known (atoms), None: not
        #: known (never told, or a payment's credit may or may not be in it).
        self.balance: int | None = None
        self._observed = 0  # bumped by every receipt
        #: The payment whose round is under way (:mod:`._funding`).
        self._round: Payment | None = None
        #: Atoms of the known balance that calls in flight count on.
        self._reserved = 0
        #: Calls in flight sent unmarked while the balance was unknown
        #: (:attr:`Share.blind`), and those counting on the balance known
        #: rather than on a payment of their own (:attr:`Share.trusting`).
        self._blind = 0
        self._trusting = 0
        #: Set (and replaced) whenever a waiting call may decide differently.
        self._changed = anyio.Event()
        #: True while the bot's refusals contradict its listing (:meth:`distrust`).
        self.distrusted = False

    @property
    def bot(self) -> str:
        """The uid payments ahead of need go to (for a pool, the member
        preferred right now)."""
        return self._bot if isinstance(self._bot, str) else self._bot()

    @property
    def reserved(self) -> int:
        """Atoms of the known balance that calls in flight count on."""
        return self._reserved

    @property
    def round_open(self) -> bool:
        """True while a payment to the bot (ahead of need, or a refused
        call's, :meth:`turn`) is in flight, or the call it was made
        alongside has not been answered: other calls that would pay wait."""
        payment = self._round
        return payment is not None and not (payment.done and payment.answered)

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def _reserve(self, share: Share, *, trusting: bool = False) -> None:
        """``share``'s call counts on its price of the balance known: on the
        balance itself (``trusting``), or on a payment it made."""
        if share.reserved == 0 and share.price > 0:
            share.reserved = share.price
            self._reserved += share.price
            if trusting:
                share.trusting = True
                self._trusting += 1

    def _release(self, share: Share) -> None:
        self._reserved -= share.reserved
        share.reserved = 0
        if share.blind:
            share.blind = False
            self._blind -= 1
        if share.trusting:
            share.trusting = False
            self._trusting -= 1

    def _unmarked(self, share: Share) -> Share:
        """``share`` going out unmarked on no known credit: blind while the
        balance is unknown."""
        if self.balance is None and not share.blind:
            share.blind = True
            self._blind += 1
        return share

    @property
    def _busy(self) -> bool:
        """True while a payment now could go to another call than the one
        that made it: another payment decides first, or calls sent unmarked
        (blind, or counting on credit that may not be there after all) may
        still be charged from its credit."""
        return self.round_open or self._blind > 0 or self._trusting > 0

    def _count(self, payment: Payment, since: int | None = None) -> None:
        """Add a confirmed payment's credit to the known balance (once).
        ``since``: the receipt count after which the balance known leaves
        that credit out; when other receipts came since (calls charged while
        it landed, which may or may not count it), the balance is unknown
        again instead, and the bot's next answers tell."""
        if payment.counted or not payment.confirmed:
            return
        payment.counted = True
        if since is not None and self._observed != since:
            self.balance = None
            return
        self.balance = (self.balance or 0) + payment.amount

    def observe(
        self,
        tool: str,
        result: Any,
        ahead: Payment | None = None,
        *,
        refusal: PaymentRequired | _Unset | None = _UNSET,
        listing: Listing | None = None,
        share: Share | None = None,
    ) -> None:
        """Learn the balance from a tool result: a receipt or a refusal sets
        it; a successful result without a receipt from a fixed-price tool
        (a Go bot) lowers a known balance by the price.

        ``refusal``: the refusal the caller found in ``result`` (None: none,
        e.g. refusal-shaped tool output from a bot that marks its genuine
        refusals); parsed from ``result`` when not given. ``listing``: what
        the agent was shown for ``tool``; a refusal or receipt that keeps to
        it ends a :meth:`distrust`. ``share``: the calling call's
        (:meth:`alongside`): the atoms it counted on are counted no more,
        the answer says where they went.

        ``ahead``: the payment made alongside this call and not counted yet.
        A receipt counts that payment's credit when the bot held the call
        for it (``_meta`` ``brmcp/held``; WIRE.md §Pay alongside), or when
        the payment was confirmed before this answer came (its tip landed
        before the call); otherwise the call was charged at once, and its
        receipt may or may not count the payment (credit already there paid
        for it, or the tip landed just before): when the payment confirms,
        the balance is unknown again, and the next calls go unmarked and
        their answers tell (so that credit is used, not paid for again and
        again).
        """
        meta = getattr(result, "meta", None)
        receipt = parse_receipt(meta)
        if isinstance(refusal, _Unset):
            refusal = parse_payment_required(result)
        if receipt is not None and ahead is not None and ahead.included is None:
            held = isinstance(meta, dict) and meta.get(HELD_KEY) is True
            ahead.included = held or ahead.confirmed
        if ahead is not None and (refusal is None or (ahead.done and not ahead.confirmed)):
            # Its answer accounts for the payment. A refusal while the payment
            # may still be made does not: the call waits for it, and its
            # round ends when its credit is known (:meth:`landed`).
            ahead.answered = True
        if share is not None:
            waited = share.payment
            if refusal is None or waited is None or not waited.prepay or waited.done:
                # Else it still counts on the prepayment it waits for now.
                self._release(share)
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
        self._notify()

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
        self._notify()

    def _set(self, balance: int) -> None:
        self.balance = balance
        self._observed += 1

    def paid(self, amount: int, share: Share | None = None) -> None:
        """A payment of ``amount`` made in answer to a refusal was confirmed;
        the call that made it (``share``) counts on its credit until its
        reissue is answered."""
        self.balance = (self.balance or 0) + amount
        if share is not None:
            self._reserve(share)
        self._notify()

    def landed(self, share: Share) -> None:
        """The payment ``share``'s call was marked with, which the bot refused
        without holding it (it does not know the mark, or its hold ran
        out), was confirmed: its credit is known, and that call counts on it
        until its reissue is answered."""
        payment = share.payment
        if payment is None or not payment.confirmed:
            return
        if not payment.prepay:
            self._count(payment)
        self._reserve(share)
        payment.answered = True
        self._notify()

    def done(self, share: Share | None) -> None:
        """``share``'s call ended (answered, failed or cancelled): what it
        counted on is free, and a payment made alongside it that its answer
        did not account for is credit for the other calls."""
        if share is None:
            return
        self._release(share)
        payment = share.payment
        if payment is not None and not payment.answered:
            # Ended without the bot's answer (the agent gave up, the deadline,
            # a failed link): the payment's credit is no longer this call's.
            payment.answered = True
            payment.claimed = False
            if payment.confirmed and payment.included is None:
                self._count(payment, since=payment.observed)
        self._notify()
