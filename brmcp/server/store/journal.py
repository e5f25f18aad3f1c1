"""The paid-call journal (both backends) (``calls``; WIRE.md §callKey).

A paid call is journaled in the same transaction as its debit (built-in
ledger: :func:`charge`) or around an external debit (:func:`journal_charge`:
``charging`` before, ``charged`` after), and completed in one more
transaction (:func:`complete`), which also refunds a failed call. A keyed
call's row is kept, with its outcome when small enough, until its replay
window ends, so a retry is answered rather than executed twice. A call
left ``charging`` or ``charged`` by a crash is refunded exactly once at the
next start (:func:`interrupted`, :func:`recover_call`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ._conn import Connection
from .ledger import add_balance, debit, record_movement
from .records import JournalEntry

__all__ = [
    "charge",
    "complete",
    "completed_keyed",
    "drop_call",
    "gc_calls",
    "interrupted",
    "journal_charge",
    "recover_call",
]


def charge(
    conn: Connection,
    *,
    call_id: str,
    peer: str,
    call_key: str | None,
    tool: str,
    atoms: int,
    ts: float,
) -> tuple[bool, int]:
    """Debit ``atoms`` and journal the call as charged, atomically.

    Returns ``(True, balance_after)`` or ``(False, balance)`` when the
    balance cannot cover the price (nothing written).
    """
    ok, after = debit(
        conn, peer=peer, atoms=atoms, ts=ts, ref=f"charge:{call_id}", call_key=call_key, tool=tool
    )
    if ok:
        _insert_call(
            conn,
            call_id=call_id,
            peer=peer,
            call_key=call_key,
            tool=tool,
            atoms=atoms,
            ts=ts,
            state="charged",
        )
    return ok, after


def journal_charge(
    conn: Connection,
    *,
    call_id: str,
    peer: str,
    call_key: str | None,
    tool: str,
    atoms: int,
    ts: float,
    state: str,
) -> None:
    """External-billing variant: journal a call as ``charging`` (before the
    debit) or move it to ``charged`` (after)."""
    if state == "charging":
        _insert_call(
            conn, call_id=call_id, peer=peer, call_key=call_key, tool=tool, atoms=atoms, ts=ts, state=state
        )
    else:
        conn.execute("UPDATE calls SET state = 'charged' WHERE call_id = ?", (call_id,))
        record_movement(
            conn,
            ts=ts,
            peer=peer,
            kind="charge",
            atoms=-atoms,
            ref=f"charge:{call_id}",
            call_key=call_key,
            tool=tool,
        )


def _insert_call(
    conn: Connection,
    *,
    call_id: str,
    peer: str,
    call_key: str | None,
    tool: str,
    atoms: int,
    ts: float,
    state: str,
) -> None:
    """Journal a new call in ``state`` (``charging`` or ``charged``)."""
    if call_key is not None:
        # A completed record past its replay window may still hold the key.
        conn.execute("DELETE FROM calls WHERE peer = ? AND call_key = ? AND state = 'done'", (peer, call_key))
    conn.execute(
        "INSERT INTO calls (call_id, peer, call_key, tool, atoms, state, charged_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (call_id, peer, call_key, tool, atoms, state, ts),
    )


def drop_call(conn: Connection, call_id: str) -> None:
    """Forget the journal row of ``call_id`` (an unkeyed call done, or an
    external debit refused)."""
    conn.execute("DELETE FROM calls WHERE call_id = ?", (call_id,))


def _refund(
    conn: Connection,
    *,
    kind: str,
    call_id: str,
    peer: str,
    call_key: str | None,
    atoms: int,
    ts: float,
    local: bool,
) -> int | None:
    """Credit a call's price back and audit it (``local``: the built-in
    ledger holds the balance; otherwise only the audit row is written).
    Returns the balance after the refund in atoms (None unless ``local``)."""
    after = add_balance(conn, peer, atoms) if local else None
    row = conn.execute("SELECT tool FROM calls WHERE call_id = ?", (call_id,)).fetchone()
    record_movement(
        conn,
        ts=ts,
        peer=peer,
        kind=kind,
        atoms=atoms,
        ref=f"refund:{call_id}",
        call_key=call_key,
        balance_after=after,
        tool=row[0] if row else None,
    )
    return after


def _keep(conn: Connection, call_id: str, ts: float, expires: float, outcome_json: str | None) -> None:
    """Mark a call done, keeping its key (and ``outcome_json`` when given)
    for replay until ``expires``."""
    conn.execute(
        "UPDATE calls SET state = 'done', completed_at = ?, expires = ?, kept = ?, outcome = ? "
        "WHERE call_id = ?",
        (ts, expires, 1 if outcome_json is not None else 0, outcome_json, call_id),
    )


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
    """Mark a charged call done (keyed: keep it for replay until
    ``expires``; unkeyed: forget it). ``refund=(peer, atoms, local)`` also
    credits the price back in the same transaction (``local``: the built-in
    ledger holds the balance; otherwise the caller already refunded through
    its Billing store and only the audit row is written).

    Returns the caller's balance in atoms after the refund: the built-in
    ledger's, else ``balance_after`` (what the Billing store said; None when
    unknown or when nothing was refunded). ``outcome_json`` may be a
    function of that balance returning the JSON to keep (WIRE.md §Receipts:
    a refunded outcome names the balance after its refund), called inside
    this transaction."""
    known: int | None = None
    if refund is not None:
        peer, atoms, local = refund
        row = conn.execute("SELECT call_key FROM calls WHERE call_id = ?", (call_id,)).fetchone()
        call_key = row[0] if row else None
        after = _refund(
            conn,
            kind="refund",
            call_id=call_id,
            peer=peer,
            call_key=call_key,
            atoms=atoms,
            ts=ts,
            local=local,
        )
        known = after if after is not None else balance_after
    if keyed:
        kept = outcome_json(known) if callable(outcome_json) else outcome_json
        _keep(conn, call_id, ts, expires, kept)
    else:
        drop_call(conn, call_id)
    return known


def interrupted(conn: Connection) -> list[tuple[str, str, str | None, str, int, str]]:
    """Calls charged (or being charged) but never completed: a crash came
    between the debit and completion. Rows: (call_id, peer, call_key, tool,
    atoms, state)."""
    rows = conn.execute(
        "SELECT call_id, peer, call_key, tool, atoms, state FROM calls "
        "WHERE state IN ('charging', 'charged') ORDER BY charged_at"
    ).fetchall()
    return [(str(r[0]), str(r[1]), r[2], str(r[3]), int(r[4]), str(r[5])) for r in rows]


def recover_call(
    conn: Connection,
    *,
    call_id: str,
    peer: str,
    call_key: str | None,
    atoms: int,
    ts: float,
    expires: float,
    outcome_json: str,
    local: bool,
    charged: bool,
) -> None:
    """Refund one interrupted call exactly once and settle its journal row.

    A keyed call keeps its key bound to an error outcome until ``expires`` so
    a retry of the same key is answered rather than executed a second time.
    ``charged`` False (external billing, debit not confirmed) refunds nothing.
    A call no longer interrupted (settled meanwhile by another process
    sharing the database) changes nothing.
    """
    row = conn.execute("SELECT state FROM calls WHERE call_id = ?", (call_id,)).fetchone()
    if row is None or row[0] not in ("charging", "charged"):
        return
    if charged:
        _refund(
            conn,
            kind="recovery_refund",
            call_id=call_id,
            peer=peer,
            call_key=call_key,
            atoms=atoms,
            ts=ts,
            local=local,
        )
    if call_key is None:
        drop_call(conn, call_id)
    else:
        _keep(conn, call_id, ts, expires, outcome_json)


def completed_keyed(conn: Connection, now: float) -> list[JournalEntry]:
    """Delete expired completed rows and return the live ones."""
    conn.execute("DELETE FROM calls WHERE state = 'done' AND (expires IS NULL OR expires <= ?)", (now,))
    out: list[JournalEntry] = []
    for peer, call_key, atoms, expires, kept, outcome in conn.execute(
        "SELECT peer, call_key, atoms, expires, kept, outcome FROM calls "
        "WHERE state = 'done' AND call_key IS NOT NULL ORDER BY completed_at"
    ):
        parsed: dict[str, Any] | None = None
        if kept and outcome is not None:
            try:
                value = json.loads(outcome)
            except ValueError:
                value = None
            parsed = value if isinstance(value, dict) else None
        out.append(JournalEntry(str(peer), str(call_key), int(atoms), float(expires), parsed))
    return out


def gc_calls(conn: Connection, now: float) -> int:
    """Delete completed rows whose replay window ended by ``now`` (unix
    seconds); returns how many."""
    cursor = conn.execute("DELETE FROM calls WHERE state = 'done' AND expires <= ?", (now,))
    return cursor.rowcount
