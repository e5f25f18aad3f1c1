"""The harness's durable state: balances, the paid-call journal and
received tips, one transaction per money movement.

* :mod:`.records` -- what every backend shares: the records read back
  (:class:`StatementEntry`, :class:`JournalEntry`, :class:`HeldTip`), the
  errors, the bounds (:data:`MAX_BALANCE_ATOMS`, :data:`MAX_INT63`,
  :data:`TIP_MEMORY`) and a tip's movement ref (:func:`tip_ref`);
* the operations, shared by both backends (one SQL text, :mod:`._conn`):
  :mod:`.ledger` (balances, movements, credits, debits, statements),
  :mod:`.journal` (the paid-call journal) and :mod:`.tips` (tip
  de-duplication and held tips);
* the SQLite backend, one database in the data directory: :mod:`._schema`
  (the file, its tables and migrations: :func:`open_database`);
* the PostgreSQL backend, one database several processes share:
  :mod:`.postgres` (psycopg 3, imported only when used);
* :mod:`.url` -- the ``store`` URL selecting the backend.

Every operation is a plain function of a connection executed by the
backend's executor (:class:`~.._executor.GroupCommitExecutor`,
:class:`~.postgres.PostgresExecutor`), so money movements and their
journal rows always commit together. Every name is importable from here
(``from brmcp.server.store import open_database``), as from the single
module this package replaces.
"""

from __future__ import annotations

from ._schema import DB_FILENAME, SCHEMA_VERSION, open_database
from .journal import (
    charge,
    complete,
    completed_keyed,
    drop_call,
    gc_calls,
    interrupted,
    journal_charge,
    recover_call,
)
from .ledger import add_balance, balance, credit, debit, record_movement, statement
from .records import (
    MAX_BALANCE_ATOMS,
    MAX_INT63,
    TIP_MEMORY,
    BalanceLimitError,
    CommitOutcomeUnknown,
    HeldTip,
    JournalEntry,
    StatementEntry,
    StoreError,
    tip_ref,
)
from .tips import (
    finish_tip,
    has_tips,
    held_peers,
    held_tips,
    pending_tips,
    record_tip,
    release_held_tip,
    tip_seen,
)

__all__ = [
    "DB_FILENAME",
    "MAX_BALANCE_ATOMS",
    "MAX_INT63",
    "SCHEMA_VERSION",
    "TIP_MEMORY",
    "BalanceLimitError",
    "CommitOutcomeUnknown",
    "HeldTip",
    "JournalEntry",
    "StatementEntry",
    "StoreError",
    "add_balance",
    "balance",
    "charge",
    "complete",
    "completed_keyed",
    "credit",
    "debit",
    "drop_call",
    "finish_tip",
    "gc_calls",
    "has_tips",
    "held_peers",
    "held_tips",
    "interrupted",
    "journal_charge",
    "open_database",
    "pending_tips",
    "record_movement",
    "record_tip",
    "recover_call",
    "release_held_tip",
    "statement",
    "tip_ref",
    "tip_seen",
]
