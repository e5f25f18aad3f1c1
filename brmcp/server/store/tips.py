"""Received tips (both backends) (``tips``, ``held_tips``; WIRE.md §Payments).

A tip is processed once, keyed by (sequence id, sender, amount): its
``tips`` row and its credit (or, for a sender not allowed, its
``held_tips`` row) are written in one transaction, and a redelivery changes
nothing. The seen-set keeps the newest :data:`~.records.TIP_MEMORY` tips;
an older tip is still recognised by its audit row or its held row. With an
external Billing store a credited tip stays ``pending`` until the store's
credit is done (:func:`finish_tip`; :func:`pending_tips` after a crash).
"""

from __future__ import annotations

from ._conn import Connection
from .ledger import add_balance, balance, record_movement
from .records import MAX_BALANCE_ATOMS, TIP_MEMORY, BalanceLimitError, HeldTip, tip_ref

__all__ = [
    "finish_tip",
    "has_tips",
    "held_peers",
    "held_tips",
    "pending_tips",
    "record_tip",
    "release_held_tip",
    "tip_seen",
]


def tip_seen(conn: Connection, sequence_id: int, peer: str, amount_matoms: int) -> str | None:
    """The state of the tip's ``tips`` row (``pending`` or ``done``), or
    None when the seen-set does not hold it."""
    row = conn.execute(
        "SELECT state FROM tips WHERE sequence_id = ? AND peer = ? AND amount_matoms = ?",
        (sequence_id, peer, amount_matoms),
    ).fetchone()
    return str(row[0]) if row else None


def record_tip(
    conn: Connection,
    *,
    sequence_id: int,
    peer: str,
    amount_matoms: int,
    atoms: int,
    credit_it: bool,
    ts: float,
    local: bool,
) -> tuple[bool, int]:
    """Process a received tip once. Returns ``(new, atoms_credited)``.

    ``new`` False means the tip was already processed (a redelivery): nothing
    changes. The seen-set keeps the newest :data:`TIP_MEMORY` tips; a
    credited tip older than that is still recognised by its audit row, a
    held one by its ``held_tips`` row.
    Otherwise the tip is remembered and, when ``credit_it``, its atoms are
    credited in the same transaction (``local``: built-in ledger; otherwise
    the row stays ``pending`` until the external credit is done). A tip of
    at least one atom that is not credited because of ``credit_it`` False
    (its sender is not allowed) is held: a ``held_tips`` row with its atoms,
    in the same transaction (:func:`release_held_tip` credits it later).
    """
    if tip_seen(conn, sequence_id, peer, amount_matoms) is not None:
        return False, 0
    ref = tip_ref(sequence_id, peer, amount_matoms)
    if conn.execute("SELECT 1 FROM movements WHERE ref = ?", (ref,)).fetchone() is not None:
        # Credited long ago and since dropped from the bounded seen-set: the
        # append-only audit row still proves it (never credit a tip twice).
        return False, 0
    if _held_row(conn, sequence_id, peer, amount_matoms):
        return False, 0  # held, and dropped from the seen-set since
    credited = atoms if credit_it and atoms > 0 else 0
    if credited and local and balance(conn, peer) + credited > MAX_BALANCE_ATOMS:
        credited = 0  # refused: recorded as seen, nothing credited (the caller logs it)
    state = "done" if local or credited == 0 else "pending"
    conn.execute(
        "INSERT INTO tips (sequence_id, peer, amount_matoms, atoms, credited, state, ts) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (sequence_id, peer, amount_matoms, atoms, credited, state, ts),
    )
    if credited and local:
        after = add_balance(conn, peer, credited)
        record_movement(
            conn,
            ts=ts,
            peer=peer,
            kind="tip",
            atoms=credited,
            ref=ref,
            tip_seq=sequence_id,
            balance_after=after,
        )
    if not credit_it and atoms > 0:
        conn.execute(
            "INSERT INTO held_tips (sequence_id, peer, amount_matoms, atoms, ts) VALUES (?, ?, ?, ?, ?)",
            (sequence_id, peer, amount_matoms, atoms, ts),
        )
    conn.execute(
        "DELETE FROM tips WHERE n <= (SELECT MAX(n) FROM tips) - ? AND state = 'done'", (TIP_MEMORY,)
    )
    return True, credited


