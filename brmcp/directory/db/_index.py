"""The directory's search index: listed tools in SQLite FTS5 tables next to
``dir_listings`` (docs/directory.md §Search).

The index lives in the harness's database and is written in the same
transaction as the listing it mirrors: :func:`index_listing` runs inside
``put_listing`` (``brmcp/directory/db/_rows.py``) and :func:`unindex_listing`
wherever a listing row is deleted (``brmcp/directory/db/_store.py``, whose
``DirectoryStore.open`` runs :func:`ensure_index`), so a published,
renewed, recrawled, unlisted or expired listing touches only its own rows
and the index never disagrees with ``dir_listings`` after a commit.

Tables (all ``dir_search_*``): ``dir_search_listings`` (one row per listing:
its tags as JSON text and its two timestamps), ``dir_search_tags`` (one row
per ``(tag, uid)``), ``dir_search_tools`` (one row per catalog entry: name,
description, advertised price, catalog position) and ``dir_search_fts``, an
FTS5 table with the trigram tokenizer over the lowercased name, title,
description and tags of each tool (its rowid is ``dir_search_tools.id``).

PostgreSQL (the harness's ``store`` a ``postgresql://`` URL; the SQL
rewritten by :mod:`brmcp.directory.db._sql`) has no FTS5: the same tables are
kept without ``dir_search_fts``, and every term is matched by the
``instr`` path SQLite takes for short terms (``strpos`` there) over the same
lowercased text, so hits, totals, orders and cursors are the same. Only
``relevance``'s score differs: with no bm25, a hit scores minus the sum,
over its terms of three characters or more, of the bm25 column weights
(name 8, title 4, description 1, tags 2) of every field holding the term;
ties break as on SQLite. PostgreSQL text cannot hold a NUL, so a tool's
name and description are stored there with an escape (U+FDD1 U+FDD3 for a
NUL, U+FDD1 U+FDD2 for a U+FDD1; both noncharacters) and read back as
they came.


The queries over these tables are in :mod:`._search`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from brmcp.protocol.payment import PRICE_ATOMS_KEY, PRICING_DYNAMIC, PRICING_KEY

from ..model import (
    go_lower,
)
from ._sql import is_postgres

if TYPE_CHECKING:
    pass

__all__ = [
    "INDEX_VERSION",
    "NUL_MARK",
    "Fts5Unavailable",
    "IndexedListing",
    "clean_text",
    "create_index",
    "ensure_index",
    "fold_text",
    "index_listing",
    "rebuild_index",
    "require_fts5",
    "shown_text",
    "tool_price",
    "unindex_listing",
]

#: Bumped when the index's tables or text change; a database holding
#: another version is rebuilt from ``dir_listings`` on open.
INDEX_VERSION = "2"
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS dir_search_meta (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dir_search_listings (
        uid                     TEXT PRIMARY KEY,
        tags                    TEXT NOT NULL,
        catalog_checked_at      INTEGER NOT NULL,
        last_verified_execution INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dir_search_tags (
        tag TEXT NOT NULL,
        uid TEXT NOT NULL,
        PRIMARY KEY (tag, uid)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS dir_search_tags_uid ON dir_search_tags (uid)",
    """CREATE TABLE IF NOT EXISTS dir_search_tools (
        id          INTEGER PRIMARY KEY,
        uid         TEXT NOT NULL,
        pos         INTEGER NOT NULL,
        name        TEXT NOT NULL,
        description TEXT NOT NULL,
        price       INTEGER NOT NULL,
        dynamic     INTEGER NOT NULL,
        verified    INTEGER NOT NULL,
        fname       TEXT NOT NULL,
        ftitle      TEXT NOT NULL,
        fdesc       TEXT NOT NULL,
        ftags       TEXT NOT NULL
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS dir_search_tools_order ON dir_search_tools (uid, pos)",
    "CREATE INDEX IF NOT EXISTS dir_search_tools_rank ON dir_search_tools (uid, name, pos)",
    """CREATE VIRTUAL TABLE IF NOT EXISTS dir_search_fts USING fts5(
        fname, ftitle, fdesc, ftags,
        content = 'dir_search_tools', content_rowid = 'id',
        tokenize = 'trigram case_sensitive 1'
    )""",
)
_TOOL_COLUMNS = "id, uid, pos, name, description, price, dynamic, verified, fname, ftitle, fdesc, ftags"
_INSERT_TOOL = f"INSERT INTO dir_search_tools ({_TOOL_COLUMNS}) VALUES ({', '.join('?' * 12)})"


class Fts5Unavailable(RuntimeError):
    """This Python's sqlite3 lacks FTS5 or its trigram tokenizer (SQLite
    3.34 or later built with FTS5); the message names the version found."""


class IndexedListing(Protocol):
    """What the index reads of a listing (:class:`brmcp.directory.db._store.Listing`
    has it): ``catalog`` is the crawled ``tools/list`` array as JSON text,
    times are unix seconds."""

    @property
    def uid(self) -> str: ...
    @property
    def tags(self) -> tuple[str, ...]: ...
    @property
    def catalog(self) -> str: ...
    @property
    def catalog_checked_at(self) -> int: ...
    @property
    def last_verified_execution(self) -> int: ...


