"""The bot pool a provider announced (WIRE.md §Pools; docs/directory.md
§Reputation, "The pool"), as a crawl read it and as ``get_provider`` shows
it under ``pool``.

A provider that is one member of a pool names it under ``brmcp/pool`` in
the ``_meta`` of its ``tools/list`` answer: ``{"id", "members", "key"}``.
:func:`pool_from_meta` keeps it only when it is well formed and belongs to
that provider: ``id`` 1..64 of ``A-Z a-z 0-9 . _ -`` starting with a
letter or digit, ``members`` 2..16 distinct 64-hex uids with the provider
among them (:func:`brmcp.server.pool.parse_pool`'s rules; stored
lowercase, in the announced order), and ``key`` equal to the receipt key
the same answer announces under ``brmcp/receiptKey`` (a pool's members
sign with the pool's one key, so a differing key is not this provider's
pool). Anything else is recorded as no pool. The announcement proves only
that the provider holds the key; the other members are where to look,
not members the directory vouches for (WIRE.md §Pools, "Who is a member").

Table ``dir_pools`` (in the harness's database, next to
``dir_receipt_keys``): ``(uid, scope)`` to the pool as compact JSON
(``""``: none), scoped as the receipt key is (:mod:`.reputation`): scope
``"run"`` for the crawl of a registration in flight (its ``reg_id`` kept),
adopted as ``"listed"`` at publication (:func:`adopt_run_pool`, inside
:func:`brmcp.directory.db._rows.promote`); a free re-crawl writes ``"listed"``
directly. Writes delete then insert (no upsert), so the same SQL runs on
both store backends. Every function takes the caller's open transaction.
"""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any

from brmcp.server.pool import POOL_META_KEY, parse_pool

__all__ = [
    "SCHEMA",
    "adopt_run_pool",
    "listed_pool",
    "open_tables",
    "pool_from_meta",
    "set_listed_pool",
    "set_run_pool",
    "shown_pool",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS dir_pools (
    uid    TEXT NOT NULL,
    scope  TEXT NOT NULL CHECK (scope IN ('run', 'listed')),
    reg_id TEXT NOT NULL DEFAULT '',
    pool   TEXT NOT NULL,
    PRIMARY KEY (uid, scope)
)
"""

_KEY = re.compile(r"[0-9a-f]{64}")


def open_tables(conn: sqlite3.Connection) -> None:
    """Create ``dir_pools`` when missing."""
    conn.execute(SCHEMA)


def pool_from_meta(meta: Any, uid: str, receipt_key: str) -> dict[str, Any] | None:
    """The pool ``uid`` announced in ``meta`` (its ``tools/list`` result
    ``_meta``) as ``{"id": str, "members": [64-hex uid, ...], "key": 64-hex}``,
    or None when absent or not acceptable (see the module docstring):
    malformed, ``uid`` not among ``members``, or ``key`` not equal to
    ``receipt_key`` (the 64-hex key the same answer announced; ``""``: none,
    so no pool). Unknown keys of the announcement are ignored. Never raises."""
    if not isinstance(meta, dict):
        return None
    value = meta.get(POOL_META_KEY)
    if not isinstance(value, dict):
        return None
    key = value.get("key")
    if not isinstance(key, str) or not _KEY.fullmatch(key) or key != receipt_key:
        return None
    try:
        pool = parse_pool({"id": value.get("id"), "members": value.get("members")})
    except ValueError:
        return None
    if pool is None or uid.lower() not in pool.members:
        return None
    return {"id": pool.id, "members": list(pool.members), "key": key}


def _put(conn: sqlite3.Connection, uid: str, scope: str, reg_id: str, pool: dict[str, Any] | None) -> None:
    text = json.dumps(pool, separators=(",", ":")) if pool is not None else ""
    conn.execute("DELETE FROM dir_pools WHERE uid = ? AND scope = ?", (uid, scope))
    conn.execute(
        "INSERT INTO dir_pools (uid, scope, reg_id, pool) VALUES (?, ?, ?, ?)", (uid, scope, reg_id, text)
    )


def set_run_pool(conn: sqlite3.Connection, uid: str, reg_id: str, pool: dict[str, Any] | None) -> None:
    """Record the pool (None: none) the crawl of registration ``reg_id`` read."""
    _put(conn, uid, "run", reg_id, pool)


def set_listed_pool(conn: sqlite3.Connection, uid: str, pool: dict[str, Any] | None) -> None:
    """Record the pool (None: none) a re-crawl of the live listing read."""
    _put(conn, uid, "listed", "", pool)


def adopt_run_pool(conn: sqlite3.Connection, uid: str, reg_id: str) -> None:
    """At publication of ``reg_id``: its crawl's pool becomes the listing's.
    A run that did not crawl (``run_verification``) keeps the listing's
    pool; any run row of ``uid`` is dropped."""
    row = conn.execute(
        "SELECT reg_id, pool FROM dir_pools WHERE uid = ? AND scope = 'run'", (uid,)
    ).fetchone()
    if row is not None and row[0] == reg_id:
        conn.execute("DELETE FROM dir_pools WHERE uid = ? AND scope = 'listed'", (uid,))
        conn.execute(
            "INSERT INTO dir_pools (uid, scope, reg_id, pool) VALUES (?, 'listed', '', ?)", (uid, str(row[1]))
        )
    conn.execute("DELETE FROM dir_pools WHERE uid = ? AND scope = 'run'", (uid,))


def listed_pool(conn: sqlite3.Connection, uid: str) -> dict[str, Any] | None:
    """The live listing's pool as recorded, None when none was announced."""
    row = conn.execute("SELECT pool FROM dir_pools WHERE uid = ? AND scope = 'listed'", (uid,)).fetchone()
    if row is None or not row[0]:
        return None
    value = json.loads(str(row[0]))
    return value if isinstance(value, dict) else None


def shown_pool(conn: sqlite3.Connection, uid: str, receipt_key: str) -> dict[str, Any] | None:
    """What ``get_provider`` shows as ``pool``: the listing's pool when its
    ``key`` is the listing's receipt key ``receipt_key`` (both recorded by
    the same crawl), else None."""
    pool = listed_pool(conn, uid)
    if pool is None or not receipt_key or pool.get("key") != receipt_key:
        return None
    return pool
