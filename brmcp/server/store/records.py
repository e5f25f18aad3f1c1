"""What every store backend shares: the records the harness reads back
(:class:`StatementEntry`, :class:`JournalEntry`, :class:`HeldTip`), the
errors (:class:`StoreError`, :class:`BalanceLimitError`), the bounds on
amounts and on the tip memory, and the ref of a received tip's movement.

Nothing here knows SQL: the SQLite operations (:mod:`._schema`,
:mod:`.ledger`, :mod:`.journal`, :mod:`.tips`) return these types, and
another backend returns the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...protocol.units import ATOMS_PER_DCR

__all__ = [
    "MAX_BALANCE_ATOMS",
    "MAX_INT63",
    "TIP_MEMORY",
    "BalanceLimitError",
    "CommitOutcomeUnknown",
    "HeldTip",
    "JournalEntry",
    "StatementEntry",
    "StoreError",
    "tip_ref",
]

#: How many processed tips are remembered for de-duplication.
TIP_MEMORY = 10_000
#: The largest balance the built-in ledger holds, in atoms: all the DCR there
#: will ever be (21 million DCR). A tip or operator credit that would push a
#: balance past it is refused (SECURITY.md "Money bounds"); refunds are not,
#: since they return atoms a charge took and refusing one would lose them.
MAX_BALANCE_ATOMS = 21_000_000 * ATOMS_PER_DCR
#: Sequence ids and amounts must fit a signed 64-bit SQLite integer.
MAX_INT63 = (1 << 63) - 1


class StoreError(Exception):
    """The database cannot be opened or used (corrupt, unreadable, newer
    schema). Start-up stops; nothing is reset silently."""


class CommitOutcomeUnknown(StoreError):
    """The connection failed after ``COMMIT`` was sent: the transaction may
    or may not be durable. Raised by the PostgreSQL executor for every
    operation of that transaction; the caller reads the database again
    (a fresh connection) before it answers, never guessing either way."""


class BalanceLimitError(ValueError):
    """A credit of ``atoms`` to ``peer``, whose balance is ``current`` atoms,
    would push the balance past :data:`MAX_BALANCE_ATOMS`; nothing was
    written."""

    def __init__(self, peer: str, current: int, atoms: int) -> None:
        super().__init__(
            f"credit of {atoms} atoms to {peer} refused: the balance of {current} atoms would pass "
            f"the maximum of {MAX_BALANCE_ATOMS} atoms"
        )
        self.peer = peer
        self.current = current
        self.atoms = atoms


@dataclass(frozen=True, slots=True)
class StatementEntry:
    """One money movement of a peer, oldest first.

    ``kind`` is ``tip``, ``credit``, ``charge``, ``refund`` (handler failed)
    or ``recovery_refund`` (refunded at start-up after a crash); ``atoms`` is
    signed (credits positive, charges negative); ``ts`` is unix seconds;
    ``balance_after`` is None when an external Billing store holds balances.
    """

    ts: float
    kind: str
    atoms: int
    call_key: str | None
    tip_seq: int | None
    balance_after: int | None


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A paid keyed call found completed in the journal at start-up.

    ``outcome`` is the CallToolResult JSON object when it was kept (its JSON
    is at most 64 KiB), else None.
    """

    peer: str
    call_key: str
    atoms: int
    expires: float
    outcome: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class HeldTip:
    """A tip held because its sender was not allowed when it arrived:
    ``atoms`` (``amount_matoms`` floored, > 0) wait to be credited to
    ``peer``; ``ts`` is when it was received (unix seconds)."""

    sequence_id: int
    peer: str
    amount_matoms: int
    atoms: int
    ts: float


def tip_ref(sequence_id: int, peer: str, amount_matoms: int) -> str:
    """The movement ref of a received tip, ``tip:<seq>:<peer>:<matoms>``,
    shared by its audit row and an external Billing credit (billing.py: a
    store applies a ref at most once), so a tip is never credited twice."""
    return f"tip:{sequence_id}:{peer}:{amount_matoms}"