def require_fts5(conn: sqlite3.Connection) -> None:
    """Raise :class:`Fts5Unavailable` unless ``conn``'s SQLite has FTS5 with
    the trigram tokenizer (probed on a temporary table)."""
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.dir_search_probe USING fts5(x, tokenize = 'trigram')")
        conn.execute("DROP TABLE temp.dir_search_probe")
    except sqlite3.OperationalError as exc:
        raise Fts5Unavailable(
            f"the directory's search index needs SQLite FTS5 with the trigram tokenizer "
            f"(SQLite >= 3.34 built with FTS5); this sqlite3 is {sqlite3.sqlite_version}: {exc}"
        ) from None


def clean_text(text: str) -> str:
    # Lone surrogates (possible in JSON) cannot be encoded for SQLite.
    return text.encode("utf-8", "replace").decode("utf-8") if not text.isascii() else text


#: What a NUL reads as in the FTS5 table: its tokenizer stops at a NUL.
NUL_MARK = "\ufdd0"


def fold_text(text: str) -> str:
    """``text`` as the FTS5 table holds it: Go-lowercased, lone surrogates
    replaced, NUL as :data:`NUL_MARK`."""
    return clean_text(go_lower(text)).replace("\x00", NUL_MARK)


def _clamp(value: int) -> int:
    return max(_INT64_MIN, min(_INT64_MAX, value))


def tool_price(meta: Any) -> tuple[int, bool]:
    """A crawled tool's advertised price: ``(atoms, dynamic)``. A number
    under ``brmcp/priceAtoms`` is the fixed price (truncated to whole atoms,
    as Go's ``int64(float64)``, and held to the signed 64-bit range: a
    provider's 1e30 shows as the int64 maximum, which every ceiling drops
    and every Go client decodes); else ``brmcp/pricing: "dynamic"`` is
    ``(0, True)``; else ``(0, False)``. A crawled catalog holds no NaN or
    infinity (the SDK writes them as ``null``); a float that is one counts
    as no price."""
    if not isinstance(meta, dict):
        return 0, False
    value = meta.get(PRICE_ATOMS_KEY)
    if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
        if value >= _INT64_MAX:
            return _INT64_MAX, False
        if value <= _INT64_MIN:
            return _INT64_MIN, False
        return int(value), False
    return 0, meta.get(PRICING_KEY) == PRICING_DYNAMIC


def _price(meta: Any) -> tuple[int, bool]:
    """:func:`tool_price`, held to int64 as SQLite stores it."""
    price, dynamic = tool_price(meta)
    return _clamp(price), dynamic


def _tools(catalog: str) -> list[tuple[int, Mapping[str, Any]]]:
    try:
        tools = json.loads(catalog) if catalog else None
    except ValueError:
        return []
    if not isinstance(tools, list):
        return []
    return [(pos, tool) for pos, tool in enumerate(tools) if isinstance(tool, dict)]


def _text(tool: Mapping[str, Any], key: str) -> str:
    value = tool.get(key)
    return value if isinstance(value, str) else ""


#: PostgreSQL's escape in a raw name or description (its text holds no NUL):
#: U+FDD1 (a noncharacter) followed by U+FDD2 is a U+FDD1, by U+FDD3 a NUL.
_PG_ESCAPE = "\ufdd1"


def _stored(conn: sqlite3.Connection, text: str) -> str:
    """``text`` as a raw name or description column holds it: as is on
    SQLite; with :data:`_PG_ESCAPE` escapes on PostgreSQL."""
    if not is_postgres(conn) or ("\x00" not in text and _PG_ESCAPE not in text):
        return text
    return text.replace(_PG_ESCAPE, _PG_ESCAPE + "\ufdd2").replace("\x00", _PG_ESCAPE + "\ufdd3")


def shown_text(conn: sqlite3.Connection, text: str) -> str:
    """A raw column read back: the inverse of :func:`_stored`."""
    if not is_postgres(conn) or _PG_ESCAPE not in text:
        return text
    return text.replace(_PG_ESCAPE + "\ufdd3", "\x00").replace(_PG_ESCAPE + "\ufdd2", _PG_ESCAPE)


def unindex_listing(conn: sqlite3.Connection, uid: str) -> None:
    """Remove ``uid``'s rows from the index (nothing when absent); run it in
    the transaction that deletes the listing."""
    if not is_postgres(conn):
        conn.execute(
            "INSERT INTO dir_search_fts (dir_search_fts, rowid, fname, ftitle, fdesc, ftags) "
            "SELECT 'delete', id, fname, ftitle, fdesc, ftags FROM dir_search_tools WHERE uid = ?",
            (uid,),
        )
    conn.execute("DELETE FROM dir_search_tools WHERE uid = ?", (uid,))
    conn.execute("DELETE FROM dir_search_tags WHERE uid = ?", (uid,))
    conn.execute("DELETE FROM dir_search_listings WHERE uid = ?", (uid,))