def _held_row(conn: Connection, sequence_id: int, peer: str, amount_matoms: int) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM held_tips WHERE sequence_id = ? AND peer = ? AND amount_matoms = ?",
            (sequence_id, peer, amount_matoms),
        ).fetchone()
        is not None
    )


def held_tips(conn: Connection, peer: str | None = None) -> list[HeldTip]:
    """The tips held now (of ``peer``, or of everyone), oldest first."""
    sql = "SELECT sequence_id, peer, amount_matoms, atoms, ts FROM held_tips"
    args: tuple[str, ...] = ()
    if peer is not None:
        sql += " WHERE peer = ?"
        args = (peer,)
    rows = conn.execute(sql + " ORDER BY ts, sequence_id", args).fetchall()
    return [HeldTip(int(r[0]), str(r[1]), int(r[2]), int(r[3]), float(r[4])) for r in rows]


def held_peers(conn: Connection) -> list[str]:
    """The senders with at least one held tip."""
    return [str(r[0]) for r in conn.execute("SELECT DISTINCT peer FROM held_tips ORDER BY peer")]


def release_held_tip(conn: Connection, tip: HeldTip, *, ts: float, local: bool) -> int:
    """Credit one held tip to its sender, exactly once, and delete its
    ``held_tips`` row in the same transaction; returns the atoms credited.

    The credit is a ``tip`` movement under the tip's own ref
    (``tip:<seq>:<peer>:<matoms>``, unique in ``movements``), so a tip is
    never credited twice however often this runs. ``local``: the built-in
    ledger holds the balance; otherwise the caller already credited the
    Billing store under that ref and only the audit row is written. Returns
    0, changing nothing, when the tip is no longer held, and raises
    :class:`BalanceLimitError` (nothing written, the tip stays held) when
    the built-in balance would pass :data:`MAX_BALANCE_ATOMS`."""
    key = (tip.sequence_id, tip.peer, tip.amount_matoms)
    if not _held_row(conn, *key):
        return 0
    ref = tip_ref(*key)
    delete = "DELETE FROM held_tips WHERE sequence_id = ? AND peer = ? AND amount_matoms = ?"
    if conn.execute("SELECT 1 FROM movements WHERE ref = ?", (ref,)).fetchone() is not None:
        conn.execute(delete, key)  # credited already (a crash came before the delete)
        return 0
    after: int | None = None
    if local:
        current = balance(conn, tip.peer)
        if current + tip.atoms > MAX_BALANCE_ATOMS:
            raise BalanceLimitError(tip.peer, current, tip.atoms)
        after = add_balance(conn, tip.peer, tip.atoms)
    record_movement(
        conn,
        ts=ts,
        peer=tip.peer,
        kind="tip",
        atoms=tip.atoms,
        ref=ref,
        tip_seq=tip.sequence_id,
        balance_after=after,
    )
    conn.execute(delete, key)
    return tip.atoms


def has_tips(conn: Connection) -> bool:
    """True when any received tip was ever recorded (the seen-set keeps the
    newest :data:`TIP_MEMORY`, so it is never emptied once used)."""
    return conn.execute("SELECT 1 FROM tips LIMIT 1").fetchone() is not None


def finish_tip(conn: Connection, *, sequence_id: int, peer: str, amount_matoms: int, ts: float) -> None:
    """External billing: the credit of a pending tip is done; audit it."""
    row = conn.execute(
        "SELECT credited FROM tips "
        "WHERE sequence_id = ? AND peer = ? AND amount_matoms = ? AND state = 'pending'",
        (sequence_id, peer, amount_matoms),
    ).fetchone()
    if row is None:
        return
    conn.execute(
        "UPDATE tips SET state = 'done' WHERE sequence_id = ? AND peer = ? AND amount_matoms = ?",
        (sequence_id, peer, amount_matoms),
    )
    record_movement(
        conn,
        ts=ts,
        peer=peer,
        kind="tip",
        atoms=int(row[0]),
        ref=tip_ref(sequence_id, peer, amount_matoms),
        tip_seq=sequence_id,
    )


def pending_tips(conn: Connection) -> list[tuple[int, str, int, int]]:
    """External billing: tips whose credit may not have happened before a
    crash. Rows: (sequence_id, peer, amount_matoms, credited atoms)."""
    rows = conn.execute(
        "SELECT sequence_id, peer, amount_matoms, credited FROM tips WHERE state = 'pending' ORDER BY n"
    ).fetchall()
    return [(int(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows]
