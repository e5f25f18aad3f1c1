"""What the directory saw of a provider (docs/directory.md §Reputation): the
receipt key its crawls announced, the outcome of every paid test and free
re-crawl, and the summary ``get_provider`` and ``search`` show next to the
ratings of :mod:`brmcp.directory.db._ratings`.

Tables (in the harness's database, next to ``dir_listings``):

* ``dir_receipt_keys``: ``(uid, scope)`` to the 64-hex receipt key a crawl
  read from the ``_meta`` of the provider's ``tools/list`` answer under
  ``brmcp/receiptKey`` (:func:`brmcp.protocol.receipts.receipt_key_from_meta`;
  ``""``: the crawl found none). Scope ``"run"`` is the crawl of a
  registration in flight (its ``reg_id`` kept), adopted as scope
  ``"listed"`` when that registration is published (:func:`adopt_run_key`,
  inside :func:`brmcp.directory.db._rows.promote`), so a failed renewal never
  changes the live listing's key; a free re-crawl writes ``"listed"``
  directly.
* ``dir_history``: one row per judged paid test (renewals and
  ``run_verification`` included) and per re-crawl attempt, the newest
  :data:`HISTORY_KEEP` of each kind per provider kept;
* ``dir_history_totals``: the counts of every row ever written, per
  provider, so trimming the history never lowers them.

Every function takes the caller's open transaction (a
:meth:`brmcp.directory.db._store.DirectoryStore.run` op), so a test's outcome
commits with the registration it judges and a re-crawl's with the catalog
it stored.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from . import _poolinfo as poolinfo

__all__ = [
    "HISTORY_KEEP",
    "LAST_TESTS",
    "SCHEMA",
    "adopt_run_key",
    "compact",
    "judging_key",
    "listed_key",
    "open_tables",
    "record_recrawl",
    "record_test",
    "set_listed_key",
    "set_run_key",
    "summary",
]

#: History rows kept per provider and kind (``test``, ``recrawl``); the totals count all.
HISTORY_KEEP = 100
#: Tests shown in ``reputation.lastTests``, newest first.
LAST_TESTS = 10

SCHEMA = """
CREATE TABLE IF NOT EXISTS dir_receipt_keys (
    uid    TEXT NOT NULL,
    scope  TEXT NOT NULL CHECK (scope IN ('run', 'listed')),
    reg_id TEXT NOT NULL DEFAULT '',
    key    TEXT NOT NULL,
    PRIMARY KEY (uid, scope)
);
CREATE TABLE IF NOT EXISTS dir_history (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    uid              TEXT NOT NULL,
    kind             TEXT NOT NULL CHECK (kind IN ('test', 'recrawl')),
    at               INTEGER NOT NULL,
    ok               INTEGER NOT NULL,
    atoms            INTEGER NOT NULL DEFAULT 0 CHECK (atoms >= 0),
    receipt_verified INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS dir_history_by_uid ON dir_history (uid, kind, id);
CREATE TABLE IF NOT EXISTS dir_history_totals (
    uid                TEXT PRIMARY KEY,
    paid_tests         INTEGER NOT NULL DEFAULT 0,
    paid_tests_ok      INTEGER NOT NULL DEFAULT 0,
    recrawls           INTEGER NOT NULL DEFAULT 0,
    recrawls_ok        INTEGER NOT NULL DEFAULT 0,
    last_recrawl_ok_at INTEGER NOT NULL DEFAULT 0
);
"""


def open_tables(conn: sqlite3.Connection) -> None:
    """Create this module's tables when missing, and the crawled pools'
    (:func:`brmcp.directory.db._poolinfo.open_tables`) next to the receipt keys."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    poolinfo.open_tables(conn)


# -- receipt keys ---------------------------------------------------------------------


def set_run_key(conn: sqlite3.Connection, uid: str, reg_id: str, key: str) -> None:
    """Record the key (``""``: none) the crawl of registration ``reg_id`` read."""
    conn.execute(
        "INSERT OR REPLACE INTO dir_receipt_keys (uid, scope, reg_id, key) VALUES (?, 'run', ?, ?)",
        (uid, reg_id, key),
    )


def set_listed_key(conn: sqlite3.Connection, uid: str, key: str) -> None:
    """Record the key (``""``: none) a re-crawl of the live listing read."""
    conn.execute(
        "INSERT OR REPLACE INTO dir_receipt_keys (uid, scope, reg_id, key) VALUES (?, 'listed', '', ?)",
        (uid, key),
    )


def adopt_run_key(conn: sqlite3.Connection, uid: str, reg_id: str) -> None:
    """At publication of ``reg_id``: its crawl's key becomes the listing's.
    A run that did not crawl (``run_verification``) keeps the listing's key;
    any run row of ``uid`` is dropped."""
    row = conn.execute(
        "SELECT reg_id, key FROM dir_receipt_keys WHERE uid = ? AND scope = 'run'", (uid,)
    ).fetchone()
    if row is not None and row[0] == reg_id:
        set_listed_key(conn, uid, str(row[1]))
    conn.execute("DELETE FROM dir_receipt_keys WHERE uid = ? AND scope = 'run'", (uid,))


def listed_key(conn: sqlite3.Connection, uid: str) -> str:
    """The live listing's receipt key, ``""`` when none was announced."""
    row = conn.execute(
        "SELECT key FROM dir_receipt_keys WHERE uid = ? AND scope = 'listed'", (uid,)
    ).fetchone()
    return str(row[0]) if row else ""


def judging_key(conn: sqlite3.Connection, uid: str, reg_id: str) -> str:
    """The key a test of registration ``reg_id`` is checked against: its own
    crawl's when it crawled, else the live listing's; ``""`` when none."""
    row = conn.execute(
        "SELECT reg_id, key FROM dir_receipt_keys WHERE uid = ? AND scope = 'run'", (uid,)
    ).fetchone()
    if row is not None and row[0] == reg_id:
        return str(row[1])
    return listed_key(conn, uid)


# -- history -------------------------------------------------------------------------


def _bump(conn: sqlite3.Connection, uid: str, column: str, ok_column: str, ok: bool) -> None:
    conn.execute("INSERT OR IGNORE INTO dir_history_totals (uid) VALUES (?)", (uid,))
    conn.execute(
        f"UPDATE dir_history_totals SET {column} = {column} + 1, {ok_column} = {ok_column} + ? WHERE uid = ?",
        (int(ok), uid),
    )


def _insert(
    conn: sqlite3.Connection, uid: str, kind: str, at: int, ok: bool, atoms: int, verified: bool
) -> None:
    conn.execute(
        "INSERT INTO dir_history (uid, kind, at, ok, atoms, receipt_verified) VALUES (?, ?, ?, ?, ?, ?)",
        (uid, kind, at, int(ok), max(0, atoms), int(verified)),
    )
    conn.execute(
        "DELETE FROM dir_history WHERE uid = ? AND kind = ? AND id NOT IN "
        "(SELECT id FROM dir_history WHERE uid = ? AND kind = ? ORDER BY id DESC LIMIT ?)",
        (uid, kind, uid, kind, HISTORY_KEEP),
    )


def record_test(
    conn: sqlite3.Connection, uid: str, *, at: int, ok: bool, atoms: int, receipt_verified: bool
) -> None:
    """Record one judged paid test of ``uid``: passed or not, the atoms the
    run paid (>= 0), whether the result's signed receipt verified against
    the crawled key."""
    _insert(conn, uid, "test", at, ok, atoms, receipt_verified)
    _bump(conn, uid, "paid_tests", "paid_tests_ok", ok)


def record_recrawl(conn: sqlite3.Connection, uid: str, *, at: int, ok: bool) -> None:
    """Record one re-crawl attempt of ``uid``'s live catalog."""
    _insert(conn, uid, "recrawl", at, ok, 0, False)
    _bump(conn, uid, "recrawls", "recrawls_ok", ok)
    if ok:
        conn.execute("UPDATE dir_history_totals SET last_recrawl_ok_at = ? WHERE uid = ?", (at, uid))


# -- the summary ---------------------------------------------------------------------


def _average(total: int, count: int) -> float | None:
    return round(total / count, 2) if count else None


def summary(conn: sqlite3.Connection, uid: str) -> dict[str, Any]:
    """``get_provider``'s ``reputation`` object: ``{ratings, averageStars
    (2 decimals, omitted without ratings), raters (distinct), ratedAtoms
    (sum of the rated receipts' atoms), paidTests, paidTestsOk, lastTests:
    [{at, ok, atoms, receiptVerified}] (newest first, at most
    :data:`LAST_TESTS`), recrawls, recrawlsOk, lastRecrawlOkAt (unix seconds,
    omitted when none succeeded)}``. Needs the ratings table
    (:mod:`brmcp.directory.db._ratings`)."""
    count, stars, raters, atoms = conn.execute(
        "SELECT COUNT(*), COALESCE(SUM(stars), 0), COUNT(DISTINCT rater), COALESCE(SUM(atoms), 0) "
        "FROM dir_ratings WHERE provider = ?",
        (uid,),
    ).fetchone()
    totals = conn.execute(
        "SELECT paid_tests, paid_tests_ok, recrawls, recrawls_ok, last_recrawl_ok_at "
        "FROM dir_history_totals WHERE uid = ?",
        (uid,),
    ).fetchone() or (0, 0, 0, 0, 0)
    tests = [
        {"at": int(r[0]), "ok": bool(r[1]), "atoms": int(r[2]), "receiptVerified": bool(r[3])}
        for r in conn.execute(
            "SELECT at, ok, atoms, receipt_verified FROM dir_history "
            "WHERE uid = ? AND kind = 'test' ORDER BY id DESC LIMIT ?",
            (uid, LAST_TESTS),
        )
    ]
    out: dict[str, Any] = {"ratings": int(count)}
    average = _average(int(stars), int(count))
    if average is not None:
        out["averageStars"] = average
    out.update(
        raters=int(raters),
        ratedAtoms=int(atoms),
        paidTests=int(totals[0]),
        paidTestsOk=int(totals[1]),
        lastTests=tests,
        recrawls=int(totals[2]),
        recrawlsOk=int(totals[3]),
    )
    if totals[4]:
        out["lastRecrawlOkAt"] = int(totals[4])
    return out


def compact(conn: sqlite3.Connection, uids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """A search hit's ``reputation`` per uid: ``{ratings, averageStars
    (omitted without ratings), paidTests, paidTestsOk}``."""
    out: dict[str, dict[str, Any]] = {}
    for uid in dict.fromkeys(uids):
        count, stars = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(stars), 0) FROM dir_ratings WHERE provider = ?", (uid,)
        ).fetchone()
        totals = conn.execute(
            "SELECT paid_tests, paid_tests_ok FROM dir_history_totals WHERE uid = ?", (uid,)
        ).fetchone() or (0, 0)
        item: dict[str, Any] = {"ratings": int(count)}
        average = _average(int(stars), int(count))
        if average is not None:
            item["averageStars"] = average
        item.update(paidTests=int(totals[0]), paidTestsOk=int(totals[1]))
        out[uid] = item
    return out
