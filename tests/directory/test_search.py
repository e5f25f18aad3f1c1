"""The directory's FTS5 search index (brmcp/directory/db/_search.py,
docs/directory.md §Search): the default answer equals the Go reference's
linear scan on random catalogs and queries, relevance ranking, the
filters, keyset pages that neither repeat nor skip a hit on ties, user text
that cannot act as FTS5 syntax, and updates that touch only the listing's
own rows, through the store's transactions."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import brmcp.directory.db as dstore
import brmcp.directory.db as search_index
import brmcp.directory.db._search as search_query
from brmcp.directory.db import (
    RANK_CATALOG,
    RANK_RELEVANCE,
    DirectoryStore,
    Listing,
    SearchIndex,
    SearchRequest,
    create_index,
    fts_query,
    index_listing,
    rebuild_index,
    unindex_listing,
)
from brmcp.directory.model import (
    MAX_SEARCH_HITS,
    SearchIn,
    ShapeError,
    TestSpec,
    go_lower,
    go_trim_space,
    normalize_tags,
)
from brmcp.directory.tools import search_listings, tool_price
from brmcp.server import Harness, HarnessConfig

DAY = 86_400
NOW = 1_790_000_000


def listing(uid: str, tools: list[Any], *, tags: tuple[str, ...] = (), verified: int = NOW) -> Listing:
    return Listing(
        uid=uid,
        description="a provider",
        tags=tags,
        test=TestSpec(tool="t", args=None, max_atoms=1),
        catalog=json.dumps(tools),
        catalog_checked_at=verified,
        last_verified_execution=verified,
        test_latency_ms=5,
        approved_at=verified,
        renewed_at=0,
        expires_at=verified + 30 * DAY,
    )


def tool(name: str, description: str = "", price: int | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "description": description, **extra}
    if price is not None:
        out["_meta"] = {"brmcp/priceAtoms": price}
    return out


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(":memory:")
    create_index(db)
    yield db
    db.close()


def fresh(listings: list[Listing]) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    create_index(db)
    rebuild_index(db, listings)
    return db


def ask(db: sqlite3.Connection, **args: Any) -> dict[str, Any]:
    return search_index.search(db, SearchRequest.from_json(args), NOW).to_json()


def pages(db: sqlite3.Connection, **args: Any) -> list[tuple[str, str]]:
    """Every hit of a search, page by page, as ``(providerUid, tool)``."""
    seen: list[tuple[str, str]] = []
    cursor = ""
    while True:
        out = ask(db, **args, **({"cursor": cursor} if cursor else {}))
        seen += [(hit["providerUid"], hit["tool"]) for hit in out["hits"]]
        cursor = out.get("nextCursor", "")
        if not cursor:
            return seen


# -- equivalence with the linear scan ----------------------------------------------------

# Mixed case, Go/Python folding differences, FTS5 operators and white space.
_ALPHABET = st.sampled_from(
    [*'abcABC xyz"*-:^(){}.\tİΣß\u03c3\u212a\x00', "NEAR", "OR", "AND", "eath", "\ufdd0"]
)
_TEXT = st.lists(_ALPHABET, max_size=8).map("".join)
_PRICE_META = st.one_of(
    st.none(),
    st.fixed_dictionaries({"brmcp/priceAtoms": st.integers(-5, 40)}),
    st.fixed_dictionaries({"brmcp/priceAtoms": st.floats(0, 40, allow_nan=False)}),
    st.fixed_dictionaries(
        {"brmcp/priceAtoms": st.sampled_from([2**63, -(2**64), 1e30, float("inf"), float("nan")])}
    ),
    st.fixed_dictionaries({"brmcp/priceAtoms": st.booleans()}),
    st.just({"brmcp/pricing": "dynamic"}),
)
_TOOL = st.one_of(
    st.fixed_dictionaries(
        {"name": _TEXT, "description": _TEXT}, optional={"_meta": _PRICE_META, "title": _TEXT}
    ),
    st.fixed_dictionaries({"name": st.integers(), "description": st.none()}),
    st.just("not a tool"),
)
_TAG = st.sampled_from(["a", "b", "Weather", "weather", "c d"])
_CATALOG = st.one_of(
    st.lists(_TOOL, max_size=6).map(json.dumps), st.sampled_from(["", "{}", "not json", "7"])
)


@st.composite
def catalogs(draw: st.DrawFn) -> list[Listing]:
    uids = draw(st.lists(st.sampled_from(["p1", "p2", "P3", "p10", "zz", "é"]), unique=True, max_size=6))
    out = []
    for uid in uids:
        base = listing(uid, [], tags=tuple(draw(st.lists(_TAG, max_size=3))))
        out.append(replace(base, catalog=draw(_CATALOG)))
    return out


@st.composite
def queries(draw: st.DrawFn, items: list[Listing]) -> SearchIn:
    names = [
        str(t.get(key))
        for item in items
        for t in (json.loads(item.catalog) if item.catalog.startswith("[") else [])
        if isinstance(t, dict)
        for key in ("name", "description")
        if isinstance(t.get(key), str) and t.get(key)
    ]
    from_names: bool = draw(st.booleans())
    if names and from_names:
        source = draw(st.sampled_from(names))
        start = draw(st.integers(0, len(source)))
        text = source[start : draw(st.integers(start, len(source)))]
        text = draw(st.sampled_from([text, text.upper(), f"  {text} "]))
    else:
        text = draw(_TEXT)
    return SearchIn(
        query=text,
        tags=tuple(draw(st.lists(_TAG, max_size=2))),
        max_price_atoms=draw(st.sampled_from([0, 0, 1, 10, 30])),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_default_answer_equals_the_linear_scan(data: st.DataObject) -> None:
    items = data.draw(catalogs())
    db = fresh(items)
    try:
        for _ in range(4):
            query = data.draw(queries(items))
            want = search_listings(items, query).to_json()
            # Both page plans: sorting every match, and walking in order.
            for broad in (False, True):
                with mock.patch.object(search_query, "_broad", lambda *_args, b=broad: b):
                    got = search_index.search(db, SearchRequest(base=query), NOW).to_json()
                assert got == want, (query, broad)
    finally:
        db.close()


def relevance_reference(items: list[Listing], query: SearchIn) -> list[tuple[str, str]]:
    """What ``rank: "relevance"`` must find, as ``(uid, tool)``: every
    whitespace-separated term in the name, title, description or tags."""
    # Relevance search reads a NUL as U+FDD0, in the query and in the text alike.
    terms = go_lower(go_trim_space(query.query)).replace("\x00", "\ufdd0").split()
    wanted = set(normalize_tags(query.tags))
    out = []
    for item in items:
        if not wanted <= set(item.tags):
            continue
        try:
            catalog = json.loads(item.catalog)
        except ValueError:
            continue
        for entry in catalog if isinstance(catalog, list) else []:
            if not isinstance(entry, dict):
                continue
            texts = [entry.get(key) for key in ("name", "title", "description")]
            fields = [go_lower(text) if isinstance(text, str) else "" for text in texts]
            fields.append(" ".join(go_lower(tag) for tag in item.tags))
            fields = [text.replace("\x00", "\ufdd0") for text in fields]
            price, dynamic = tool_price(entry.get("_meta"))
            if query.max_price_atoms > 0 and (dynamic or price > query.max_price_atoms):
                continue
            if all(any(term in field for field in fields) for term in terms):
                out.append((item.uid, _name(entry)))
    return sorted(out)


def _name(entry: dict[str, Any]) -> str:
    return entry["name"] if isinstance(entry.get("name"), str) else ""


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_relevance_finds_every_term_and_pages_cover_it_once(data: st.DataObject) -> None:
    items = data.draw(catalogs())
    db = fresh(items)
    try:
        for _ in range(3):
            query = data.draw(queries(items))
            want = relevance_reference(items, query)
            args = {"query": query.query, "tags": list(query.tags), "maxPriceAtoms": query.max_price_atoms}
            got = pages(db, **args, rank=RANK_RELEVANCE, limit=3)
            assert sorted(got) == want, query
            assert ask(db, **args, rank=RANK_RELEVANCE)["total"] == len(want)
    finally:
        db.close()


def test_cap_and_total_match_the_scan_beyond_fifty(conn: sqlite3.Connection) -> None:
    items = [listing(f"p{i:03d}", [tool(f"weather{j}", "rain") for j in range(3)]) for i in range(40)]
    rebuild_index(conn, items)
    for text in ("eath", "", "ra", "weather2", "nothing"):
        want = search_listings(items, SearchIn(query=text)).to_json()
        assert ask(conn, query=text) == want
        assert len(want["hits"]) == (MAX_SEARCH_HITS if want["total"] > MAX_SEARCH_HITS else want["total"])
    assert ask(conn, query="eath")["total"] == 120


def test_go_shaped_request_gets_no_cursor(conn: sqlite3.Connection) -> None:
    rebuild_index(conn, [listing(f"p{i:03d}", [tool("t")]) for i in range(60)])
    assert set(ask(conn)) == {"hits", "total"}
    assert set(ask(conn, limit=10)) == {"hits", "total", "nextCursor"}


# -- ranking ---------------------------------------------------------------------------


def test_relevance_puts_name_matches_first(conn: sqlite3.Connection) -> None:
    rebuild_index(
        conn,
        [
            listing("p1", [tool("convert", "turns weather data into csv")]),
            listing("p2", [tool("weather", "current conditions")]),
            listing("p3", [tool("forecast", "weather forecast for a city", title="Weather forecast")]),
            listing("p4", [tool("stocks", "prices")], tags=("weather",)),
        ],
    )
    catalog = [hit["providerUid"] for hit in ask(conn, query="weather")["hits"]]
    assert catalog == ["p1", "p2", "p3"]  # the Go order, tags not searched
    ranked = [hit["providerUid"] for hit in ask(conn, query="weather", rank=RANK_RELEVANCE)["hits"]]
    assert ranked[0] == "p2"
    assert ranked[1] == "p3"  # name misses, title and description hit
    assert set(ranked) == {"p1", "p2", "p3", "p4"}  # relevance also searches tags


def test_relevance_requires_every_term(conn: sqlite3.Connection) -> None:
    rebuild_index(
        conn,
        [
            listing("p1", [tool("weather", "forecast by city")]),
            listing("p2", [tool("weather", "radar images")]),
            listing("p3", [tool("city", "maps of a city")]),
        ],
    )
    assert pages(conn, query="weather  CITY", rank=RANK_RELEVANCE) == [("p1", "weather")]
    # A term under three characters filters without ranking.
    assert pages(conn, query="weather by", rank=RANK_RELEVANCE) == [("p1", "weather")]
    assert ask(conn, query="weather by", rank=RANK_RELEVANCE)["total"] == 1
    assert ask(conn, query="weather", rank=RANK_RELEVANCE, tags=["x"])["total"] == 0
    assert pages(conn, query="of", rank=RANK_RELEVANCE) == [("p3", "city")]


# -- filters ---------------------------------------------------------------------------


def test_price_ceiling_drops_dearer_and_dynamic(conn: sqlite3.Connection) -> None:
    rebuild_index(
        conn,
        [
            listing(
                "p1",
                [
                    tool("cheap", price=5),
                    tool("dear", price=50),
                    tool("free"),
                    {"name": "metered", "_meta": {"brmcp/pricing": "dynamic"}},
                ],
            )
        ],
    )
    assert [h["tool"] for h in ask(conn, maxPriceAtoms=10)["hits"]] == ["cheap", "free"]
    dynamic = [h for h in ask(conn)["hits"] if h["tool"] == "metered"]
    assert dynamic[0]["pricing"] == "dynamic"


def test_all_tags_required(conn: sqlite3.Connection) -> None:
    rebuild_index(
        conn,
        [
            listing("p1", [tool("a")], tags=("weather", "maps")),
            listing("p2", [tool("b")], tags=("weather",)),
            listing("p3", [tool("c")], tags=("maps",)),
        ],
    )
    assert [h["providerUid"] for h in ask(conn, tags=["Weather "])["hits"]] == ["p1", "p2"]
    assert [h["providerUid"] for h in ask(conn, tags=["maps", "weather", "MAPS"])["hits"]] == ["p1"]
    assert ask(conn, tags=["nope"]) == {"hits": [], "total": 0}


def test_verified_within_days(conn: sqlite3.Connection) -> None:
    rebuild_index(
        conn,
        [
            listing("fresh", [tool("t")], verified=NOW - DAY),
            listing("edge", [tool("t")], verified=NOW - 7 * DAY),
            listing("stale", [tool("t")], verified=NOW - 8 * DAY),
        ],
    )
    assert [h["providerUid"] for h in ask(conn, verifiedWithinDays=7)["hits"]] == ["edge", "fresh"]
    assert ask(conn, verifiedWithinDays=0)["total"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"rank": "best"}, "search.rank: 'best' is not one of catalog, relevance"),
        ({"limit": 0}, "search.limit: 0 is not a whole number in 1..50"),
        ({"limit": 51}, "search.limit: 51 is not a whole number in 1..50"),
        ({"limit": "5"}, "search.limit: '5' is not a whole number in 1..50"),
        ({"verifiedWithinDays": -1}, "search.verifiedWithinDays: -1 is not a whole number in 0..36500"),
        ({"cursor": 5}, "search.cursor: expected a string, got int"),
        ({"cursor": "%%%"}, "search.cursor: not a nextCursor of a 'catalog' search"),
    ],
)
def test_bad_extension_keys_name_key_value_and_range(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ShapeError) as caught:
        SearchRequest.from_json(args)
    assert str(caught.value) == message


def test_cursor_of_the_other_rank_is_refused(conn: sqlite3.Connection) -> None:
    rebuild_index(conn, [listing(f"p{i}", [tool("t")]) for i in range(5)])
    cursor = ask(conn, limit=2)["nextCursor"]
    with pytest.raises(ShapeError, match="not a nextCursor of a 'relevance' search"):
        SearchRequest.from_json({"cursor": cursor, "rank": RANK_RELEVANCE})


# -- pagination ------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [RANK_CATALOG, RANK_RELEVANCE])
@pytest.mark.parametrize("limit", [1, 3, 7, 50])
def test_pages_neither_repeat_nor_skip_on_ties(conn: sqlite3.Connection, rank: str, limit: int) -> None:
    # 30 providers with identical tools: every relevance score ties.
    items = [listing(f"p{i:02d}", [tool("weather", "rain"), tool("weather", "rain")]) for i in range(30)]
    rebuild_index(conn, items)
    got = pages(conn, query="weather", rank=rank, limit=limit)
    assert len(got) == 60
    assert got == sorted(got)
    whole = ask(conn, query="weather", rank=rank, limit=50)
    assert whole["total"] == 60


def test_pages_survive_a_listing_published_between_them(conn: sqlite3.Connection) -> None:
    rebuild_index(conn, [listing(f"p{i:02d}", [tool("t")]) for i in range(10)])
    first = ask(conn, limit=4)
    index_listing(conn, listing("p00a", [tool("t")]))  # sorts into the first page
    index_listing(conn, listing("p99", [tool("t")]))  # sorts after all
    second = ask(conn, limit=50, cursor=first["nextCursor"])
    seen = [h["providerUid"] for h in first["hits"] + second["hits"]]
    assert seen == [f"p{i:02d}" for i in range(10)] + ["p99"]
    assert second["total"] == 12


# -- injection -------------------------------------------------------------------------

HOSTILE = [
    '"',
    '""',
    'a"b',
    '"weather',
    "NEAR(weather rain)",
    "weather NEAR rain",
    "weath*",
    "*",
    "-weather",
    "weather -rain",
    "name:weather",
    "{name description}: weather",
    "description : rain",
    "weather OR rain",
    "weather AND NOT rain",
    "^weather",
    "(weather",
    ")",
    "weather + rain",
    "'; DROP TABLE dir_search_fts; --",
    "\x00weather",
]


@pytest.mark.parametrize("text", HOSTILE)
@pytest.mark.parametrize("rank", [RANK_CATALOG, RANK_RELEVANCE])
def test_fts5_syntax_in_user_text_is_literal(conn: sqlite3.Connection, text: str, rank: str) -> None:
    items = [
        listing("p1", [tool("weather", "rain today")]),
        listing("p2", [tool(text, "a tool named after the query")]),
    ]
    rebuild_index(conn, items)
    out = ask(conn, query=text, rank=rank)
    assert ("p2", text) in [(h["providerUid"], h["tool"]) for h in out["hits"]]
    if rank == RANK_CATALOG:
        assert out == search_listings(items, SearchIn(query=text)).to_json()
    assert conn.execute("SELECT count(*) FROM dir_search_tools").fetchone()[0] == 2
    _check(conn)


def test_fts_query_quotes_every_term() -> None:
    assert fts_query(['a"b', "NEAR"]) == '"a""b" "NEAR"'
    assert fts_query(["x"], ("name", "description")) == '{name description} : ("x")'
    with pytest.raises(ValueError, match="at least one term"):
        fts_query([])


# -- incremental updates through the store ----------------------------------------------


def _check(db: sqlite3.Connection) -> None:
    """FTS5's own check that its index agrees with the tool rows (raises
    ``sqlite3.DatabaseError`` when not)."""
    db.execute("INSERT INTO dir_search_fts (dir_search_fts, rank) VALUES ('integrity-check', 1)")


def _rows(db: sqlite3.Connection, uid: str) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT id, pos, name FROM dir_search_tools WHERE uid = ? ORDER BY pos", (uid,)
    ).fetchall()


def test_update_touches_only_the_listing_rows(conn: sqlite3.Connection) -> None:
    rebuild_index(conn, [listing("p1", [tool("alpha")]), listing("p2", [tool("beta"), tool("gamma")])])
    before = _rows(conn, "p2")
    index_listing(conn, listing("p1", [tool("delta")]))
    assert _rows(conn, "p2") == before
    assert [h["tool"] for h in ask(conn, query="alpha")["hits"]] == []
    assert [h["tool"] for h in ask(conn, query="delta")["hits"]] == ["delta"]
    unindex_listing(conn, "p1")
    assert _rows(conn, "p2") == before
    assert ask(conn)["total"] == 2
    assert conn.execute("SELECT count(*) FROM dir_search_tags WHERE uid = 'p1'").fetchone()[0] == 0
    _check(conn)
    assert ask(conn, query="alpha") == ask(conn, query="delt") == {"hits": [], "total": 0}


async def test_store_keeps_the_index_in_step(tmp_path: Path) -> None:
    async with Harness(HarnessConfig(data_dir=tmp_path)) as harness:
        store = DirectoryStore(harness)
        await store.open()
        index = SearchIndex(harness)

        async def names(text: str = "") -> list[str]:
            page = await index.search(SearchRequest(base=SearchIn(query=text)), NOW)
            return [f"{hit.provider_uid}/{hit.tool}" for hit in page.hits]

        await harness.transact(lambda c: dstore.put_listing(c, listing("p1", [tool("weather")])))
        await harness.transact(
            lambda c: dstore.put_listing(c, listing("p2", [tool("maps")], verified=NOW - 40 * DAY))
        )
        assert await names() == ["p1/weather", "p2/maps"]
        assert await store.recrawled("p1", json.dumps([tool("radar")]), NOW) is not None
        assert await names("eath") == []
        assert await names("rad") == ["p1/radar"]
        assert await store.expire("p2", NOW)  # lapsed 10 days ago
        assert await names() == ["p1/radar"]
        await harness.transact(_check)
        await store.unlist("p1")
        assert await names() == []
        assert (
            await harness.transact(lambda c: c.execute("SELECT count(*) FROM dir_search_tools").fetchone()[0])
            == 0
        )
        await harness.transact(_check)


async def test_open_rebuilds_an_index_missing_or_out_of_step(tmp_path: Path) -> None:
    async with Harness(HarnessConfig(data_dir=tmp_path)) as harness:
        store = DirectoryStore(harness)
        await store.open()
        for item in (listing("p1", [tool("p1tool")]), listing("p2", [tool("p2tool")])):
            await harness.transact(partial(dstore.put_listing, item=item))

        def drop(conn: sqlite3.Connection) -> None:
            for table in ("dir_search_fts", "dir_search_tools", "dir_search_tags"):
                conn.execute(f"DROP TABLE {table}")
            conn.execute("DELETE FROM dir_search_listings WHERE uid = 'p2'")

        await harness.transact(drop)
    async with Harness(HarnessConfig(data_dir=tmp_path)) as harness:
        await DirectoryStore(harness).open()
        page = await SearchIndex(harness).search(SearchRequest(), NOW)
        assert [hit.tool for hit in page.hits] == ["p1tool", "p2tool"]


def test_require_fts5_names_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoFts5:
        def execute(self, sql: str, *args: Any) -> None:
            raise sqlite3.OperationalError("no such module: fts5")

    with pytest.raises(search_index.Fts5Unavailable, match=rf"this sqlite3 is {sqlite3.sqlite_version}"):
        search_index.require_fts5(NoFts5())  # type: ignore[arg-type]
