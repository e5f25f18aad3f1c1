"""PostgreSQL: the two transactions of a paid call on a shared book -- the
charge (callKey claim, debit, audit row, journal row) and the completion
(journal row settled, a failed call's refund) -- written so that each is
one statement on its common path and correct under ``READ COMMITTED``.

Why not ``SERIALIZABLE`` like the other operations (:mod:`..postgres`):
serializable snapshot isolation tracks what a transaction read with
predicate locks, and a B-tree index scan locks the whole leaf *page* it
read, not the key; a transaction holding more than two tuple locks on one
heap page has them promoted to a page lock. The book's hot tables are
small and shared (``balances`` is one page for a few dozen callers;
``calls_pkey`` is keyed by random call ids), so two processes charging
disjoint callers with disjoint callKeys still read and write the same
pages, and PostgreSQL aborts one of them (``40001``) as if they had
conflicted. Measured with four processes of eight callers each, about one
transaction in ten was rolled back and run again. Indexes do not help
(every hot statement already uses an index scan; the conflicts are
page-granular by design), and the retries also cost the round trips of a
second attempt.

Why ``READ COMMITTED`` is as safe here: every decision these functions
take is made by the statement that writes, on rows that statement locks
until the transaction ends, so no other transaction (of any isolation
level) can change what the decision was based on before it commits:

* the debit is ``UPDATE balances SET atoms = atoms - price WHERE peer = ?
  AND atoms >= price``: PostgreSQL locks the row, and when a concurrent
  transaction changed it first, waits for it and evaluates the condition
  again on the row as committed. Two debits of one balance therefore
  serialise on the row lock and neither can take atoms the other took;
  ``balance_after`` is returned by that same statement (``RETURNING``), so
  the audit row's running balance is exact, and the ``movements`` id is
  drawn after the row lock is taken, so a peer's audit rows stay in balance
  order;
* the callKey claim is ``INSERT INTO calls ... ON CONFLICT (peer,
  call_key) DO NOTHING``: the unique index decides. Of two claims of one
  (peer, callKey) the second waits for the first's transaction and then
  inserts nothing (or, when the first rolled back, inserts); the debit is
  taken only when the claim inserted (one statement: ``EXISTS (SELECT 1
  FROM claim)``), so a key is charged once across processes. When nothing
  was inserted the holding row is read (:func:`..journal.key_holder`; a
  fresh statement, so it sees the claim that won) and answered, or, when
  it is a completed row whose replay window ended, deleted under its own
  condition (``state = 'done' AND expires <= now``, re-checked on the row
  as committed) and the claim is made again;
* the completion claims the journal row first: ``UPDATE calls SET state =
  'done' ... WHERE call_id = ? AND state IN ('charging', 'charged')`` (or
  ``DELETE ... RETURNING`` for an unkeyed call). Against a sibling's
  recovery of the same call (:func:`..journal.recover_call`, which runs
  ``SERIALIZABLE`` and also writes that row) exactly one of them settles
  it: when the recovery committed first, this statement re-checks the
  state, finds ``done`` and changes nothing (no refund); when this one
  committed first, the recovery's write of the row fails with ``40001`` and
  its rerun finds the call settled. A refund is then credited by the
  statement that locks the balance row and reads the balance it leaves;
  its audit row has the unique ref ``refund:<call id>``.

Mixing isolation levels keeps the other operations' guarantees: a
``SERIALIZABLE`` transaction that reads a balance or a journal row and
then writes it (a tip, an operator credit, a recovery) fails with
``40001`` when a committed ``READ COMMITTED`` transaction changed that row
after its snapshot (first updater wins, whatever the other's level), and
the serializable operations that read a row and write *another* one
(:func:`..journal.drop_lease` reading ``calls``) read nothing these
functions decide on, so they are ordered as if they ran before them.

What remains a conflict is real contention: two processes debiting one
peer at the same instant wait for each other's row lock (locks taken in
opposite orders -- by two batches, or by a refunding completion, which
locks the call's row and then the balance, and a sibling's recovery of
that call, which locks them the other way round -- are a deadlock or a
lock wait past the executor's ``lock_timeout``, rolled back and run again
like a serialization failure; the rerun finds the call settled).

Both functions run wrapped in :class:`.connection.RowLocked`, which tells
:class:`.executor.PostgresExecutor` to give them a ``READ COMMITTED``
transaction. They are for a shared book on the built-in ledger
(``calls.owner`` exists only there); SQLite keeps
:func:`..journal.charge` and :func:`..journal.complete`.
"""

from __future__ import annotations

from collections.abc import Callable

from .._conn import Connection
from ..journal import KeyHolder, gc_calls, key_holder
from ..ledger import balance, record_movement

__all__ = ["CLAIM_ATTEMPTS", "charge", "complete"]

#: Claims of one callKey made in one charge before it is answered as held
#: (each failed claim found an expired row and deleted it).
CLAIM_ATTEMPTS = 3

_IN_FLIGHT = "state IN ('charging', 'charged')"

#: Claim the key, debit when claimed, audit the debit: one statement.
#: Yields (claimed 0/1, balance after the debit or NULL when not debited).
_CHARGE = (
    "WITH claim AS ("
    "INSERT INTO calls (call_id, peer, call_key, tool, atoms, state, charged_at, owner) "
    "VALUES (?, ?, ?, ?, ?, 'charged', ?, ?) "
    "ON CONFLICT (peer, call_key) WHERE call_key IS NOT NULL DO NOTHING RETURNING call_id), "
    "debit AS ("
    "UPDATE balances SET atoms = atoms - ? WHERE peer = ? AND atoms >= ? AND EXISTS (SELECT 1 FROM claim) "
    "RETURNING atoms), "
    "audit AS ("
    "INSERT INTO movements (ts, peer, kind, atoms, call_key, ref, balance_after, tool) "
    "SELECT ?, ?, 'charge', ?, ?, ?, atoms, ? FROM debit RETURNING balance_after) "
    "SELECT (SELECT count(*) FROM claim), (SELECT balance_after FROM audit)"
)

