"""The directory's tables on both store backends (docs/directory.md §Store):
the store-level lifecycle (register, fund, test, approve, list, search,
rate, unlist, snapshot build) run once on SQLite and once on a private
PostgreSQL server (tests/kit/postgres.py; skipped with the reason when none
can be started), the search answers of both compared on random catalogs and
queries, the SQL rewriting, and the policy's ``store`` key."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_

import brmcp.directory.db as search_index
import brmcp.directory.db._ratings as ratings
import brmcp.directory.db._reputation as reputation
from brmcp.directory.db import (
    LISTING_SCHEMA,
    DirectoryStore,
    Lead,
    Listing,
    Peer,
    Registration,
    SearchRequest,
    adapt,
    all_listings,
    changes_since,
    is_postgres,
    put_listing,
    to_postgres,
)
from brmcp.directory.model import (
    STATE_AWAITING_FUNDING,
    STATE_PENDING_REVIEW,
    Policy,
    PolicyError,
    Signer,
    TestSpec,
    build_generation,
    load_policy,
)
from brmcp.directory.tools import snapshot_listing
from brmcp.protocol.payment import PRICE_ATOMS_KEY
from brmcp.protocol.receipts import ReceiptSigner, args_sha256
from brmcp.server import Harness, HarnessConfig
from brmcp.server.store.url import DEFAULT_STORE
from tests.kit.postgres import PostgresServer

PROVIDER = "a" * 64
RATER = "b" * 64
PEER = "c" * 64
LEAD = "d" * 64
NOW = 1_800_000_000
CATALOG = [
    {
        "name": "weather",
        "title": "Weather",
        "description": "Forecast for a city",
        "_meta": {PRICE_ATOMS_KEY: 500},
    },
    {"name": "tides", "description": "Tide tables by port"},
    {"name": "ai", "description": "Ask \x00 anything", "_meta": {"brmcp/pricing": "dynamic"}},
]


@pytest.fixture(params=["sqlite", "postgresql"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    """A started Harness whose book (and the directory's tables) is on
    each backend in turn, with a fixed clock."""
    store = DEFAULT_STORE if request.param == "sqlite" else str(request.getfixturevalue("postgres_url"))
    config = HarnessConfig(data_dir=tmp_path, store=store, clock=lambda: float(NOW))
    async with Harness(config) as running:
        yield running


def registration(**kw: Any) -> Registration:
    base: dict[str, Any] = {
        "uid": PROVIDER,
        "reg_id": "r1",
        "state": STATE_AWAITING_FUNDING,
        "description": "weather and tides",
        "tags": ("sea", "weather"),
        "test": TestSpec(tool="weather", args={"city": "Lisbon"}, max_atoms=800),
        "fee_atoms": 1_000,
        "budget_atoms": 800,
        "renewal": False,
        "created_at": NOW,
    }
    base.update(kw)
    return Registration(**base)


def hits(page: search_index.SearchPage) -> list[tuple[str, str, int, str]]:
    return [(hit.provider_uid, hit.tool, hit.price_atoms, hit.pricing) for hit in page.hits]


async def find(store: DirectoryStore, **request: Any) -> search_index.SearchPage:
    return await store.run(lambda c: search_index.search(c, SearchRequest.from_json(request), NOW))


async def test_the_lifecycle_on_each_backend(harness: Harness, tmp_path: Path) -> None:
    store = DirectoryStore(harness)
    await store.open()
    await store.open()  # a second open finds everything made
    assert await store.register(registration())
    assert not await store.start_if_funded(PROVIDER, NOW)
    await harness.credit(PROVIDER, 1_800)
    assert await store.start_if_funded(PROVIDER, NOW)
    assert not await store.start_if_funded(PROVIDER, NOW)  # the fee is taken once
    assert await store.balance(PROVIDER) == 800
    moved = await store.to_testing(PROVIDER, "r1", json.dumps(CATALOG), "k" * 32)
    assert moved is not None

    spend = await store.launch_spend(
        uid=PROVIDER, tool="weather", atoms=500, call_key="k" * 32, ts=NOW, escrow_reg="r1"
    )
    assert spend is not None
    assert spend.id > 0
    over = await store.launch_spend(
        uid=PROVIDER, tool="weather", atoms=301, call_key="k" * 32, ts=NOW, escrow_reg="r1"
    )
    assert over is None  # 300 atoms left in escrow
    await store.spend_paid(spend.id)
    second = await store.launch_spend(
        uid=PROVIDER, tool="x", atoms=100, call_key="q" * 32, ts=NOW, escrow_reg="r1"
    )
    assert second is not None
    assert second.id > spend.id
    await store.spend_failed(second.id, NOW)  # a definitive failure refunds the escrow, once
    assert await store.balance(PROVIDER) == 300
    assert [s.id for s in await store.spends(uid=PROVIDER)] == [spend.id]
    statement = await harness.statement(PROVIDER)
    assert sum(entry.atoms for entry in statement) == 300

    await store.run(lambda c: reputation.set_run_key(c, PROVIDER, "r1", signer().public_hex))
    state = await store.finish_test(
        PROVIDER, "r1", error="", latency_ms=42, now=NOW, expiry_seconds=86_400, receipt_verified=True
    )
    assert state == STATE_PENDING_REVIEW
    await store.approve(PROVIDER, NOW, 86_400)
    listing = await store.listing(PROVIDER)
    assert listing is not None
    assert listing.tags == ("sea", "weather")
    summary = await store.run(lambda c: reputation.summary(c, PROVIDER))
    assert summary

    # Search: the FTS5 path on SQLite, strpos on PostgreSQL; the same answers.
    assert hits(await find(store, query="WEATHER")) == [(PROVIDER, "weather", 500, "")]
    assert hits(await find(store, query="ti")) == [(PROVIDER, "tides", 0, "")]
    assert hits(await find(store, query="\x00")) == [(PROVIDER, "ai", 0, "dynamic")]
    assert (await find(store, query="\x00")).hits[0].description == "Ask \x00 anything"
    assert hits(await find(store, query="forecast city", rank="relevance")) == [
        (PROVIDER, "weather", 500, "")
    ]
    assert len((await find(store, query="", tags=["sea"])).hits) == 3
    assert (await find(store, query="", tags=["sea", "land"])).hits == ()
    # Catalog order (uid, then position); a dynamic price never passes a ceiling.
    assert hits(await find(store, query="", maxPriceAtoms=600)) == [
        (PROVIDER, "weather", 500, ""),
        (PROVIDER, "tides", 0, ""),
    ]
    assert hits(await find(store, query="", maxPriceAtoms=400)) == [(PROVIDER, "tides", 0, "")]
    assert len((await find(store, query="", verifiedWithinDays=1)).hits) == 3
    first = await find(store, query="", limit=1)
    assert first.total == 3
    assert first.next_cursor
    rest = await find(store, query="", limit=5, cursor=first.next_cursor)
    assert [h.tool for h in first.hits + rest.hits] == ["weather", "tides", "ai"]

    # Ratings: a receipt of the provider's listed key, once.
    signed = signer().sign(
        call_id="c1",
        caller=RATER,
        tool="weather",
        args_digest=args_sha256({}),
        call_key="k",
        atoms=500,
        time=NOW,
    )
    request = ratings.RateIn.from_json(
        {"provider": PROVIDER, "receipt": signed, "stars": 5, "comment": "good"}
    )
    rating = await store.run(lambda c: ratings.rate(c, RATER, request, NOW))
    assert rating.stars == 5
    with pytest.raises(ValueError, match="already used"):
        await store.run(lambda c: ratings.rate(c, RATER, request, NOW + 86_400))
    page = await store.run(
        lambda c: ratings.ratings_page(c, ratings.RatingsIn.from_json({"provider": PROVIDER}))
    )
    assert [r["stars"] for r in page["ratings"]] == [5]

    # Peers, leads and flags round-trip.
    await store.put_peer(Peer(PEER, "ab" * 32, NOW, 0))
    await store.put_peer(Peer(PEER, "cd" * 32, NOW, 0))  # replaced, not doubled
    assert [p.pub_key for p in await store.peers()] == ["cd" * 32]
    assert await store.add_leads([Lead(LEAD, PEER, "new", NOW, NOW, "lead")]) == 1
    assert await store.add_leads([Lead(LEAD, PEER, "new", NOW, NOW, "lead")]) == 0
    await store.set_flag(PROVIDER, "watch")
    assert await store.flag(PROVIDER) == "watch"

    # The snapshot: built from the listings read back, then the removal.
    signer_key = Signer.load_or_create(tmp_path / "snapshotkey.json")
    listed = await store.run(lambda c: [snapshot_listing(item) for item in all_listings(c)])
    generation = build_generation(signer_key, listed, NOW)
    assert generation.pages
    assert generation.manifest
    await store.unlist(PROVIDER)
    assert (await find(store, query="weather")).hits == ()
    _, upserts, removals = await store.run(lambda c: changes_since(c, NOW - 1))
    assert upserts == []
    assert removals == [PROVIDER]


def signer() -> ReceiptSigner:
    return ReceiptSigner(Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32), bot=PROVIDER)


# -- the two backends' search answers, compared ---------------------------------------------------


WORDS = [
    "sea",
    "Tide",
    "wea",
    "ther",
    "ab",
    "x",
    "ÄÖ",
    "İ",
    "%",
    "_",
    "'",
    '"',
    "?",
    "\x00",
    "\ufdd0",
    "\ufdd1",
    "\ufdd3",
    "a b",
]
TEXT = st_.lists(st_.sampled_from(WORDS), max_size=4).map("".join)
TOOL = st_.fixed_dictionaries(
    {"name": TEXT, "description": TEXT, "title": TEXT},
    optional={
        "_meta": st_.sampled_from(
            [{PRICE_ATOMS_KEY: 10}, {PRICE_ATOMS_KEY: 2000}, {"brmcp/pricing": "dynamic"}]
        )
    },
)
LISTINGS = st_.lists(
    st_.tuples(
        st_.lists(TOOL, max_size=4),
        st_.lists(st_.sampled_from(["sea", "land", "ai"]), max_size=2, unique=True),
    ),
    max_size=5,
)
QUERY = st_.fixed_dictionaries(
    {
        "query": TEXT,
        "rank": st_.sampled_from(["catalog", "relevance"]),
        "limit": st_.integers(1, 4),
    },
    optional={
        "tags": st_.lists(st_.sampled_from(["sea", "land"]), max_size=2),
        "maxPriceAtoms": st_.sampled_from([0, 100]),
        "verifiedWithinDays": st_.sampled_from([0, 2]),
    },
)


def _listing(n: int, tools: list[dict[str, Any]], tags: list[str]) -> Listing:
    return Listing(
        uid=f"{n:x}" * 64 if n < 16 else "f" * 64,
        description="d",
        tags=tuple(sorted(tags)),
        test=TestSpec("t", None, 1),
        catalog=json.dumps(tools),
        catalog_checked_at=NOW,
        last_verified_execution=NOW - n * 86_400,
        test_latency_ms=0,
        approved_at=NOW,
        renewed_at=NOW,
        expires_at=NOW + 86_400,
    )


def _create(conn: sqlite3.Connection) -> None:
    for statement in LISTING_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    search_index.create_index(conn)
    reputation.open_tables(conn)
    ratings.open_tables(conn)


def _replace_all(conn: sqlite3.Connection, listings: list[Listing]) -> None:
    conn.execute("DELETE FROM dir_listings")
    for item in listings:
        put_listing(conn, item)
    search_index.rebuild_index(conn, listings)


def _all_pages(conn: sqlite3.Connection, *, query: dict[str, Any]) -> tuple[int, list[tuple[str, str, str]]]:
    found: list[tuple[str, str, str]] = []
    cursor = ""
    for _ in range(40):
        page = search_index.search(conn, SearchRequest.from_json({**query, "cursor": cursor}), NOW)
        found += [(h.provider_uid, h.tool, h.description) for h in page.hits]
        if not page.next_cursor:
            return page.total, found
        cursor = page.next_cursor
    raise AssertionError("the cursor never ended")


@pytest.fixture(scope="module")
def pg_executor(postgres_server: PostgresServer) -> Iterator[Any]:
    from brmcp.server.store.postgres import PostgresExecutor
    from brmcp.server.store.url import parse_store_url

    url = postgres_server.create_database("search")
    executor = PostgresExecutor(parse_store_url(url))
    try:
        executor.run_now(adapt(_create))
        yield executor
    finally:
        executor.close()
        postgres_server.drop_database(url)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(LISTINGS, st_.lists(QUERY, min_size=1, max_size=4))
def test_postgresql_search_answers_as_sqlite_does(
    pg_executor: Any, catalogs: list[tuple[list[dict[str, Any]], list[str]]], queries: list[dict[str, Any]]
) -> None:
    """Whatever the catalogs (case, non-ASCII, SQL and LIKE metacharacters,
    quotes, NUL and its mark) and queries, PostgreSQL finds the same hits
    and total as SQLite's FTS5 index, walking every page by cursor: in the
    same order for ``catalog``, the same set for ``relevance`` (whose score
    is bm25 only on SQLite)."""
    listings = [_listing(n, tools, tags) for n, (tools, tags) in enumerate(catalogs)]
    lite = sqlite3.connect(":memory:")
    try:
        _create(lite)
        _replace_all(lite, listings)
        pg_executor.run_now(adapt(lambda c: _replace_all(c, listings)))
        for query in queries:
            expected_total, expected = _all_pages(lite, query=query)
            total, got = pg_executor.run_now(adapt(partial(_all_pages, query=query)))
            assert total == expected_total == len(expected)
            if query["rank"] == "catalog":
                assert got == expected
            else:
                assert sorted(got) == sorted(expected)
                assert len(got) == len(expected)
    finally:
        lite.close()


# -- the rewriting ---------------------------------------------------------------------------


def test_sqlite_sql_runs_as_written() -> None:
    lite = sqlite3.connect(":memory:")
    seen: list[Any] = []
    adapt(lambda c: seen.append(c))(lite)
    assert seen == [lite]
    assert not is_postgres(lite)


def test_postgresql_rewrites() -> None:
    assert to_postgres("INSERT OR IGNORE INTO dir_history_totals (uid) VALUES (?)") == (
        "INSERT INTO dir_history_totals (uid) VALUES (?) ON CONFLICT DO NOTHING"
    )
    assert to_postgres("INSERT OR REPLACE INTO dir_flags (uid, note) VALUES (?, ?)") == (
        "INSERT INTO dir_flags (uid, note) VALUES (?, ?) ON CONFLICT (uid) DO UPDATE SET note = excluded.note"
    )
    assert (
        "ON CONFLICT (uid, scope) DO UPDATE SET reg_id = excluded.reg_id, key = excluded.key"
        in to_postgres(
            "INSERT OR REPLACE INTO dir_receipt_keys (uid, scope, reg_id, key) VALUES (?, 'run', ?, ?)"
        )
    )
    ddl = to_postgres(
        "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY AUTOINCREMENT, v REAL, s TEXT) WITHOUT ROWID"
    )
    assert ddl == (
        "CREATE TABLE IF NOT EXISTS t (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, "
        'v DOUBLE PRECISION, s TEXT COLLATE "C")'
    )
    rewritten = to_postgres("SELECT 1 WHERE instr(a, ?) > 0 AND x IN (SELECT value FROM json_each(?))")
    assert rewritten == (
        "SELECT 1 WHERE strpos(a, ?) > 0 AND x IN "
        "(SELECT value FROM json_array_elements_text(CAST(? AS json)))"
    )
    with pytest.raises(ValueError, match="PRIMARY_KEYS"):
        to_postgres("INSERT OR REPLACE INTO unknown_table (a) VALUES (?)")


# -- the policy's store key -------------------------------------------------------------------


def test_the_store_key(tmp_path: Path) -> None:
    path = tmp_path / "brmcpdir.json"
    path.write_text(json.dumps({"store": "postgresql://dir:s3cret@db.example/brmcpdir"}))
    policy = load_policy(path)
    assert policy.store == "postgresql://dir:s3cret@db.example/brmcpdir"
    assert "s3cret" not in repr(policy)
    path.write_text("{}")
    assert load_policy(path).store == DEFAULT_STORE == Policy().store
    path.write_text(json.dumps({"Store": "sqlite:"}))
    assert load_policy(path).store == "sqlite:"


@pytest.mark.parametrize(
    "value",
    ["mysql://dir:s3cret@db/x", "postgresql://dir:s3cret@db:99999/x", "postgresql://dir:s3cret@db/x\ny"],
)
def test_a_bad_store_is_one_line_naming_file_key_and_forms(tmp_path: Path, value: str) -> None:
    path = tmp_path / "brmcpdir.json"
    path.write_text(json.dumps({"store": value}))
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert "\n" not in message
    assert "s3cret" not in message
    assert str(path) in message
    assert '"store"' in message
    assert "sqlite:" in message
    assert "postgresql://" in message


def test_a_store_of_the_wrong_kind(tmp_path: Path) -> None:
    path = tmp_path / "brmcpdir.json"
    path.write_text(json.dumps({"store": 5}))
    with pytest.raises(PolicyError, match=r'key "store".*a string'):
        load_policy(path)
