"""The pluggable balance store (the Go reference's ``Billing``: karamble/brmcp,
``server/harness.go``).

The harness keeps balances in its own SQLite database by default, where each
money movement and its journal row commit in one transaction. An operator
with their own accounting supplies a :class:`Billing` instead.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Billing", "InsufficientBalance"]


class InsufficientBalance(Exception):
    """A debit was refused because the balance cannot cover it."""

    def __init__(self, message: str = "insufficient balance") -> None:
        super().__init__(message)


@runtime_checkable
class Billing(Protocol):
    """Prepaid balances in atoms (1 DCR = 100,000,000 atoms).

    ``ref`` uniquely names each movement (``charge:<call id>``,
    ``refund:<call id>``, ``tip:<seq>:<peer>:<matoms>``, ...). A store must
    apply a given ``ref`` at most once and treat a repeat as a successful
    no-op; the harness relies on that to settle interrupted work exactly once
    after a crash, since the store and the harness's journal cannot share a
    transaction.
    """

    async def balance(self, peer: str) -> int:
        """Current balance of ``peer`` in atoms (0 when unknown)."""
        ...

    async def debit(self, peer: str, atoms: int, *, ref: str) -> None:
        """Subtract ``atoms`` (> 0); raise :class:`InsufficientBalance` when
        the balance is lower, changing nothing."""
        ...

    async def credit(self, peer: str, atoms: int, *, ref: str) -> None:
        """Add ``atoms`` (> 0)."""
        ...