#: Credit a refund and audit it: one statement, yielding the balance after.
_REFUND = (
    "WITH credit AS ("
    "INSERT INTO balances (peer, atoms) VALUES (?, ?) "
    "ON CONFLICT (peer) DO UPDATE SET atoms = balances.atoms + excluded.atoms RETURNING atoms) "
    "INSERT INTO movements (ts, peer, kind, atoms, call_key, ref, balance_after, tool) "
    "SELECT ?, ?, 'refund', ?, ?, ?, atoms, ? FROM credit RETURNING balance_after"
)


def charge(
    conn: Connection,
    *,
    call_id: str,
    peer: str,
    call_key: str | None,
    tool: str,
    atoms: int,
    ts: float,
    owner: str | None,
    gc: bool = False,
) -> tuple[bool, int] | KeyHolder:
    """Claim ``(peer, call_key)`` (keyed calls), debit ``atoms`` and journal
    the call as charged by ``owner``, atomically; ``ts`` (unix seconds) is
    also the time the replay windows are judged by. ``gc``: first delete
    completed rows whose replay window ended (:func:`..journal.gc_calls`).

    Returns ``(True, balance_after)``; ``(False, balance)`` when the balance
    cannot cover the price (nothing written); or the :class:`KeyHolder`
    holding the key (running, or completed inside its replay window;
    nothing written). Raises the driver's error on a failure (an
    ``IntegrityError`` for a call id used twice)."""
    if gc:
        gc_calls(conn, ts)
    for _ in range(CLAIM_ATTEMPTS):
        claimed, after = conn.execute(
            _CHARGE,
            (
                *(call_id, peer, call_key, tool, atoms, ts, owner),
                *(atoms, peer, atoms),
                *(ts, peer, -atoms, call_key, f"charge:{call_id}", tool),
            ),
        ).fetchone()
        if claimed:
            if after is not None:
                return True, int(after)
            conn.execute("DELETE FROM calls WHERE call_id = ?", (call_id,))
            return False, balance(conn, peer)
        if call_key is None:  # only the (peer, call_key) index is a conflict target
            break
        held = key_holder(conn, peer=peer, call_key=call_key, now=ts)
        if held is not None:
            return held
        conn.execute(
            "DELETE FROM calls WHERE peer = ? AND call_key = ? AND state = 'done' "
            "AND (expires IS NULL OR expires <= ?)",
            (peer, call_key, ts),
        )
    # Claimed and released by others faster than this could claim it: the
    # caller waits for the holder as for a running one, then retries.
    return KeyHolder("running", None, None)


def complete(
    conn: Connection,
    *,
    call_id: str,
    keyed: bool,
    ts: float,
    expires: float,
    outcome_json: str | Callable[[int | None], str | None] | None,
    refund: tuple[str, int, bool] | None = None,
    balance_after: int | None = None,
) -> int | None:
    """:func:`..journal.complete` with ``shared`` True: settle a charged
    call (keyed: keep it for replay until ``expires``; unkeyed: forget it),
    crediting ``refund=(peer, atoms, local)`` back in the same transaction.
    A call no longer in flight (a sibling's recovery settled it) changes
    nothing and returns None.

    Returns the balance after the refund in atoms (the built-in ledger's
    when ``local``, else ``balance_after``), None when nothing was
    refunded. ``outcome_json`` may be a function of that balance, called
    inside this transaction."""
    if refund is None:
        kept = outcome_json(None) if callable(outcome_json) else outcome_json
        if keyed:
            conn.execute(
                "UPDATE calls SET state = 'done', completed_at = ?, expires = ?, kept = ?, outcome = ? "
                f"WHERE call_id = ? AND {_IN_FLIGHT}",
                (ts, expires, 1 if kept is not None else 0, kept, call_id),
            )
        else:
            conn.execute(f"DELETE FROM calls WHERE call_id = ? AND {_IN_FLIGHT}", (call_id,))
        return None
    peer, atoms, local = refund
    if keyed:
        row = conn.execute(
            "UPDATE calls SET state = 'done', completed_at = ?, expires = ? "
            f"WHERE call_id = ? AND {_IN_FLIGHT} RETURNING call_key, tool",
            (ts, expires, call_id),
        ).fetchone()
    else:
        row = conn.execute(
            f"DELETE FROM calls WHERE call_id = ? AND {_IN_FLIGHT} RETURNING call_key, tool", (call_id,)
        ).fetchone()
    if row is None:
        return None
    call_key, tool = row
    ref = f"refund:{call_id}"
    known: int | None
    if local:
        after = conn.execute(_REFUND, (peer, atoms, ts, peer, atoms, call_key, ref, tool)).fetchone()
        known = int(after[0])
    else:
        record_movement(
            conn, ts=ts, peer=peer, kind="refund", atoms=atoms, ref=ref, call_key=call_key, tool=tool
        )
        known = balance_after
    if keyed:
        kept = outcome_json(known) if callable(outcome_json) else outcome_json
        conn.execute(
            "UPDATE calls SET kept = ?, outcome = ? WHERE call_id = ?",
            (1 if kept is not None else 0, kept, call_id),
        )
    return known
