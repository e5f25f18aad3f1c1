"""SQLite: the database file, its schema and its migrations.

One file, ``<data_dir>/brmcp.sqlite3``. Tables (schema version 3; a
version 1 file gains ``movements.tool`` and a version 1 or 2 file gains
``held_tips`` when opened):

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

WAL journal, ``synchronous=FULL``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from pathlib import Path

from .records import StoreError

__all__ = ["DB_FILENAME", "SCHEMA_VERSION", "open_database"]

DB_FILENAME = "brmcp.sqlite3"
SCHEMA_VERSION = 3

SCHEMA = """
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
    SCHEMA[SCHEMA.index("CREATE TABLE held_tips") :]
    .replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ")
    .replace("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ")
)

_EXPECTED_TABLES = {"balances", "calls", "tips", "movements"}


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
            for statement in SCHEMA.split(";"):
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
