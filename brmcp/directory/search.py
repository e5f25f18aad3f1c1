"""The directory's search index: listed tools in SQLite FTS5 tables next to
``dir_listings`` (docs/directory.md §Search).

The index lives in the harness's database and is written in the same
transaction as the listing it mirrors: :func:`index_listing` runs inside
``put_listing`` (``brmcp/directory/rows.py``) and :func:`unindex_listing`
wherever a listing row is deleted (``brmcp/directory/store.py``, whose
``DirectoryStore.open`` runs :func:`ensure_index`), so a published,
renewed, recrawled, unlisted or expired listing touches only its own rows
and the index never disagrees with ``dir_listings`` after a commit.

Tables (all ``dir_search_*``): ``dir_search_listings`` (one row per listing:
its tags as JSON text and its two timestamps), ``dir_search_tags`` (one row
per ``(tag, uid)``), ``dir_search_tools`` (one row per catalog entry: name,
description, advertised price, catalog position) and ``dir_search_fts``, an
FTS5 table with the trigram tokenizer over the lowercased name, title,
description and tags of each tool (its rowid is ``dir_search_tools.id``).

Matching. The default answer is the Go reference's linear scan
(karamble/brmcp, ``directory/tools.go``, ``handleSearch``; here
:func:`brmcp.directory.tools.search_listings`): the query, trimmed and
lowercased as Go does (:func:`brmcp.directory.types.go_trim_space`,
:func:`~brmcp.directory.types.go_lower`), as a substring of a tool's name
or description. Text is lowercased the same way before it is indexed and
the tokenizer is case sensitive, so a query of three characters or more is
one FTS5 phrase of trigrams, which matches exactly the same substrings; a
shorter query (no trigram), or one holding a NUL, is an ``instr`` scan of
the same lowercased text. Orders, the tag rule and the
price rule are the scan's too, so the hits and ``total`` are equal.

Safety. User text never reaches the FTS5 query parser as syntax: every term
is wrapped in double quotes with inner quotes doubled, which makes ``NEAR``,
``*``, ``-``, ``^``, ``:``, column filters and unbalanced quotes plain
characters to find.

PostgreSQL (the harness's ``store`` a ``postgresql://`` URL; the SQL
rewritten by :mod:`brmcp.directory._sql`) has no FTS5: the same tables are
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
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from ..protocol.payment import PRICING_DYNAMIC
from ._sql import adapt, is_postgres
from .types import (
    MAX_SEARCH_HITS,
    SearchHit,
    SearchIn,
    ShapeError,
    go_lower,
    go_trim_space,
    normalize_tags,
)

if TYPE_CHECKING:
    from ..server import Harness

__all__ = [
    "EXTENSION_PROPERTIES",
    "INDEX_VERSION",
    "MAX_VERIFIED_WITHIN_DAYS",
    "RANKS",
    "RANK_CATALOG",
    "RANK_RELEVANCE",
    "Fts5Unavailable",
    "IndexedListing",
    "SearchIndex",
    "SearchPage",
    "SearchRequest",
    "create_index",
    "ensure_index",
    "fts_query",
    "index_listing",
    "rebuild_index",
    "require_fts5",
    "search",
    "unindex_listing",
]

#: ``rank`` values: the Go reference's order (provider uid, then catalog
#: order) or bm25 relevance.
RANK_CATALOG = "catalog"
RANK_RELEVANCE = "relevance"
RANKS = (RANK_CATALOG, RANK_RELEVANCE)
#: Bumped when the index's tables or text change; a database holding
#: another version is rebuilt from ``dir_listings`` on open.
INDEX_VERSION = "2"
#: The largest ``verifiedWithinDays`` accepted (100 years).
MAX_VERIFIED_WITHIN_DAYS = 36_500
#: bm25 column weights for name, title, description, tags.
_WEIGHTS = (8.0, 4.0, 1.0, 2.0)
_DAY = 86_400
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)

#: The extension keys of ``search``'s input schema (docs/directory.md §Search).
EXTENSION_PROPERTIES: dict[str, Any] = {
    "rank": {"type": "string", "enum": list(RANKS)},
    "cursor": {"type": "string"},
    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_HITS},
    "verifiedWithinDays": {"type": "integer", "minimum": 0, "maximum": MAX_VERIFIED_WITHIN_DAYS},
}

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
    """What the index reads of a listing (:class:`brmcp.directory.store.Listing`
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


def _clean(text: str) -> str:
    # Lone surrogates (possible in JSON) cannot be encoded for SQLite.
    return text.encode("utf-8", "replace").decode("utf-8") if not text.isascii() else text


#: What a NUL reads as in the FTS5 table: its tokenizer stops at a NUL.
_NUL_MARK = "\ufdd0"


def _fold(text: str) -> str:
    """``text`` as the FTS5 table holds it: Go-lowercased, lone surrogates
    replaced, NUL as :data:`_NUL_MARK`."""
    return _clean(go_lower(text)).replace("\x00", _NUL_MARK)


def _clamp(value: int) -> int:
    return max(_INT64_MIN, min(_INT64_MAX, value))


def _price(meta: Any) -> tuple[int, bool]:
    """:func:`brmcp.directory.tools.tool_price`, held to int64 as SQLite
    stores it."""
    from .tools import tool_price

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


def _shown(conn: sqlite3.Connection, text: str) -> str:
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
    uid = _clean(listing.uid)
    tags = tuple(_clean(tag) for tag in listing.tags)
    conn.execute(
        "INSERT INTO dir_search_listings (uid, tags, catalog_checked_at, last_verified_execution) "
        "VALUES (?, ?, ?, ?)",
        (uid, json.dumps(list(tags)), listing.catalog_checked_at, listing.last_verified_execution),
    )
    conn.executemany(
        "INSERT OR IGNORE INTO dir_search_tags (tag, uid) VALUES (?, ?)", [(tag, uid) for tag in tags]
    )
    folded_tags = " ".join(_fold(tag) for tag in tags)
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
                _stored(conn, _clean(name)),
                _stored(conn, _clean(description)),
                price,
                int(dynamic),
                listing.last_verified_execution,
                _fold(name),
                _fold(_text(tool, "title")),
                _fold(description),
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


def fts_query(terms: Iterable[str], columns: tuple[str, ...] = ()) -> str:
    """An FTS5 MATCH expression requiring every term literally: each term is
    a quoted string with ``"`` doubled, so no FTS5 operator survives;
    ``columns`` restricts the match to those columns. Raises ValueError
    when ``terms`` is empty."""
    quoted = ['"' + term.replace('"', '""') + '"' for term in terms]
    if not quoted:
        raise ValueError("fts_query needs at least one term")
    body = " ".join(quoted)
    return f"{{{' '.join(columns)}}} : ({body})" if columns else body


def _field(obj: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    if key in obj:
        return True, obj[key]
    folded = key.casefold()
    for name, item in obj.items():
        if isinstance(name, str) and name.casefold() == folded:
            return True, item
    return False, None


def _bounded_int(obj: Mapping[str, Any], key: str, low: int, high: int) -> tuple[bool, int]:
    present, value = _field(obj, key)
    if not present or value is None:
        return present, 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ShapeError(f"search.{key}: {value!r} is not a whole number in {low}..{high}")
    return True, value


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """``search``'s input: the Go keys (:class:`SearchIn`) and the extension
    keys (docs/directory.md §Search): ``rank`` (:data:`RANKS`), ``cursor``
    (a ``nextCursor`` this directory returned), ``limit`` (hits per page,
    1..50) and ``verified_within_days`` (0: no filter; else only listings
    whose ``lastVerifiedExecution`` is within that many days of now).
    ``extended`` says whether any extension key was given: only then does
    the answer carry ``nextCursor``."""

    base: SearchIn = field(default_factory=SearchIn)
    rank: str = RANK_CATALOG
    cursor: str = ""
    limit: int = MAX_SEARCH_HITS
    verified_within_days: int = 0
    extended: bool = False

    @classmethod
    def from_json(cls, value: Any) -> SearchRequest:
        """Decode ``search``'s arguments. Raises :class:`ShapeError` naming
        the key, the value and what is allowed."""
        base = SearchIn.from_json(value)
        obj: Mapping[str, Any] = value if isinstance(value, Mapping) else {}
        has_rank, rank = _field(obj, "rank")
        if rank is None:
            rank = RANK_CATALOG
        if rank not in RANKS:
            raise ShapeError(f"search.rank: {rank!r} is not one of {', '.join(RANKS)}")
        has_cursor, cursor = _field(obj, "cursor")
        if cursor is None:
            cursor = ""
        if not isinstance(cursor, str):
            raise ShapeError(f"search.cursor: expected a string, got {type(cursor).__name__}")
        has_limit, limit = _bounded_int(obj, "limit", 1, MAX_SEARCH_HITS)
        has_days, days = _bounded_int(obj, "verifiedWithinDays", 0, MAX_VERIFIED_WITHIN_DAYS)
        request = cls(
            base=base,
            rank=str(rank),
            cursor=cursor,
            limit=limit or MAX_SEARCH_HITS,
            verified_within_days=days,
            extended=has_rank or has_cursor or has_limit or has_days,
        )
        if cursor:
            _decode_cursor(request.rank, cursor)
        return request


@dataclass(frozen=True, slots=True)
class SearchPage:
    """``search``'s answer: ``hits`` (at most the request's limit), ``total``
    (every match, all pages) and ``next_cursor`` (empty on the last page).
    ``to_json`` is Go's ``SearchOut`` when ``extended`` is False, plus
    ``nextCursor`` when there is a next page otherwise."""

    hits: tuple[SearchHit, ...] = ()
    total: int = 0
    next_cursor: str = ""
    extended: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hits": [hit.to_json() for hit in self.hits], "total": self.total}
        if self.extended and self.next_cursor:
            out["nextCursor"] = self.next_cursor
        return out


def _encode_cursor(key: list[Any]) -> str:
    raw = json.dumps(key, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


#: The longest cursor accepted, in characters: a key is two or four short
#: scalars, so anything longer is forged (and a bounded text bounds the work
#: of decoding it).
CURSOR_MAX_CHARS = 16384
#: SQLite INTEGER is a signed 64-bit value; a catalog position is never negative.
_POS_MAX = 2**63 - 1
_CURSOR_ALPHABET = re.compile(r"[A-Za-z0-9_-]*")


def cursor_refusal(rank: str) -> str:
    """The refusal text for a cursor this directory did not issue for a
    ``rank`` search (docs/directory.md §Search): it never quotes the
    cursor nor says why it failed."""
    return f"search.cursor: not a nextCursor of a {rank!r} search"


def _decode_cursor(rank: str, cursor: str) -> list[Any]:
    """The sort key after which a page starts. Raises ShapeError saying
    :func:`cursor_refusal` when the cursor is not one this directory issued
    for ``rank``: over :data:`CURSOR_MAX_CHARS`, not unpadded URL-safe
    base64 of UTF-8 JSON, not a flat list ``["catalog", uid, pos]`` or
    ``["relevance", score, uid, name, pos]`` of exactly those types, a
    position outside 0..2^63-1 (what SQLite INTEGER holds), a score that is
    not finite, or a text SQLite cannot store (a lone surrogate)."""
    bad = ShapeError(cursor_refusal(rank))
    if len(cursor) > CURSOR_MAX_CHARS or not _CURSOR_ALPHABET.fullmatch(cursor) or len(cursor) % 4 == 1:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        # RecursionError: nesting deeper than the decoder's stack.
        key = json.loads(raw.decode("utf-8"))
    except (ValueError, binascii.Error, RecursionError):
        raise bad from None
    if not isinstance(key, list) or not key or key[0] != rank:
        raise bad
    if rank == RANK_CATALOG:
        shape: tuple[type, ...] = (str, str, int)
    else:
        shape = (str, float, str, str, int)
    if len(key) != len(shape) or not all(
        isinstance(item, kind) and not isinstance(item, bool) for item, kind in zip(key, shape, strict=True)
    ):
        raise bad
    if not 0 <= key[-1] <= _POS_MAX:
        raise bad
    if rank == RANK_RELEVANCE and not math.isfinite(key[1]):
        raise bad
    try:
        for item in key:
            if isinstance(item, str):
                item.encode("utf-8")
    except UnicodeEncodeError:
        raise bad from None
    return key[1:]


def _filters(request: SearchRequest, now: int) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    wanted = [_clean(tag) for tag in normalize_tags(request.base.tags)]
    if wanted:
        # One JSON parameter however many tags (SQLite bounds parameters).
        where.append(
            "t.uid IN (SELECT uid FROM dir_search_tags WHERE tag IN (SELECT value FROM json_each(?)) "
            "GROUP BY uid HAVING count(*) = ?)"
        )
        params += [json.dumps(wanted), len(wanted)]
    if request.base.max_price_atoms > 0:
        where.append("t.dynamic = 0 AND t.price <= ?")
        params.append(request.base.max_price_atoms)
    if request.verified_within_days > 0:
        where.append("t.verified >= ?")
        params.append(now - request.verified_within_days * _DAY)
    return where, params


def _indexed(term: str) -> bool:
    """Whether the trigram index can find the folded ``term``: three
    characters or more and no NUL mark (the FTS5 query parser stops at a
    NUL, so a NUL in a term never reaches it)."""
    return len(term) >= 3 and _NUL_MARK not in term


def _match(request: SearchRequest, fts: bool = True) -> tuple[str, list[str], list[Any]]:
    """The FROM clause, WHERE terms and their parameters for the text;
    without ``fts`` (PostgreSQL) every term is an ``instr`` test."""
    text = _fold(go_trim_space(request.base.query))
    if request.rank == RANK_CATALOG:
        if not text:
            return "dir_search_tools t", [], []
        if fts and _indexed(text):
            source = "dir_search_fts f JOIN dir_search_tools t ON t.id = f.rowid"
            return source, ["dir_search_fts MATCH ?"], [fts_query([text], ("fname", "fdesc"))]
        return "dir_search_tools t", ["(instr(t.fname, ?) > 0 OR instr(t.fdesc, ?) > 0)"], [text, text]
    terms = list(dict.fromkeys(text.split()))  # a repeated term adds nothing
    long_terms = [term for term in terms if fts and _indexed(term)]
    where: list[str] = []
    params: list[Any] = []
    if long_terms:
        where.append("dir_search_fts MATCH ?")
        params.append(fts_query(long_terms))
    for term in terms:
        if not (fts and _indexed(term)):
            where.append(
                "(instr(t.fname, ?) > 0 OR instr(t.ftitle, ?) > 0 "
                "OR instr(t.fdesc, ?) > 0 OR instr(t.ftags, ?) > 0)"
            )
            params += [term] * 4
    if not long_terms:
        return "dir_search_tools t", where, params
    return "dir_search_fts f JOIN dir_search_tools t ON t.id = f.rowid", where, params


def search(conn: sqlite3.Connection, request: SearchRequest, now: int) -> SearchPage:
    """Answer ``request`` from the index at unix time ``now``.

    ``rank`` ``"catalog"`` (the default) is the Go scan's answer: the query
    as a substring of a tool's name or description, hits by provider uid
    then catalog position. ``"relevance"`` splits the query on whitespace
    into terms, requires each term as a substring of the tool's name,
    title, description or the listing's tags (a NUL, in the query or the
    text, reads as U+FDD0, a noncharacter), and orders by bm25 (name
    weighs most), ties by provider uid, tool name, catalog position; terms
    under three characters filter but do not rank. Pages are keyset
    pages: a cursor is the last hit's sort key, so a tie never repeats or
    skips a hit. Raises :class:`ShapeError` for a foreign cursor."""
    after = _decode_cursor(request.rank, request.cursor) if request.cursor else None
    relevance = request.rank == RANK_RELEVANCE
    text = _clean(go_lower(go_trim_space(request.base.query)))
    if not relevance and ("\x00" in text or _NUL_MARK in text):
        return _scan(conn, request, now, text, after)
    fts = not is_postgres(conn)
    source, where, params = _match(request, fts)
    filters, filter_params = _filters(request, now)
    where += filters
    params += filter_params
    clause = (" WHERE " + " AND ".join(where)) if where else ""
    matched = "dir_search_fts MATCH ?" in where
    if where == ["dir_search_fts MATCH ?"]:
        # The index alone counts: no tool row is read.
        count_sql = "SELECT count(*) FROM dir_search_fts WHERE dir_search_fts MATCH ?"
        total = int(conn.execute(count_sql, params[:1]).fetchone()[0])
    else:
        total = int(conn.execute(f"SELECT count(*) FROM {source}{clause}", params).fetchone()[0])
    if matched and not relevance and _broad(conn, total, request.limit):
        return _page(conn, request, _in_order(conn, where, params, after, request.limit), total)
    score = "0.0"
    order = "uid, pos"
    score_params: list[Any] = []
    ranked = [
        term for term in dict.fromkeys(_fold(go_trim_space(request.base.query)).split()) if _indexed(term)
    ]
    if relevance and not fts and ranked:
        score, score_params = _field_score(ranked)
        order = "score, uid, name, pos"
    elif relevance and "dir_search_fts MATCH ?" in where:
        score = f"bm25(dir_search_fts, {', '.join(str(w) for w in _WEIGHTS)})"
        order = "score, uid, name, pos"
    elif relevance:
        # Nothing ranks: every score is 0.0 and the tie-break alone orders
        # (through the (uid, name, pos) index).
        order = "uid, name, pos"
        after = after[1:] if after is not None else None
    inner = (
        f"SELECT t.uid AS uid, t.pos AS pos, t.name AS name, t.description AS description, "
        f"t.price AS price, t.dynamic AS dynamic, {score} AS score FROM {source}{clause}"
    )
    page_params = [*score_params, *params]
    outer = ""
    if after is not None:
        outer = f" WHERE ({order}) > ({', '.join('?' * len(after))})"
        page_params += after
    rows = conn.execute(
        f"SELECT uid, pos, name, description, price, dynamic, score FROM ({inner}) AS page{outer} "
        f"ORDER BY {order} LIMIT ?",
        [*page_params, request.limit + 1],
    ).fetchall()
    return _page(conn, request, rows, total)


def _field_score(terms: list[str]) -> tuple[str, list[Any]]:
    """PostgreSQL's relevance score (no bm25): minus the sum, over
    ``terms``, of the bm25 weight of each field holding the term; with its
    parameters (four per term)."""
    columns = ("t.fname", "t.ftitle", "t.fdesc", "t.ftags")
    parts = [
        f"CASE WHEN instr({column}, ?) > 0 THEN {weight} ELSE 0 END"
        for _ in terms
        for column, weight in zip(columns, _WEIGHTS, strict=True)
    ]
    params = [term for term in terms for _ in columns]
    return f"CAST(-({' + '.join(parts)}) AS DOUBLE PRECISION)", params


def _broad(conn: sqlite3.Connection, total: int, limit: int) -> bool:
    """Whether walking the tools in (uid, pos) order finds a page sooner
    than sorting every match: about ``limit * tools / total`` rows walked
    against ``total`` rows sorted."""
    tools = int(conn.execute("SELECT coalesce(max(id), 0) FROM dir_search_tools").fetchone()[0])
    return total * total > (limit + 1) * tools


def _in_order(
    conn: sqlite3.Connection, where: list[str], params: list[Any], after: list[Any] | None, limit: int
) -> list[Any]:
    """A catalog-order page walking ``dir_search_tools_order`` and testing
    each tool against the match set, stopping after ``limit + 1`` hits."""
    terms = ["t.id IN (SELECT rowid FROM dir_search_fts WHERE dir_search_fts MATCH ?)", *where[1:]]
    values = list(params)
    if after is not None:
        terms.append("(t.uid, t.pos) > (?, ?)")
        values += after
    return conn.execute(
        "SELECT t.uid, t.pos, t.name, t.description, t.price, t.dynamic, 0.0 "
        "FROM dir_search_tools t INDEXED BY dir_search_tools_order "
        f"WHERE {' AND '.join(terms)} ORDER BY t.uid, t.pos LIMIT ?",
        [*values, limit + 1],
    ).fetchall()


def _scan(
    conn: sqlite3.Connection, request: SearchRequest, now: int, text: str, after: list[Any] | None
) -> SearchPage:
    """The catalog-order answer for a query the trigram table cannot hold
    (a NUL, or the character a NUL is indexed as): the filters in SQL, the
    substring test in Python on every tool they leave."""
    filters, params = _filters(request, now)
    clause = (" WHERE " + " AND ".join(filters)) if filters else ""
    rows = [
        row
        for row in conn.execute(
            "SELECT t.uid, t.pos, t.name, t.description, t.price, t.dynamic, 0.0 "
            f"FROM dir_search_tools t{clause} ORDER BY t.uid, t.pos",
            params,
        )
        if text in go_lower(_shown(conn, row[2])) or text in go_lower(_shown(conn, row[3]))
    ]
    start = 0 if after is None else sum(1 for row in rows if (row[0], row[1]) <= (after[0], after[1]))
    return _page(conn, request, rows[start : start + request.limit + 1], len(rows))


def _page(conn: sqlite3.Connection, request: SearchRequest, rows: list[Any], total: int) -> SearchPage:
    """Hits from up to ``limit + 1`` sorted rows (one more says a next page
    exists) of ``(uid, pos, name, description, price, dynamic, score)``."""
    relevance = request.rank == RANK_RELEVANCE
    more = len(rows) > request.limit
    rows = rows[: request.limit]
    listings = _listing_fields(conn, {row[0] for row in rows})
    hits = []
    for uid, _pos, name, description, price, dynamic, _score in rows:
        tags, checked, verified = listings[uid]
        hits.append(
            SearchHit(
                provider_uid=uid,
                tool=_shown(conn, name),
                description=_shown(conn, description),
                price_atoms=price,
                pricing=PRICING_DYNAMIC if dynamic else "",
                tags=tags,
                catalog_checked_at=checked,
                last_verified_execution=verified,
            )
        )
    next_cursor = ""
    if more and rows:
        uid, pos, name, _d, _p, _dy, value = rows[-1]
        key: list[Any] = (
            [RANK_RELEVANCE, float(value), uid, name, pos] if relevance else [RANK_CATALOG, uid, pos]
        )
        next_cursor = _encode_cursor(key)
    return SearchPage(hits=tuple(hits), total=total, next_cursor=next_cursor, extended=request.extended)


def _listing_fields(conn: sqlite3.Connection, uids: set[str]) -> dict[str, tuple[tuple[str, ...], int, int]]:
    if not uids:
        return {}
    marks = ", ".join("?" * len(uids))
    rows = conn.execute(
        "SELECT uid, tags, catalog_checked_at, last_verified_execution FROM dir_search_listings "
        f"WHERE uid IN ({marks})",
        sorted(uids),
    )
    return {
        uid: (tuple(json.loads(tags)), int(checked), int(verified)) for uid, tags, checked, verified in rows
    }


class SearchIndex:
    """The index in ``harness``'s database, read off the event loop through
    :meth:`brmcp.server.Harness.transact` (so a search is serialised with
    the harness's money movements and sees only committed listings)."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness

    async def search(self, request: SearchRequest, now: int) -> SearchPage:
        """:func:`search` at unix time ``now``. Raises :class:`ShapeError`
        for a foreign cursor, else what sqlite3 raises."""
        return await self._harness.transact(adapt(lambda conn: search(conn, request, now)))

    async def rebuild(self, listings: Iterable[IndexedListing]) -> int:
        """:func:`rebuild_index` in one transaction; returns how many
        listings it indexed."""
        items = list(listings)
        with anyio.CancelScope(shield=True):
            count = await self._harness.transact(adapt(lambda conn: rebuild_index(conn, items)))
        return count
