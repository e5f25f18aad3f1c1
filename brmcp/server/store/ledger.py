"""The built-in prepaid ledger -- balances in atoms, the append-only
``movements`` audit rows, operator credits, the debit of a charge and a
peer's statement.

Every operation is a plain function of a connection (:mod:`._conn`: SQLite
or PostgreSQL, the same SQL), run inside the one transaction the backend's
executor opens for it (:class:`~.._executor.GroupCommitExecutor`,
:class:`~.postgres.executor.PostgresExecutor`), so a
money movement, its audit row and (for a charge) its journal row
(:mod:`.journal`) always commit together.
"""

from __future__ import annotations

from ._conn import Connection
from .records import MAX_BALANCE_ATOMS, BalanceLimitError, StatementEntry

__all__ = ["add_balance", "balance", "credit", "debit", "record_movement", "statement"]


def balance(conn: Connection, peer: str) -> int:
    """The built-in balance of ``peer`` in atoms (0 for a peer never credited)."""
    row = conn.execute("SELECT atoms FROM balances WHERE peer = ?", (peer,)).fetchone()
    return int(row[0]) if row else 0


def add_balance(conn: Connection, peer: str, delta: int) -> int:
    """Add ``delta`` atoms (negative: take them) to ``peer``'s balance and
    return the new balance. No audit row: the caller records the movement in
    the same transaction. An overdraft raises the driver's integrity error
    (:class:`sqlite3.IntegrityError`, ``psycopg.IntegrityError``: the
    ``CHECK (atoms >= 0)`` constraint); the bound of
    :data:`~.records.MAX_BALANCE_ATOMS` is the caller's to check."""
    if delta >= 0:
        conn.execute(
            "INSERT INTO balances (peer, atoms) VALUES (?, ?) "
            "ON CONFLICT (peer) DO UPDATE SET atoms = balances.atoms + excluded.atoms",
            (peer, delta),
        )
    else:
        # The CHECK (atoms >= 0) constraint makes an overdraft fail loudly.
        conn.execute("UPDATE balances SET atoms = atoms + ? WHERE peer = ?", (delta, peer))
    return balance(conn, peer)


def record_movement(
    conn: Connection,
    *,
    ts: float,
    peer: str,
    kind: str,
    atoms: int,
    ref: str,
    call_key: str | None = None,
    tip_seq: int | None = None,
    balance_after: int | None = None,
    tool: str | None = None,
) -> None:
    """Append one audit row: ``kind`` (see :class:`~.records.StatementEntry`),
    signed ``atoms``, ``ts`` in unix seconds. ``ref`` is unique in
    ``movements``: recording a ref twice raises
    the driver's integrity error (:class:`sqlite3.IntegrityError`,
    ``psycopg.IntegrityError``), which is how a movement is applied at
    most once."""
    conn.execute(
        "INSERT INTO movements (ts, peer, kind, atoms, call_key, tip_seq, ref, balance_after, tool) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (ts, peer, kind, atoms, call_key, tip_seq, ref, balance_after, tool),
    )


def credit(conn: Connection, peer: str, atoms: int, *, ts: float, kind: str, ref: str) -> int:
    """Add ``atoms`` (> 0) to ``peer`` and audit it; returns the new balance.
    Raises :class:`BalanceLimitError` (nothing written) when the balance would
    pass :data:`MAX_BALANCE_ATOMS`."""
    current = balance(conn, peer)
    if current + atoms > MAX_BALANCE_ATOMS:
        raise BalanceLimitError(peer, current, atoms)
    after = add_balance(conn, peer, atoms)
    record_movement(conn, ts=ts, peer=peer, kind=kind, atoms=atoms, ref=ref, balance_after=after)
    return after


def debit(
    conn: Connection,
    *,
    peer: str,
    atoms: int,
    ts: float,
    ref: str,
    call_key: str | None,
    tool: str,
) -> tuple[bool, int]:
    """Take ``atoms`` (the price of a call to ``tool``) from ``peer`` and
    audit it as a ``charge`` movement under ``ref``.

    Returns ``(True, balance_after)``, or ``(False, balance)`` when the
    balance cannot cover the price (nothing written). The journal row of
    the call is the caller's (:func:`.journal.charge`), in this transaction.
    """
    current = balance(conn, peer)
    if current < atoms:
        return False, current
    after = add_balance(conn, peer, -atoms)
    record_movement(
        conn,
        ts=ts,
        peer=peer,
        kind="charge",
        atoms=-atoms,
        ref=ref,
        call_key=call_key,
        balance_after=after,
        tool=tool,
    )
    return True, after


def statement(conn: Connection, peer: str) -> list[StatementEntry]:
    """Every movement of ``peer``, oldest first (the audit table in id order)."""
    rows = conn.execute(
        "SELECT ts, kind, atoms, call_key, tip_seq, balance_after FROM movements WHERE peer = ? ORDER BY id",
        (peer,),
    ).fetchall()
    return [
        StatementEntry(float(r[0]), str(r[1]), int(r[2]), r[3], None if r[4] is None else int(r[4]), r[5])
        for r in rows
    ]
