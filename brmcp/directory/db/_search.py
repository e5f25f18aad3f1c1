"""The directory's search over its index (docs/directory.md §Search; the
tables are written by :mod:`._index`).

Matching. The default answer is the Go reference's linear scan
(karamble/brmcp, ``directory/tools.go``, ``handleSearch``; here
:func:`brmcp.directory.tools._public.search_listings`): the query, trimmed and
lowercased as Go does (:func:`brmcp.directory.model._types.go_trim_space`,
:func:`~brmcp.directory.model._types.go_lower`), as a substring of a tool's name
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
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from brmcp.protocol.payment import PRICING_DYNAMIC

from ..model import (
    MAX_SEARCH_HITS,
    SearchHit,
    SearchIn,
    ShapeError,
    go_lower,
    go_trim_space,
    normalize_tags,
)
from ._index import (
    NUL_MARK,
    IndexedListing,
    clean_text,
    fold_text,
    rebuild_index,
    shown_text,
)
from ._sql import adapt, is_postgres

if TYPE_CHECKING:
    from brmcp.server import Harness

__all__ = [
    "EXTENSION_PROPERTIES",
    "MAX_VERIFIED_WITHIN_DAYS",
    "RANKS",
    "RANK_CATALOG",
    "RANK_RELEVANCE",
    "SearchIndex",
    "SearchPage",
    "SearchRequest",
    "cursor_refusal",
    "fts_query",
    "search",
]

#: ``rank`` values: the Go reference's order (provider uid, then catalog
#: order) or bm25 relevance.
RANK_CATALOG = "catalog"
RANK_RELEVANCE = "relevance"
RANKS = (RANK_CATALOG, RANK_RELEVANCE)
#: The largest ``verifiedWithinDays`` accepted (100 years).
MAX_VERIFIED_WITHIN_DAYS = 36_500
#: bm25 column weights for name, title, description, tags.
_WEIGHTS = (8.0, 4.0, 1.0, 2.0)
_DAY = 86_400
#: The extension keys of ``search``'s input schema (docs/directory.md §Search).
EXTENSION_PROPERTIES: dict[str, Any] = {
    "rank": {"type": "string", "enum": list(RANKS)},
    "cursor": {"type": "string"},
    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_HITS},
    "verifiedWithinDays": {"type": "integer", "minimum": 0, "maximum": MAX_VERIFIED_WITHIN_DAYS},
}


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
    wanted = [clean_text(tag) for tag in normalize_tags(request.base.tags)]
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
    return len(term) >= 3 and NUL_MARK not in term


def _match(request: SearchRequest, fts: bool = True) -> tuple[str, list[str], list[Any]]:
    """The FROM clause, WHERE terms and their parameters for the text;
    without ``fts`` (PostgreSQL) every term is an ``instr`` test."""
    text = fold_text(go_trim_space(request.base.query))
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
    text = clean_text(go_lower(go_trim_space(request.base.query)))
    if not relevance and ("\x00" in text or NUL_MARK in text):
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
        term for term in dict.fromkeys(fold_text(go_trim_space(request.base.query)).split()) if _indexed(term)
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
        if text in go_lower(shown_text(conn, row[2])) or text in go_lower(shown_text(conn, row[3]))
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
                tool=shown_text(conn, name),
                description=shown_text(conn, description),
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
