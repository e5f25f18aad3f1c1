"""The paid-call journal (both backends) (``calls``; WIRE.md §callKey).

A paid call is journaled in the same transaction as its debit (built-in
ledger: :func:`charge`) or around an external debit (:func:`journal_charge`:
``charging`` before, ``charged`` after), and completed in one more
transaction (:func:`complete`), which also refunds a failed call. A keyed
call's row is kept, with its outcome when small enough, until its replay
window ends, so a retry is answered rather than executed twice. A call
left ``charging`` or ``charged`` by a crash is refunded exactly once at the
next start (:func:`interrupted`, :func:`recover_call`).

Several processes sharing one PostgreSQL book (a bot pool, WIRE.md §Pools)
add two things, both unused on SQLite (one process; its calls carry no
owner and every interrupted call is its own):

* ownership: each process registers a lease (``leases``: its random owner
  id, the database clock's time of its last beat, and where it runs) and
  beats every :data:`HEARTBEAT_INTERVAL` seconds; each call row records its
  owner; recovery refunds only calls whose owner is dead
  (:func:`dead_owners`): lease gone, or no beat for :data:`LEASE_EXPIRY`
  seconds by the database's ``now()`` (never a process's clock, so clock
  skew between machines cannot kill a live sibling), or, for a sibling in
  this very process namespace on this boot, its pid gone;
* the shared callKey claim: the charging transaction inserts the (peer,
  callKey) row, the unique index deciding between processes
  (:func:`.postgres.paidcalls.charge`), and reads the row holding it
  (:func:`key_holder`) when it was taken; a row in flight or completed
  inside its replay window is answered, never charged or executed again,
  and only an expired row is replaced (WIRE.md §callKey, §Pools).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ._conn import Connection
from .ledger import add_balance, debit, record_movement
from .records import JournalEntry

__all__ = [
    "HEARTBEAT_INTERVAL",
    "LEASE_EXPIRY",
    "KeyHolder",
    "Lease",
    "beat",
    "charge",
    "complete",
    "completed_keyed",
    "dead_owners",
    "drop_call",
    "drop_lease",
    "gc_calls",
    "interrupted",
    "interrupted_owned",
    "journal_charge",
    "key_holder",
    "leases",
    "recover_call",
]

#: Seconds between a process's lease beats on a shared (PostgreSQL) book.
HEARTBEAT_INTERVAL = 5.0
#: Seconds without a beat, by the database's clock, after which an owner is
#: dead and its interrupted calls are refunded: three beats missed, so a
#: process stalled for a moment (a slow transaction, a pause of its host)
#: is not mistaken for a dead one.
LEASE_EXPIRY = 3 * HEARTBEAT_INTERVAL
#: The database clock, in unix seconds, on PostgreSQL (the only backend
#: with leases).
_DB_NOW = "extract(epoch from now())"


@dataclass(frozen=True, slots=True)
class KeyHolder:
    """The journal row already holding a (peer, callKey): ``state``
    ``"running"`` (charged, not completed: at this process or a sibling) or
    ``"done"`` (completed, inside its replay window until ``expires``, unix
    seconds), with ``outcome`` the kept CallToolResult JSON (None when not
    kept: too large, or still running)."""

    state: Literal["running", "done"]
    outcome: str | None
    expires: float | None


@dataclass(frozen=True, slots=True)
class Lease:
    """A process's lease as :func:`dead_owners` read it: ``owner``, its last
    ``beat`` (database unix seconds), ``age`` (seconds since, by the
    database's clock), and ``host``/``pid`` (where it runs; ``host`` None
    when unknown)."""

    owner: str
    beat: float
    age: float
    host: str | None
    pid: int | None


def charge(
    conn: Connection,
    *,
    call_id: str,
    peer: str,
    call_key: str | None,
    tool: str,
    atoms: int,
    ts: float,
    owner: str | None = None,
) -> tuple[bool, int]:
    """Debit ``atoms`` and journal the call as charged, atomically.
    ``owner`` (shared book only) is the charging process's lease owner.

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
            owner=owner,
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
    owner: str | None = None,
) -> None:
    """External-billing variant: journal a call as ``charging`` (before the
    debit) or move it to ``charged`` (after). ``owner`` as for
    :func:`charge`."""
    if state == "charging":
        _insert_call(
            conn,
            call_id=call_id,
            peer=peer,
            call_key=call_key,
            tool=tool,
            atoms=atoms,
            ts=ts,
            state=state,
            owner=owner,
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
    owner: str | None = None,
) -> None:
    """Journal a new call in ``state`` (``charging`` or ``charged``), owned
    by ``owner`` when given (a shared book; the column exists only there)."""
    if call_key is not None:
        # A completed record past its replay window may still hold the key
        # (on a shared book :func:`key_holder` ran first in this
        # transaction, so a live one never reaches here).
        conn.execute("DELETE FROM calls WHERE peer = ? AND call_key = ? AND state = 'done'", (peer, call_key))
    if owner is None:
        conn.execute(
            "INSERT INTO calls (call_id, peer, call_key, tool, atoms, state, charged_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (call_id, peer, call_key, tool, atoms, state, ts),
        )
        return
    conn.execute(
        "INSERT INTO calls (call_id, peer, call_key, tool, atoms, state, charged_at, owner) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (call_id, peer, call_key, tool, atoms, state, ts, owner),
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
    shared: bool = False,
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
    this transaction.

    ``shared`` (a shared book): a call no longer in flight
    (already settled by a sibling's recovery, which judged this process
    dead) changes nothing and returns None, so its price is never refunded
    twice."""
    if shared:
        state = conn.execute("SELECT state FROM calls WHERE call_id = ?", (call_id,)).fetchone()
        if state is None or state[0] not in ("charging", "charged"):
            return None
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
    lease: tuple[str, float | None] | None = None,
) -> None:
    """Refund one interrupted call exactly once and settle its journal row.

    A keyed call keeps its key bound to an error outcome until ``expires`` so
    a retry of the same key is answered rather than executed a second time.
    ``charged`` False (external billing, debit not confirmed) refunds nothing.
    A call no longer interrupted (settled meanwhile by another process
    sharing the database) changes nothing. ``lease`` (a shared book) is
    ``(owner, beat)``: the call's owner and the lease beat seen when it was
    judged dead (None: no lease); an owner that has beaten since is alive
    after all and its call is left alone.
    """
    row = conn.execute("SELECT state FROM calls WHERE call_id = ?", (call_id,)).fetchone()
    if row is None or row[0] not in ("charging", "charged"):
        return
    if lease is not None:
        owner, seen = lease
        now_beat = conn.execute("SELECT beat FROM leases WHERE owner = ?", (owner,)).fetchone()
        if now_beat is not None and (seen is None or float(now_beat[0]) > seen):
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


def key_holder(conn: Connection, *, peer: str, call_key: str, now: float) -> KeyHolder | None:
    """The journal row holding ``(peer, call_key)`` (shared book: run in the
    charging transaction, so the database decides the claim), or None when
    the key is free: no row, or a completed row whose replay window ended
    by ``now`` (unix seconds; :func:`_insert_call` replaces it)."""
    row = conn.execute(
        "SELECT state, expires, kept, outcome FROM calls WHERE peer = ? AND call_key = ?", (peer, call_key)
    ).fetchone()
    if row is None:
        return None
    state, expires, kept, outcome = row
    if state != "done":
        return KeyHolder("running", None, None)
    if expires is None or float(expires) <= now:
        return None
    return KeyHolder("done", str(outcome) if kept and outcome is not None else None, float(expires))


def beat(conn: Connection, *, owner: str, host: str | None, pid: int) -> None:
    """Register or refresh ``owner``'s lease at the database's ``now()``
    (PostgreSQL only). ``host`` names the boot and process namespace it
    runs in (None when unknown), ``pid`` its process id."""
    conn.execute(
        f"INSERT INTO leases (owner, beat, host, pid) VALUES (?, {_DB_NOW}, ?, ?) "
        "ON CONFLICT (owner) DO UPDATE SET beat = excluded.beat",
        (owner, host, pid),
    )


def drop_lease(conn: Connection, owner: str, seen: float | None = None) -> None:
    """Forget ``owner``'s lease: at a clean exit (``seen`` None), or a dead
    owner's once none of its calls is left in flight and it has not beaten
    since ``seen`` (database unix seconds)."""
    if seen is None:
        conn.execute("DELETE FROM leases WHERE owner = ?", (owner,))
        return
    conn.execute(
        "DELETE FROM leases WHERE owner = ? AND beat <= ? AND NOT EXISTS "
        "(SELECT 1 FROM calls WHERE owner = ? AND state IN ('charging', 'charged'))",
        (owner, seen, owner),
    )


def interrupted_owned(conn: Connection) -> list[tuple[str, str, str | None, str, int, str, str | None]]:
    """:func:`interrupted` with each call's owner (shared book): rows
    (call_id, peer, call_key, tool, atoms, state, owner), owner None for a
    call journaled by a process without leases."""
    rows = conn.execute(
        "SELECT call_id, peer, call_key, tool, atoms, state, owner FROM calls "
        "WHERE state IN ('charging', 'charged') ORDER BY charged_at"
    ).fetchall()
    return [(str(r[0]), str(r[1]), r[2], str(r[3]), int(r[4]), str(r[5]), r[6]) for r in rows]


def leases(conn: Connection) -> list[Lease]:
    """Every registered lease, with its age by the database's clock."""
    return [
        Lease(str(r[0]), float(r[1]), float(r[2]), r[3], None if r[4] is None else int(r[4]))
        for r in conn.execute(f"SELECT owner, beat, {_DB_NOW} - beat, host, pid FROM leases")
    ]


def dead_owners(
    owners: set[str | None],
    known: list[Lease],
    *,
    host: str | None,
    alive: Callable[[int], bool],
    expiry: float = LEASE_EXPIRY,
) -> dict[str | None, float | None]:
    """Which of ``owners`` (those of interrupted calls) are dead, each with
    the beat its lease showed (None: no lease). Dead: no lease (a clean
    exit, or a process without leases: owner None), a lease ``expiry``
    seconds old by the database's clock, or a lease on the same ``host``
    (boot and process namespace) whose pid ``alive`` says is gone. A lease
    from another host is judged by its age alone."""
    by_owner = {lease.owner: lease for lease in known}
    dead: dict[str | None, float | None] = {}
    for owner in owners:
        lease = by_owner.get(owner) if owner is not None else None
        if lease is None:
            dead[owner] = None
        elif lease.age >= expiry or (
            host is not None and lease.host == host and lease.pid is not None and not alive(lease.pid)
        ):
            dead[owner] = lease.beat
    return dead
