"""The harness's durable state: one SQLite database in the data directory.

Tables (schema version 3; a version 1 file gains ``movements.tool`` and a
version 1 or 2 file gains ``held_tips`` when opened):

* ``balances(peer, atoms)`` -- the built-in prepaid ledger, in atoms;
* ``calls`` -- the paid-call journal: a row per charged execution, written in
  the same transaction as the debit, completed (or refunded) in one more;
* ``tips`` -- received tips already processed, bounded to the newest 10,000,
  written in the same transaction as the credit;
* ``movements`` -- an append-only audit row per money movement (charges and
  refunds name their ``tool``; NULL for tips, credits and rows written by
  schema version 1);
* ``held_tips`` -- tips received from senders not allowed when they
  arrived, with their atoms, written in the same transaction as the tip's
  ``tips`` row; each is credited once (and its row deleted in that
  transaction) when its sender is allowed (WIRE.md §Payments, "Tips from
  senders not allowed").

WAL journal, ``synchronous=FULL``. Every operation is a plain function of a
connection executed by :class:`~._executor.GroupCommitExecutor`, so money
movements and their journal rows always commit together.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DB_FILENAME",
    "TIP_MEMORY",
    "HeldTip",
    "JournalEntry",
    "StatementEntry",
    "StoreError",
    "open_database",
]

DB_FILENAME = "brmcp.sqlite3"
SCHEMA_VERSION = 3
#: How many processed tips are remembered for de-duplication.
TIP_MEMORY = 10_000
#: The largest balance the built-in ledger holds, in atoms: all the DCR there
#: will ever be (21 million DCR). A tip or operator credit that would push a
#: balance past it is refused (SECURITY.md "Money bounds"); refunds are not,
#: since they return atoms a charge took and refusing one would lose them.
MAX_BALANCE_ATOMS = 21_000_000 * 100_000_000
#: Sequence ids and amounts must fit a signed 64-bit SQLite integer.
MAX_INT63 = (1 << 63) - 1

_SCHEMA = """
CREATE TABLE balances (
    peer  TEXT PRIMARY KEY,
    atoms INTEGER NOT NULL CHECK (atoms >= 0)
);
CREATE TABLE calls (
    call_id      TEXT PRIMARY KEY,
    peer         TEXT NOT NULL,
    call_key     TEXT,
    tool         TEXT NOT NULL,
    atoms        INTEGER NOT NULL CHECK (atoms > 0),
    state        TEXT NOT NULL CHECK (state IN ('charging', 'charged', 'done')),
    charged_at   REAL NOT NULL,
    completed_at REAL,
    expires      REAL,
    kept         INTEGER NOT NULL DEFAULT 0,
    outcome      TEXT
);
CREATE UNIQUE INDEX calls_by_key ON calls (peer, call_key) WHERE call_key IS NOT NULL;
CREATE TABLE tips (
    n            INTEGER PRIMARY KEY AUTOINCREMENT,
    sequence_id  INTEGER NOT NULL,
    peer         TEXT NOT NULL,
    amount_matoms INTEGER NOT NULL,
    atoms        INTEGER NOT NULL,
    credited     INTEGER NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('pending', 'done')),
    ts           REAL NOT NULL,
    UNIQUE (sequence_id, peer, amount_matoms)
);
CREATE TABLE movements (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    ts            REAL NOT NULL,
    peer          TEXT NOT NULL,
    kind          TEXT NOT NULL,
    atoms         INTEGER NOT NULL,
    call_key      TEXT,
    tip_seq       INTEGER,
    ref           TEXT NOT NULL UNIQUE,
    balance_after INTEGER,
    tool          TEXT
);
CREATE INDEX movements_by_peer ON movements (peer, id);
CREATE TABLE held_tips (
    sequence_id   INTEGER NOT NULL,
    peer          TEXT NOT NULL,
    amount_matoms INTEGER NOT NULL,
    atoms         INTEGER NOT NULL CHECK (atoms > 0),
    ts            REAL NOT NULL,
    PRIMARY KEY (sequence_id, peer, amount_matoms)
);
CREATE INDEX held_tips_by_peer ON held_tips (peer);
"""

#: Schema version 3's table (and index) added to a version 1 or 2 file.
_HELD_TIPS_SCHEMA = (
    _SCHEMA[_SCHEMA.index("CREATE TABLE held_tips") :]
    .replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ")
    .replace("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ")
)

_EXPECTED_TABLES = {"balances", "calls", "tips", "movements"}


class StoreError(Exception):
    """The database cannot be opened or used (corrupt, unreadable, newer
    schema). Start-up stops; nothing is reset silently."""


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


def open_database(data_dir: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open (creating if needed) ``<data_dir>/brmcp.sqlite3``.

    The directory is created with mode 0700 and the file with 0600. A new
    database is built under a temporary name and linked into place only once
    its schema is committed, so an existing file is always either a brmcp
    database or refused: an empty (truncated) file, garbage, or another
    application's SQLite file raises :class:`StoreError` naming the path and
    is left untouched (nothing is written before it is recognised).
    """
    directory = Path(data_dir).expanduser()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create data directory {directory}: {exc.strerror or exc}") from exc
    path = directory / DB_FILENAME
    if not path.exists():
        _create(path)
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open ledger database {path}: {exc}") from exc
    try:
        _prepare(conn, path)
    except StoreError:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        raise StoreError(f"ledger database {path} is corrupt or unreadable: {exc}") from exc
    return conn


