"""A tool's listing and the judge of a payment refusal against it: what one
logical call may pay, whatever the bot says (BRIDGE.md §The payment flow,
"The hard bound"; WIRE.md §Payments).

A bot is a stranger: its refusal is a request, never an order. For one
logical call the payer pays:

* nothing for a tool its listing shows as free (``brmcp/priceAtoms`` 0, or
  no price key at all), whatever the bot asks;
* nothing for a refusal that names another tool, or whose amounts
  contradict each other (a shortfall above the price it names);
* for a tool listed at a fixed price, at most that price;
* for a dynamically priced tool (``brmcp/pricing: "dynamic"``, no price
  shown), what the per-call cap allows;
* at most one payment unless each further one is allowed by the caller.

Both payers use it: the bridge's (``brmcp.bridge.pay.CallBudget`` adds the
bridge's payments in doubt) and the directory's, so it lives in the
protocol layer and imports nothing above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .payment import PRICE_ATOMS_KEY, PRICING_DYNAMIC, PRICING_KEY, PaymentRequired

__all__ = ["CallTally", "Judgement", "Listing", "ListingKind", "listing_of"]

ListingKind = Literal["free", "fixed", "dynamic"]


@dataclass(frozen=True, slots=True)
class Listing:
    """What the agent was shown for one tool in ``tools/list``: ``kind`` is
    ``"free"``, ``"fixed"`` (``price_atoms`` > 0 atoms) or ``"dynamic"``
    (no price shown; ``price_atoms`` is 0)."""

    kind: ListingKind
    price_atoms: int = 0

    def describe(self) -> str:
        """``"listed at 10 atoms"``, ``"listed as free"`` or ``"listed with a dynamic price"``."""
        if self.kind == "fixed":
            return f"listed at {self.price_atoms} atoms"
        if self.kind == "dynamic":
            return "listed with a dynamic price"
        return "listed as free"


def listing_of(tool: Any) -> Listing:
    """The :class:`Listing` of a snapshot tool (an ``mcp.types.Tool`` or
    None). Its ``_meta`` ``brmcp/priceAtoms`` (a whole JSON number; Go
    writes floats) > 0 is a fixed price, 0 is free; ``brmcp/pricing:
    "dynamic"`` without a price is dynamic; a tool with neither key, an
    unusable value or no tool at all is free (WIRE.md §Payments, "Prices in
    tools/list")."""
    meta = getattr(tool, "meta", None)
    if not isinstance(meta, dict):
        return Listing("free")
    value = meta.get(PRICE_ATOMS_KEY)
    if not isinstance(value, bool) and isinstance(value, int | float):
        if isinstance(value, float) and not value.is_integer():
            return Listing("free")
        price = int(value)
        return Listing("fixed", price) if price > 0 else Listing("free")
    if meta.get(PRICING_KEY) == PRICING_DYNAMIC:
        return Listing("dynamic")
    return Listing("free")


@dataclass(frozen=True, slots=True)
class Judgement:
    """The verdict on one refusal: pay ``amount`` atoms (``decline`` None),
    or nothing with the reason ``decline`` (shown to the agent after
    ``<name>: payment not made: ``). ``contradicts_listing``: the bot asked
    more than the price it listed (the listing is refreshed and the bot gets
    no payment alongside until it agrees again). ``further``: a payment
    after one already made for this call, which only the user's approval
    can allow; ``over_cap``: declined only because such a payment would
    pass the per-call cap."""

    amount: int = 0
    decline: str | None = None
    contradicts_listing: bool = False
    further: bool = False
    #: The decline is only that a further payment would pass the per-call cap.
    over_cap: bool = False


@dataclass(slots=True)
class CallTally:
    """The money of one logical call: the ``listing`` shown when the call
    began, and ``paid_atoms`` over ``payments`` payments made for it so far
    (alongside, after refusals, or carried over from an earlier copy of the
    same call)."""

    listing: Listing
    paid_atoms: int = 0
    payments: int = 0
    #: The atoms of the last payment counted (0 before any).
    last_atoms: int = 0

    def add(self, atoms: int) -> None:
        """Count a confirmed (or possibly landed) payment of ``atoms`` for this call."""
        self.paid_atoms += atoms
        self.payments += 1
        self.last_atoms = atoms

    def judge(self, tool: str, refusal: PaymentRequired, per_call_cap: int) -> Judgement:
        """What to pay for ``refusal`` to a call of ``tool`` with
        ``per_call_cap`` atoms the most for the whole call (≤ 0: never
        pay). The amount asked is ``shortfallAtoms`` when > 0, else
        ``priceAtoms`` (WIRE.md §Payments, "Paying and retrying")."""
        asked = refusal.shortfall_atoms if refusal.shortfall_atoms > 0 else refusal.price_atoms
        if refusal.tool != tool:
            return Judgement(
                decline=f'the bot asked {asked} atoms for tool "{refusal.tool}", not for "{tool}" '
                f"({self.listing.describe()}); a refusal naming another tool is never paid"
            )
        if self.listing.kind == "free":
            return Judgement(
                decline=f"{tool} is listed as free, but the bot asked for {asked} atoms; "
                "a free tool is never paid for"
            )
        if asked <= 0:
            return Judgement(decline="bot requested a nonpositive amount")
        if refusal.shortfall_atoms > refusal.price_atoms:
            return Judgement(
                decline=f"the bot's refusal is inconsistent (a shortfall of {refusal.shortfall_atoms} atoms "
                f"on a price of {refusal.price_atoms} atoms)"
            )
        listed = self.listing.price_atoms
        if self.listing.kind == "fixed" and (refusal.price_atoms > listed or asked > listed):
            return Judgement(
                decline=f"the bot asks {max(asked, refusal.price_atoms)} atoms for {tool}, but it was listed "
                f"at {listed} atoms when this call was made",
                contradicts_listing=True,
            )
        if self.payments and per_call_cap > 0 and self.paid_atoms + asked > per_call_cap:
            return Judgement(
                decline=f"{asked} atoms would exceed the per-call cap ({per_call_cap}) with "
                f"{self.paid_atoms} atoms already paid for this call",
                further=True,
                over_cap=True,
            )
        return Judgement(amount=asked, further=self.payments > 0)
