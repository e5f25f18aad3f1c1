"""What one logical call may pay, whatever the bot says (BRIDGE.md §The
payment flow, "The hard bound").

A bot is a stranger: its refusal is a request, never an order. For one
logical agent call (its reissues, credit polls, re-sent copies and an
agent's retry of the same call included) the bridge pays:

* nothing for a tool its listing shows as free (``brmcp/priceAtoms`` 0, or
  no price key at all), whatever the bot asks;
* nothing for a refusal that names another tool, or whose amounts
  contradict each other (a shortfall above the price it names);
* for a tool listed at a fixed price, at most that price: a refusal asking
  more is not paid, the listing is refreshed and the call ends with both
  prices named, so a new price applies only to a new call;
* for a dynamically priced tool (``brmcp/pricing: "dynamic"``, no price
  shown), what the per-call cap allows;
* in all: at most ``per_call_cap_atoms`` for the call, and at most one
  payment unless the user approves each further one (approval mode).

:class:`CallBudget` keeps the call's tally; :meth:`CallBudget.judge` turns a
refusal into an amount to pay or the reason nothing is paid. The caps, the
day total and approvals are then applied by :class:`~.settle.Settler`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

# The listing model and the judge live in the protocol layer: the
# directory's payer judges refusals the same way without importing the bridge.
from brmcp.protocol.listing import CallTally, Judgement, Listing, listing_of

if TYPE_CHECKING:
    from ._spend import InDoubtSpend

__all__ = ["CallBudget", "Judgement", "Listing", "listing_of"]


@dataclass(slots=True)
class CallBudget(CallTally):
    """A :class:`~brmcp.protocol.listing.CallTally` that also carries the
    bridge's payment in doubt for the call (``brmcp.bridge.pay`` settles it)."""

    #: Atoms of a payment in doubt this call counts as its own (0: none).
    in_doubt: int = 0
    #: That payment's spend entry, whose outcome the call waits for before
    #: it pays anything more (:meth:`brmcp.bridge.pay._settle.Settler.adopt`).
    doubt: InDoubtSpend | None = None
    #: The payment counted was confirmed just before the call: its credit
    #: may still be landing at the bot (the call polls for it).
    landing: bool = False

    def settle_doubt(self, status: str) -> None:
        """The payment in doubt this call counted was settled ``status``
        (``paid`` or ``failed``): no longer in doubt; a failed one is no
        longer counted either (nothing was paid for the call)."""
        if status != "paid" and self.payments:
            self.paid_atoms -= self.in_doubt
            self.payments -= 1
            self.last_atoms = 0
        self.in_doubt = 0
        self.doubt = None