def _create(path: Path) -> None:
    """Build an empty brmcp database next to ``path`` and link it into place
    atomically (a concurrent creator wins; a crash leaves only a temporary
    ``.brmcp.sqlite3.init-*`` file behind, never a half-made database)."""
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.init-", dir=path.parent)
    except OSError as exc:
        raise StoreError(f"cannot create ledger database {path}: {exc.strerror or exc}") from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        _fsync_directory(path.parent)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot create ledger database {path}: {exc}") from exc
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            with contextlib.suppress(OSError):
                leftover.unlink()


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _prepare(conn: sqlite3.Connection, path: Path) -> None:
    # Recognise the file before writing anything to it (switching the journal
    # mode rewrites the header of a foreign database).
    check = conn.execute("PRAGMA quick_check").fetchall()
    if not check or check[0][0] != "ok":
        detail = "; ".join(str(row[0]) for row in check[:3])
        raise StoreError(f"ledger database {path} is corrupt: {detail}")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    tables.discard("sqlite_sequence")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"ledger database {path} has schema version {version}, newer than this brmcp "
            f"supports ({SCHEMA_VERSION}); upgrade brmcp"
        )
    if version == 0 and not tables:
        raise StoreError(
            f"ledger database {path} is empty (truncated?); refusing to start a new ledger over it. "
            "Restore it from a backup, or remove it to start with no balances"
        )
    expected = _EXPECTED_TABLES | ({"held_tips"} if version == SCHEMA_VERSION else set())
    if version not in (1, 2, SCHEMA_VERSION) or not tables >= expected:
        raise StoreError(
            f"ledger database {path} is not a brmcp database "
            f"(schema version {version}, tables {sorted(tables)})"
        )
    if version < SCHEMA_VERSION:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if version == 1:
                # Version 2 adds movements.tool (per-tool statements and stats).
                conn.execute("ALTER TABLE movements ADD COLUMN tool TEXT")
            # Version 3 adds held_tips (tips from senders not allowed).
            for statement in _HELD_TIPS_SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")


# -- operations: plain functions of a connection, run inside a transaction ----


class BalanceLimitError(ValueError):
    """A credit would push a balance past :data:`MAX_BALANCE_ATOMS`."""

    def __init__(self, peer: str, current: int, atoms: int) -> None:
        super().__init__(
            f"credit of {atoms} atoms to {peer} refused: the balance of {current} atoms would pass "
            f"the maximum of {MAX_BALANCE_ATOMS} atoms"
        )
        self.peer = peer
        self.current = current
        self.atoms = atoms


def balance(conn: sqlite3.Connection, peer: str) -> int:
    row = conn.execute("SELECT atoms FROM balances WHERE peer = ?", (peer,)).fetchone()
    return int(row[0]) if row else 0