def _write_listing(conn: sqlite3.Connection, listing: IndexedListing, next_id: int) -> list[tuple[Any, ...]]:
    """Write ``listing``'s listing and tag rows; returns its tool rows
    (ids from ``next_id`` on) for the caller to insert."""
    uid = clean_text(listing.uid)
    tags = tuple(clean_text(tag) for tag in listing.tags)
    conn.execute(
        "INSERT INTO dir_search_listings (uid, tags, catalog_checked_at, last_verified_execution) "
        "VALUES (?, ?, ?, ?)",
        (uid, json.dumps(list(tags)), listing.catalog_checked_at, listing.last_verified_execution),
    )
    conn.executemany(
        "INSERT OR IGNORE INTO dir_search_tags (tag, uid) VALUES (?, ?)", [(tag, uid) for tag in tags]
    )
    folded_tags = " ".join(fold_text(tag) for tag in tags)
    rows: list[tuple[Any, ...]] = []
    for pos, tool in _tools(listing.catalog):
        name = _text(tool, "name")
        description = _text(tool, "description")
        price, dynamic = _price(tool.get("_meta"))
        rows.append(
            (
                next_id + len(rows),
                uid,
                pos,
                _stored(conn, clean_text(name)),
                _stored(conn, clean_text(description)),
                price,
                int(dynamic),
                listing.last_verified_execution,
                fold_text(name),
                fold_text(_text(tool, "title")),
                fold_text(description),
                folded_tags,
            )
        )
    return rows


def index_listing(conn: sqlite3.Connection, listing: IndexedListing) -> None:
    """Replace ``listing``'s rows in the index (only its rows); run it in the
    transaction that writes the listing. A catalog that is not a JSON array
    indexes no tools, as the scan matches none."""
    unindex_listing(conn, listing.uid)
    next_id = int(conn.execute("SELECT coalesce(max(id), 0) + 1 FROM dir_search_tools").fetchone()[0])
    rows = _write_listing(conn, listing, next_id)
    conn.executemany(_INSERT_TOOL, rows)
    if is_postgres(conn):
        return
    conn.executemany(
        "INSERT INTO dir_search_fts (rowid, fname, ftitle, fdesc, ftags) VALUES (?, ?, ?, ?, ?)",
        [(row[0], *row[8:]) for row in rows],
    )


def rebuild_index(conn: sqlite3.Connection, listings: Iterable[IndexedListing]) -> int:
    """Empty the index and index every listing of ``listings`` (tool rows in
    bulk, then one FTS5 ``rebuild``); returns how many. Records
    :data:`INDEX_VERSION`."""
    fts = not is_postgres(conn)
    if fts:
        conn.execute("INSERT INTO dir_search_fts (dir_search_fts) VALUES ('delete-all')")
    for table in ("dir_search_tools", "dir_search_tags", "dir_search_listings"):
        conn.execute(f"DELETE FROM {table}")
    count = 0
    next_id = 1
    # In uid order, so every index of the tool rows grows at its end.
    for listing in sorted(listings, key=lambda item: item.uid):
        rows = _write_listing(conn, listing, next_id)
        conn.executemany(_INSERT_TOOL, rows)
        next_id += len(rows)
        count += 1
    if fts:
        conn.execute("INSERT INTO dir_search_fts (dir_search_fts) VALUES ('rebuild')")
    conn.execute(
        "INSERT OR REPLACE INTO dir_search_meta (key, value) VALUES ('version', ?)", (INDEX_VERSION,)
    )
    return count


def create_index(conn: sqlite3.Connection) -> None:
    """Create the index's tables when missing (on PostgreSQL, all but the
    FTS5 table). Raises :class:`Fts5Unavailable` on a SQLite without FTS5."""
    if is_postgres(conn):
        for statement in _SCHEMA:
            if "VIRTUAL TABLE" not in statement:
                conn.execute(statement)
        return
    require_fts5(conn)
    for statement in _SCHEMA:
        conn.execute(statement)


def ensure_index(conn: sqlite3.Connection, listings: Callable[[], Iterable[IndexedListing]]) -> bool:
    """:func:`create_index`, then rebuild from ``listings()`` when the
    tables hold another :data:`INDEX_VERSION` or another number of listings
    than ``dir_listings`` (a database from before the index). Returns
    whether it rebuilt. Raises :class:`Fts5Unavailable`."""
    create_index(conn)
    row = conn.execute("SELECT value FROM dir_search_meta WHERE key = 'version'").fetchone()
    indexed = conn.execute("SELECT count(*) FROM dir_search_listings").fetchone()[0]
    live = conn.execute("SELECT count(*) FROM dir_listings").fetchone()[0]
    if row is not None and row[0] == INDEX_VERSION and indexed == live:
        return False
    rebuild_index(conn, listings())
    return True
