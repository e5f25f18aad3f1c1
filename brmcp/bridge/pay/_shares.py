"""The records of paying before the bot asks (BRIDGE.md §Pay alongside and
prepay; the rules: :mod:`._funding`): one :class:`Payment` ahead of need, and
one call's :class:`Share` in the credit at the bot."""

from __future__ import annotations

import anyio

__all__ = ["Payment", "Share"]


class Payment:
    """One payment ahead of need (or a refused call's, :meth:`Funding.turn`):
    ``amount`` atoms; :meth:`wait` returns None once it is confirmed, else
    the reason nothing (certain) was paid."""

    __slots__ = (
        "_done",
        "_reason",
        "amount",
        "answered",
        "attached",
        "claimed",
        "counted",
        "included",
        "observed",
        "prepay",
    )

    def __init__(self, amount: int, *, prepay: bool, observed: int = 0) -> None:
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
        #: True once the call it was made alongside was answered or ended
        #: (a prepayment has no call): with :attr:`done`, its round is over.
        self.answered = prepay
        #: True once its credit was added to the known balance.
        self.counted = False
        #: The funding's receipt count when it started.
        self.observed = observed

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


class Share:
    """One call's part in the credit at the bot, from
    :meth:`Funding.alongside` to :meth:`Funding.done`: ``payment`` is the
    payment ahead of need its first send is marked with (its own, or a
    prepayment it waits for; None: unmarked), ``reserved`` the atoms of the
    known balance it counts on until its answer comes; ``blind``: sent
    unmarked while the balance is unknown, so it may be charged from any
    credit there, a payment's included, until its answer comes;
    ``trusting``: what it counts on is the balance known, not a payment it
    made (that balance may turn out to be less)."""

    __slots__ = ("blind", "payment", "price", "reserved", "trusting")

    def __init__(self, price: int, payment: Payment | None = None) -> None:
        self.price = price
        self.payment = payment
        self.reserved = 0
        self.blind = False
        self.trusting = False