def _add_balance(conn: sqlite3.Connection, peer: str, delta: int) -> int:
    if delta >= 0:
        conn.execute(
            "INSERT INTO balances (peer, atoms) VALUES (?, ?) "
            "ON CONFLICT (peer) DO UPDATE SET atoms = atoms + excluded.atoms",
            (peer, delta),
        )
    else:
        # The CHECK (atoms >= 0) constraint makes an overdraft fail loudly.
        conn.execute("UPDATE balances SET atoms = atoms + ? WHERE peer = ?", (delta, peer))
    return balance(conn, peer)


def record_movement(
    conn: sqlite3.Connection,
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
    conn.execute(
        "INSERT INTO movements (ts, peer, kind, atoms, call_key, tip_seq, ref, balance_after, tool) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (ts, peer, kind, atoms, call_key, tip_seq, ref, balance_after, tool),
    )


def credit(conn: sqlite3.Connection, peer: str, atoms: int, *, ts: float, kind: str, ref: str) -> int:
    """Add ``atoms`` (> 0) to ``peer`` and audit it; returns the new balance.
    Raises :class:`BalanceLimitError` (nothing written) when the balance would
    pass :data:`MAX_BALANCE_ATOMS`."""
    current = balance(conn, peer)
    if current + atoms > MAX_BALANCE_ATOMS:
        raise BalanceLimitError(peer, current, atoms)
    after = _add_balance(conn, peer, atoms)
    record_movement(conn, ts=ts, peer=peer, kind=kind, atoms=atoms, ref=ref, balance_after=after)
    return after


def charge(
    conn: sqlite3.Connection,
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
    current = balance(conn, peer)
    if current < atoms:
        return False, current
    after = _add_balance(conn, peer, -atoms)
    record_movement(
        conn,
        ts=ts,
        peer=peer,
        kind="charge",
        atoms=-atoms,
        ref=f"charge:{call_id}",
        call_key=call_key,
        balance_after=after,
        tool=tool,
    )
    _insert_call(
        conn, call_id=call_id, peer=peer, call_key=call_key, tool=tool, atoms=atoms, ts=ts, state="charged"
    )
    return True, after


def journal_charge(
    conn: sqlite3.Connection,
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
    conn: sqlite3.Connection,
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


def drop_call(conn: sqlite3.Connection, call_id: str) -> None:
    conn.execute("DELETE FROM calls WHERE call_id = ?", (call_id,))


def _refund(
    conn: sqlite3.Connection,
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
    after = _add_balance(conn, peer, atoms) if local else None
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


def _keep(
    conn: sqlite3.Connection, call_id: str, ts: float, expires: float, outcome_json: str | None
) -> None:
    """Mark a call done, keeping its key (and ``outcome_json`` when given)
    for replay until ``expires``."""
    conn.execute(
        "UPDATE calls SET state = 'done', completed_at = ?, expires = ?, kept = ?, outcome = ? "
        "WHERE call_id = ?",
        (ts, expires, 1 if outcome_json is not None else 0, outcome_json, call_id),
    )


def complete(
    conn: sqlite3.Connection,
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


def interrupted(conn: sqlite3.Connection) -> list[tuple[str, str, str | None, str, int, str]]:
    """Calls charged (or being charged) but never completed: a crash came
    between the debit and completion. Rows: (call_id, peer, call_key, tool,
    atoms, state)."""
    rows = conn.execute(
        "SELECT call_id, peer, call_key, tool, atoms, state FROM calls "
        "WHERE state IN ('charging', 'charged') ORDER BY charged_at"
    ).fetchall()
    return [(str(r[0]), str(r[1]), r[2], str(r[3]), int(r[4]), str(r[5])) for r in rows]


def recover_call(
    conn: sqlite3.Connection,
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
    """
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


def completed_keyed(conn: sqlite3.Connection, now: float) -> list[JournalEntry]:
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


def gc_calls(conn: sqlite3.Connection, now: float) -> int:
    cursor = conn.execute("DELETE FROM calls WHERE state = 'done' AND expires <= ?", (now,))
    return cursor.rowcount


def _tip_ref(sequence_id: int, peer: str, amount_matoms: int) -> str:
    """The movement ref of a received tip, shared by its audit row and an
    external Billing credit (billing.py: a store applies a ref at most once)."""
    return f"tip:{sequence_id}:{peer}:{amount_matoms}"


def tip_seen(conn: sqlite3.Connection, sequence_id: int, peer: str, amount_matoms: int) -> str | None:
    row = conn.execute(
        "SELECT state FROM tips WHERE sequence_id = ? AND peer = ? AND amount_matoms = ?",
        (sequence_id, peer, amount_matoms),
    ).fetchone()
    return str(row[0]) if row else None


def record_tip(
    conn: sqlite3.Connection,
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
    ref = _tip_ref(sequence_id, peer, amount_matoms)
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
        after = _add_balance(conn, peer, credited)
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


def _held_row(conn: sqlite3.Connection, sequence_id: int, peer: str, amount_matoms: int) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM held_tips WHERE sequence_id = ? AND peer = ? AND amount_matoms = ?",
            (sequence_id, peer, amount_matoms),
        ).fetchone()
        is not None
    )


def held_tips(conn: sqlite3.Connection, peer: str | None = None) -> list[HeldTip]:
    """The tips held now (of ``peer``, or of everyone), oldest first."""
    sql = "SELECT sequence_id, peer, amount_matoms, atoms, ts FROM held_tips"
    args: tuple[str, ...] = ()
    if peer is not None:
        sql += " WHERE peer = ?"
        args = (peer,)
    rows = conn.execute(sql + " ORDER BY ts, sequence_id", args).fetchall()
    return [HeldTip(int(r[0]), str(r[1]), int(r[2]), int(r[3]), float(r[4])) for r in rows]


def held_peers(conn: sqlite3.Connection) -> list[str]:
    """The senders with at least one held tip."""
    return [str(r[0]) for r in conn.execute("SELECT DISTINCT peer FROM held_tips ORDER BY peer")]


def release_held_tip(conn: sqlite3.Connection, tip: HeldTip, *, ts: float, local: bool) -> int:
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
    ref = _tip_ref(*key)
    delete = "DELETE FROM held_tips WHERE sequence_id = ? AND peer = ? AND amount_matoms = ?"
    if conn.execute("SELECT 1 FROM movements WHERE ref = ?", (ref,)).fetchone() is not None:
        conn.execute(delete, key)  # credited already (a crash came before the delete)
        return 0
    after: int | None = None
    if local:
        current = balance(conn, tip.peer)
        if current + tip.atoms > MAX_BALANCE_ATOMS:
            raise BalanceLimitError(tip.peer, current, tip.atoms)
        after = _add_balance(conn, tip.peer, tip.atoms)
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


def has_tips(conn: sqlite3.Connection) -> bool:
    """True when any received tip was ever recorded (the seen-set keeps the
    newest :data:`TIP_MEMORY`, so it is never emptied once used)."""
    return conn.execute("SELECT 1 FROM tips LIMIT 1").fetchone() is not None


def finish_tip(
    conn: sqlite3.Connection, *, sequence_id: int, peer: str, amount_matoms: int, ts: float
) -> None:
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
        ref=_tip_ref(sequence_id, peer, amount_matoms),
        tip_seq=sequence_id,
    )


def pending_tips(conn: sqlite3.Connection) -> list[tuple[int, str, int, int]]:
    """External billing: tips whose credit may not have happened before a
    crash. Rows: (sequence_id, peer, amount_matoms, credited atoms)."""
    rows = conn.execute(
        "SELECT sequence_id, peer, amount_matoms, credited FROM tips WHERE state = 'pending' ORDER BY n"
    ).fetchall()
    return [(int(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows]


def statement(conn: sqlite3.Connection, peer: str) -> list[StatementEntry]:
    rows = conn.execute(
        "SELECT ts, kind, atoms, call_key, tip_seq, balance_after FROM movements WHERE peer = ? ORDER BY id",
        (peer,),
    ).fetchall()
    return [
        StatementEntry(float(r[0]), str(r[1]), int(r[2]), r[3], None if r[4] is None else int(r[4]), r[5])
        for r in rows
    ]
