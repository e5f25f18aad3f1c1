"""What a :class:`~brmcp.testing.hostile.HostileBot` lists, keeps and records: its tools
(:class:`HostileTool`, priced as WIRE.md §Payments "Prices" shows them), its ledger in atoms
(:class:`HostileLedger`) and one :class:`HostileCall` per ``tools/call`` copy received. Kept apart from
the bot so the records carry no behaviour; :mod:`brmcp.testing.hostile` exports every name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mcp.types import CallToolResult, Tool

from ..protocol.payment import PRICE_ATOMS_KEY, PRICING_DYNAMIC, PRICING_KEY

__all__ = ["HostileCall", "HostileLedger", "HostileTool", "Listing"]

#: How a tool's price is shown in ``tools/list`` (WIRE.md §Payments, "Prices"):
#: ``fixed`` carries ``brmcp/priceAtoms``, ``dynamic`` carries
#: ``brmcp/pricing: "dynamic"``, ``unpriced`` neither (shown as free).
Listing = Literal["fixed", "dynamic", "unpriced"]


class HostileLedger:
    """Balances in atoms per caller uid; ``opening`` balances are not counted in :attr:`credited`. Amounts
    must be ints (ValueError)."""

    def __init__(self, opening: Mapping[str, int] | None = None) -> None:
        self._balances: dict[str, int] = dict(opening or {})
        #: Atoms credited (tips, :meth:`credit`) and debited since the start.
        self.credited = 0
        self.charged = 0
        #: Every movement, oldest first: ``(kind, peer, atoms)``, kind "credit" or "debit".
        self.entries: list[tuple[str, str, int]] = []

    def balance(self, peer: str) -> int:
        """The balance of ``peer`` (0 for a caller never seen)."""
        return self._balances.get(peer, 0)

    def credit(self, peer: str, atoms: int) -> None:
        """Add ``atoms`` (> 0) to ``peer``'s balance."""
        if isinstance(atoms, bool) or not isinstance(atoms, int) or atoms <= 0:
            raise ValueError(f"credit needs a positive number of atoms, got {atoms!r}")
        self._balances[peer] = self.balance(peer) + atoms
        self.credited += atoms
        self.entries.append(("credit", peer, atoms))

    def debit(self, peer: str, atoms: int) -> bool:
        """Take ``atoms`` (≥ 0) from ``peer``; False, changing nothing, when short."""
        if isinstance(atoms, bool) or not isinstance(atoms, int) or atoms < 0:
            raise ValueError(f"debit needs a number of atoms >= 0, got {atoms!r}")
        if self.balance(peer) < atoms:
            return False
        if atoms:
            self._balances[peer] -= atoms
            self.charged += atoms
            self.entries.append(("debit", peer, atoms))
        return True


@dataclass(frozen=True, slots=True)
class HostileTool:
    """A listed tool: an honest call of it is charged ``price_atoms`` (≥ 0); ``listing`` says how that
    price is shown (:data:`Listing`; ``unpriced`` with a price > 0 is a bot charging for a tool it shows
    as free)."""

    name: str
    price_atoms: int = 0
    listing: Listing = "fixed"
    description: str = "a hostile tool"
    input_schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})

    def to_tool(self) -> Tool:
        """The ``tools/list`` entry, its ``_meta`` carrying the price keys."""
        meta: dict[str, Any] | None = None
        if self.listing == "fixed":
            meta = {PRICE_ATOMS_KEY: self.price_atoms}
        elif self.listing == "dynamic":
            meta = {PRICING_KEY: PRICING_DYNAMIC}
        schema = dict(self.input_schema)
        return Tool(name=self.name, description=self.description, input_schema=schema, _meta=meta)


@dataclass(slots=True)
class HostileCall:
    """One ``tools/call`` copy received. ``attempt``: its number among the copies of its callKey (1 for
    every unkeyed call); ``pay_alongside``: its ``brmcp/payAlongside`` mark in atoms (0: none);
    ``balance``: the caller's balance on arrival; ``behaviour``: who answered; ``outcome``:
    ``"answered"``, ``"refused"`` (a ``payment_required``-shaped error), ``"wrong-id"``, or no answer:
    ``"hung"``, ``"offline"``; ``answer``: the result sent, if any."""

    seq: int
    peer: str
    tool: str
    arguments: dict[str, Any]
    call_key: str | None
    pay_alongside: int
    attempt: int
    balance: int
    behaviour: str = ""
    outcome: str = "pending"
    answer: CallToolResult | None = None
