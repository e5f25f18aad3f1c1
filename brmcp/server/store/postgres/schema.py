"""PostgreSQL: the schema, created or checked when a harness connects.

The tables are SQLite's (:mod:`.._schema`, schema version 3), derived from
the same DDL text with PostgreSQL's types: ``BIGINT`` for every integer
(balances reach 2.1e15 atoms, sequence ids 2^63-1), ``DOUBLE PRECISION``
for unix-second times (PostgreSQL's ``REAL`` is 4 bytes) and identity
columns for SQLite's ``AUTOINCREMENT``. One more table,
``brmcp_schema(version)``, records the schema version (SQLite's
``user_version``).

Several processes may connect at once: the creation runs in one
transaction holding a transaction-scoped advisory lock
(:data:`ADVISORY_LOCK`), so one creates and the others wait and then find
the schema made; DDL is transactional in PostgreSQL, so a crash leaves no
half-made schema. A database holding some of these tables without a
version row, or a newer version, is refused (:class:`~..records.StoreError`),
never altered.

A shared book also keeps who runs what (WIRE.md §Pools; :mod:`..journal`):
``calls.owner`` (the lease owner of the process that charged the call) and
``leases(owner, beat, host, pid)``. They are added to any version-3
database when a harness connects (:data:`POOL_DDL`, additive: a brmcp
without them still runs on it, its calls owner NULL, i.e. recovered by the
next start as before), so the version stays 3.
"""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING, Any

from .._schema import SCHEMA, SCHEMA_VERSION
from ..records import StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = ["ADVISORY_LOCK", "POOL_DDL", "POSTGRES_SCHEMA", "TABLES", "ensure_schema"]

#: Milliseconds a connection waits for another's schema creation to finish.
SCHEMA_LOCK_TIMEOUT_MS = 60_000
#: The advisory lock key the schema creation holds (a constant of the
#: application, ``'brmcp'`` in ASCII).
ADVISORY_LOCK = 0x62726D6370
#: The store's tables, as SQLite names them.
TABLES = ("balances", "calls", "tips", "movements", "held_tips")


def _postgres_ddl(sqlite_ddl: str) -> str:
    ddl = sqlite_ddl.replace(
        "INTEGER PRIMARY KEY AUTOINCREMENT", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
    )
    ddl = re.sub(r"\bINTEGER\b", "BIGINT", ddl)
    ddl = re.sub(r"\bREAL\b", "DOUBLE PRECISION", ddl)
    ddl = ddl.replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ")
    ddl = ddl.replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX IF NOT EXISTS ")
    return ddl.replace("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ")


#: The PostgreSQL DDL of schema version :data:`SCHEMA_VERSION`, idempotent.
POSTGRES_SCHEMA = _postgres_ddl(SCHEMA)
#: The shared book's ownership additions (``leases`` and ``calls.owner``),
#: idempotent; ``beat`` is the database clock's unix seconds.
POOL_DDL = (
    "CREATE TABLE IF NOT EXISTS leases ("
    "owner TEXT PRIMARY KEY, beat DOUBLE PRECISION NOT NULL, host TEXT, pid BIGINT)",
    "ALTER TABLE calls ADD COLUMN IF NOT EXISTS owner TEXT",
)


def _ensure_pool(raw: psycopg.Connection[Any], present: set[str]) -> None:
    """Add :data:`POOL_DDL` where missing (checked first: ``ALTER TABLE``
    would lock ``calls`` against running siblings even when it adds
    nothing)."""
    has_owner = raw.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'calls' AND column_name = 'owner'"
    ).fetchone()
    if "leases" not in present:
        raw.execute(POOL_DDL[0])
    if has_owner is None:
        raw.execute(POOL_DDL[1])


def ensure_schema(raw: psycopg.Connection[Any], where: str) -> None:
    """Create the schema in the connected database if it has none, or check
    it is this brmcp's. ``raw`` is in autocommit mode; ``where`` (the
    redacted URL) names the database in errors. Raises
    :class:`~..records.StoreError` for a newer schema version or a database
    holding other tables of these names (nothing is written then)."""
    raw.execute("BEGIN")
    try:
        # The connection's short lock_timeout is for row locks between
        # batches; waiting for another process's schema creation (DDL, slow
        # on a loaded server) is expected, so this transaction waits longer.
        raw.execute(f"SET LOCAL lock_timeout = {int(SCHEMA_LOCK_TIMEOUT_MS)}")
        raw.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK,))
        present = {
            str(row[0])
            for row in raw.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_name = ANY(%s)",
                (["brmcp_schema", "leases", *TABLES],),
            )
        }
        version: int | None = None
        if "brmcp_schema" in present:
            row = raw.execute("SELECT max(version) FROM brmcp_schema").fetchone()
            version = None if row is None or row[0] is None else int(row[0])
        if version is None and present - {"brmcp_schema"}:
            raise StoreError(
                f"PostgreSQL database {where} holds tables {sorted(present)} but no brmcp schema version: "
                "not a brmcp database; use an empty database"
            )
        if version is not None and version > SCHEMA_VERSION:
            raise StoreError(
                f"PostgreSQL database {where} has schema version {version}, newer than this brmcp "
                f"supports ({SCHEMA_VERSION}); upgrade brmcp"
            )
        if version is None or version < SCHEMA_VERSION:
            raw.execute("CREATE TABLE IF NOT EXISTS brmcp_schema (version BIGINT NOT NULL)")
            for statement in POSTGRES_SCHEMA.split(";"):
                if statement.strip():
                    raw.execute(statement)
            raw.execute("DELETE FROM brmcp_schema")
            raw.execute("INSERT INTO brmcp_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
        elif not present >= set(TABLES):
            raise StoreError(
                f"PostgreSQL database {where} is missing brmcp tables {sorted(set(TABLES) - present)}"
            )
        _ensure_pool(raw, present)
    except BaseException:
        with contextlib.suppress(Exception):  # a broken connection: the server rolls back
            raw.execute("ROLLBACK")
        raise
    raw.execute("COMMIT")
