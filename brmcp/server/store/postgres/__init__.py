"""The PostgreSQL backend of the store: several harness processes, on one
machine or several, sharing one database as one book.

* :mod:`.driver` -- psycopg 3, imported only when this backend is used;
* :mod:`.schema` -- the tables (SQLite's, in PostgreSQL types) and their
  creation under an advisory lock;
* :mod:`.connection` -- the adapter running the store's shared SQL
  (:mod:`..ledger`, :mod:`..journal`, :mod:`..tips`, written once with
  ``?`` placeholders) and the SQLSTATEs that mean "run it again";
* :mod:`.executor` -- :class:`PostgresExecutor`, group commit on a worker
  thread, with retries;
* :mod:`.paidcalls` -- the charge and the completion of a paid call on a
  shared book, one statement each on their common path, run ``READ
  COMMITTED``.

Isolation: every transaction is ``SERIALIZABLE``, except the paid-call
path's (:mod:`.paidcalls`). The store's operations are read-then-write
(read a balance, check the price or the 21-million-DCR bound, then update
it; look a tip up in the seen-set and the audit rows, then record it; read
a call's state, then settle it). On SQLite they are correct because
``BEGIN IMMEDIATE`` runs one writer at a time. Under PostgreSQL's
serializable snapshot isolation every committed transaction behaves as if
it ran alone, so the same functions keep the same guarantees with
processes interleaving: two charges against one balance cannot both see
the atoms only one of them may take, two deliveries of one tip cannot both
find it unseen, two start-ups cannot both refund one interrupted call
(:func:`..journal.recover_call` rereads the call's state). The price of
serializable isolation is false conflicts: its predicate locks cover whole
index and heap pages, and the book's hot tables are small, so processes
charging different callers with different callKeys were rolled back as if
they had touched the same rows (about one paid-call transaction in ten
with four processes). The paid-call path, every paid call's two
transactions, is therefore written so that each decision is taken by the
statement that writes, on rows it locks (``UPDATE ... WHERE atoms >=
price RETURNING``, ``INSERT ... ON CONFLICT DO NOTHING``, ``UPDATE calls
... WHERE state IN ('charging', 'charged')``), which is exactly as safe
under ``READ COMMITTED`` and conflicts only on the same balance or the
same callKey (the argument: :mod:`.paidcalls`). The rarer operations
(credits, tips, held tips, recovery, leases) keep the shared SQL and
``SERIALIZABLE``; ``READ COMMITTED`` for them would need a lock on every
row read, including rows that do not exist yet (an unseen tip, a first
credit), i.e. different SQL per backend.

The price is the retry: PostgreSQL aborts one of two conflicting
transactions with ``40001`` (``40P01`` for a deadlock; ``55P03`` when a
row lock is waited for past the executor's lock timeout), and
:class:`PostgresExecutor` rolls the whole batch back and runs every
operation again (after a first conflict, each in its own transaction).
A rerun never double-applies because nothing of the aborted attempt is
durable, and as a second guard every movement has a
unique ref (``movements.ref``: ``charge:<call id>``, ``refund:<call id>``,
``tip:<seq>:<peer>:<matoms>``), every tip a unique key and every call a
unique id and (peer, callKey): a movement repeated after a commit whose
outcome was lost fails on the constraint instead of applying twice.
"""

from __future__ import annotations

from .driver import INSTALL_HINT, is_driver_error
from .executor import PostgresExecutor

__all__ = ["INSTALL_HINT", "PostgresExecutor", "is_driver_error"]
