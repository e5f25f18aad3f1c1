"""The index in signed pages and the changes since a generation
(brmcp/directory/model/_pages.py and pagetools.py, docs/directory.md §Snapshot
pages): tampering, pages swapped across generations and directories,
missing pages, changes applied to an old copy, the tombstone horizon and
the tools' entitlements."""

from __future__ import annotations

import base64
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

import brmcp.directory.db as search_index
from brmcp.directory import Directory
from brmcp.directory.db import (
    CHANGES_OVERLAP_SECONDS,
    LISTING_SCHEMA,
    NOT_ENTITLED,
    TOMBSTONE_DAYS,
    TOO_OLD,
    Listing,
    all_listings,
    changes_since,
    open_page_tables,
    put_listing,
    record_removal,
    tombstone_horizon,
)
from brmcp.directory.model import (
    Generation,
    PagesError,
    PagesRefused,
    Signer,
    SnapshotListing,
    SnapshotMirror,
    TestSpec,
    build_changes_payload,
    build_generation,
    fetch_pages,
    verify_changes,
    verify_manifest,
    verify_page,
    verify_snapshot,
)
from brmcp.directory.tools import snapshot_listing

from .stack import (
    ADMIN,
    CALLER,
    DAY,
    DIRECTORY,
    FAST,
    PEER_DIR,
    START,
    Stack,
    directory_stack,
)

NOW = int(START)
CATALOG = '[{"name":"fortune","description":"tells one","_meta":{"brmcp/priceAtoms":5}}]'


def signer() -> Signer:
    return Signer(Ed25519PrivateKey.generate())


def uid_of(n: int) -> str:
    return f"{n:064x}"


def snap(n: int, *, description: str = "d", checked: int = NOW) -> SnapshotListing:
    return SnapshotListing(
        uid=uid_of(n), description=description, catalog=CATALOG, tags=("x",), catalog_checked_at=checked
    )


def row(n: int, *, description: str = "d", at: int = NOW) -> Listing:
    return Listing(
        uid=uid_of(n),
        description=description,
        tags=("x",),
        test=TestSpec(tool="fortune", max_atoms=5),
        catalog=CATALOG,
        catalog_checked_at=at,
        last_verified_execution=at,
        test_latency_ms=1,
        approved_at=at,
        renewed_at=0,
        expires_at=at + 30 * DAY,
    )


def tampered(signed: dict[str, str], position: int) -> dict[str, str]:
    payload = bytearray(base64.b64decode(signed["payload"]))
    payload[position % len(payload)] ^= 0x01
    return {**signed, "payload": base64.b64encode(bytes(payload)).decode()}


def generation(
    count: int = 40, *, at: int = NOW, key: Signer | None = None, max_bytes: int = 1200
) -> Generation:
    return build_generation(key or signer(), [snap(n) for n in range(count)], at, max_bytes=max_bytes)


# -- pages --------------------------------------------------------------------------


def test_pages_assemble_to_the_full_snapshot_and_stay_within_the_bound() -> None:
    key = signer()
    listings = [snap(n, description="é" * (n % 7)) for n in reversed(range(60))]
    gen = build_generation(key, listings, NOW, max_bytes=1500)
    manifest = verify_manifest(gen.manifest, key.public_hex)
    assert len(manifest.pages) > 5
    assert manifest.total == 60
    assert manifest.page_size == 1500
    for signed in gen.pages:
        assert len(base64.b64decode(signed["payload"])) <= 1500
    mirror = SnapshotMirror(key.public_hex)
    mirror.load(gen.manifest, gen.pages)
    full = verify_snapshot(key.build_snapshot(listings, NOW), key.public_hex)
    assert mirror.snapshot() == full.listings
    assert mirror.generated_at == NOW


def test_a_listing_larger_than_the_bound_is_a_page_of_its_own() -> None:
    key = signer()
    gen = build_generation(key, [snap(1, description="y" * 5000), snap(2), snap(3)], NOW, max_bytes=1000)
    manifest = verify_manifest(gen.manifest, key.public_hex)
    assert [ref.count for ref in manifest.pages] == [1, 2]


def test_an_empty_index_has_no_pages() -> None:
    key = signer()
    gen = build_generation(key, [], NOW)
    manifest = verify_manifest(gen.manifest, key.public_hex)
    assert (manifest.pages, manifest.total) == ((), 0)
    mirror = SnapshotMirror(key.public_hex)
    mirror.load(gen.manifest, [])
    assert mirror.snapshot() == ()


@settings(max_examples=60, deadline=None)
@given(position=st.integers(min_value=0, max_value=1 << 20), which=st.integers(min_value=-1, max_value=5))
def test_any_flipped_byte_is_refused(position: int, which: int) -> None:
    key = signer()
    gen = generation(30, key=key)
    manifest = verify_manifest(gen.manifest, key.public_hex)
    if which < 0:
        with pytest.raises(PagesError, match="signature invalid"):
            verify_manifest(tampered(gen.manifest, position), key.public_hex)
    else:
        index = which % len(gen.pages)
        with pytest.raises(PagesError, match="signature invalid"):
            verify_page(tampered(gen.pages[index], position), manifest, index)


def test_a_bad_signature_or_key_is_refused() -> None:
    key = signer()
    gen = generation(key=key)
    manifest = verify_manifest(gen.manifest, key.public_hex)
    sig = bytearray(bytes.fromhex(gen.pages[0]["sig"]))
    sig[0] ^= 0x80
    with pytest.raises(PagesError, match="signature invalid"):
        verify_page({**gen.pages[0], "sig": sig.hex()}, manifest, 0)
    with pytest.raises(PagesError, match="unexpected key"):
        verify_manifest(gen.manifest, signer().public_hex)
    with pytest.raises(PagesError, match="no trusted key"):
        verify_manifest(gen.manifest, "")
    with pytest.raises(PagesError, match="malformed"):
        verify_page({**gen.pages[0], "payload": "%%%"}, manifest, 0)


def test_pages_of_another_generation_or_directory_are_refused() -> None:
    key = signer()
    listings = [snap(n) for n in range(40)]
    first = build_generation(key, listings, NOW, max_bytes=1200)
    later = build_generation(key, listings, NOW + 1, max_bytes=1200)
    manifest = verify_manifest(first.manifest, key.public_hex)
    with pytest.raises(PagesError, match="sha256"):
        verify_page(later.pages[0], manifest, 0)
    # Pages of one generation in the wrong slots.
    with pytest.raises(PagesError, match="sha256"):
        verify_page(first.pages[1], manifest, 0)
    mirror = SnapshotMirror(key.public_hex)
    with pytest.raises(PagesError, match="sha256"):
        mirror.load(first.manifest, [first.pages[0], later.pages[1], *first.pages[2:]])
    # Another directory's pages of the same listings at the same time.
    other = build_generation(signer(), listings, NOW, max_bytes=1200)
    with pytest.raises(PagesError, match="unexpected key"):
        verify_page(other.pages[0], manifest, 0)
    assert mirror.generated_at == 0
    assert mirror.listings == {}


def test_missing_or_extra_pages_are_refused() -> None:
    key = signer()
    gen = generation(key=key)
    manifest = verify_manifest(gen.manifest, key.public_hex)
    mirror = SnapshotMirror(key.public_hex)
    with pytest.raises(PagesError, match="pages, the manifest lists"):
        mirror.load(gen.manifest, gen.pages[:-1])
    with pytest.raises(PagesError, match="pages, the manifest lists"):
        mirror.load(gen.manifest, [*gen.pages, gen.pages[0]])
    with pytest.raises(PagesError, match="not in the manifest"):
        verify_page(gen.pages[0], manifest, len(gen.pages))


# -- changes ------------------------------------------------------------------------


def database(now: int) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for statement in LISTING_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    search_index.ensure_index(conn, lambda: all_listings(conn))
    open_page_tables(conn, now)
    return conn


def full_copy(conn: sqlite3.Connection, key: Signer, at: int) -> SnapshotMirror:
    gen = build_generation(key, [snapshot_listing(item) for item in all_listings(conn)], at, max_bytes=2000)
    mirror = SnapshotMirror(key.public_hex)
    mirror.load(gen.manifest, gen.pages)
    return mirror


def signed_changes(conn: sqlite3.Connection, key: Signer, since: int, now: int) -> dict[str, str]:
    horizon, upserts, removals = changes_since(conn, since)
    assert since >= horizon
    return key.sign(build_changes_payload(since, now, [snapshot_listing(item) for item in upserts], removals))


#: One step: (uid number 0..11, action, seconds to wait first).
STEPS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=11),
        st.sampled_from(["put", "remove"]),
        st.integers(min_value=0, max_value=400),
    ),
    max_size=30,
)


def run(conn: sqlite3.Connection, steps: list[tuple[int, str, int]], now: int) -> int:
    for n, action, wait in steps:
        now += wait
        if action == "put":
            put_listing(conn, row(n, description=f"v{now}", at=now))
        elif conn.execute("SELECT 1 FROM dir_listings WHERE uid = ?", (uid_of(n),)).fetchone():
            conn.execute("DELETE FROM dir_listings WHERE uid = ?", (uid_of(n),))
            search_index.unindex_listing(conn, uid_of(n))
            record_removal(conn, uid_of(n), now)
    return now


@settings(max_examples=60, deadline=None)
@given(before=STEPS, after=STEPS, more=STEPS)
def test_changes_applied_to_an_old_copy_give_the_new_full_copy(
    before: list[tuple[int, str, int]], after: list[tuple[int, str, int]], more: list[tuple[int, str, int]]
) -> None:
    key = signer()
    conn = database(NOW)
    now = run(conn, before, NOW)
    mirror = full_copy(conn, key, now)
    old = mirror.generated_at
    now = run(conn, after, now)
    mirror.apply(signed_changes(conn, key, old, now))
    assert mirror.snapshot() == full_copy(conn, key, now).snapshot()
    # Again from there: a chain of changes stays exact.
    now = run(conn, more, now)
    mirror.apply(signed_changes(conn, key, mirror.generated_at, now))
    assert mirror.snapshot() == full_copy(conn, key, now).snapshot()


def test_changes_reach_back_by_the_overlap_and_never_name_a_live_uid_removed() -> None:
    key = signer()
    conn = database(NOW)
    put_listing(conn, row(1, at=NOW))
    put_listing(conn, row(2, at=NOW + 1000))
    conn.execute("DELETE FROM dir_listings WHERE uid = ?", (uid_of(1),))
    record_removal(conn, uid_of(1), NOW + 1001)
    put_listing(conn, row(1, at=NOW + 1002))
    _, upserts, removals = changes_since(conn, NOW + 1000 + CHANGES_OVERLAP_SECONDS)
    assert [item.uid for item in upserts] == [uid_of(1), uid_of(2)]
    assert removals == []
    changes = verify_changes(signed_changes(conn, key, NOW + 1000, NOW + 1002), key.public_hex)
    assert changes.removals == ()
    assert [item["uid"] for item in changes.upserts] == [uid_of(1), uid_of(2)]


def test_changes_that_do_not_reach_the_copy_are_refused() -> None:
    key = signer()
    conn = database(NOW)
    put_listing(conn, row(1))
    mirror = full_copy(conn, key, NOW + 10)
    with pytest.raises(PagesError, match="gap"):
        mirror.apply(key.sign(build_changes_payload(NOW + 11, NOW + 20, [], [])))
    with pytest.raises(PagesError, match="older than the copy"):
        mirror.apply(key.sign(build_changes_payload(NOW, NOW + 5, [], [])))
    with pytest.raises(PagesError, match="unexpected key"):
        mirror.apply(signer().sign(build_changes_payload(NOW, NOW + 20, [], [])))
    with pytest.raises(PagesError, match="no copy"):
        SnapshotMirror(key.public_hex).apply(key.sign(build_changes_payload(NOW, NOW + 20, [], [])))
    assert mirror.generated_at == NOW + 10


def test_tombstones_past_the_horizon_are_dropped_and_the_horizon_moves() -> None:
    conn = database(NOW)
    assert tombstone_horizon(conn) == NOW
    record_removal(conn, uid_of(1), NOW + 10)
    record_removal(conn, uid_of(2), NOW + 20)
    assert tombstone_horizon(conn) == NOW
    later = NOW + 15 + TOMBSTONE_DAYS * DAY
    record_removal(conn, uid_of(3), later)
    # The tombstone of NOW + 10 went; a since after it is still answered.
    assert tombstone_horizon(conn) == NOW + 11
    assert [r[0] for r in conn.execute("SELECT uid FROM dir_removed ORDER BY uid")] == [uid_of(2), uid_of(3)]
    # A later open keeps the horizon.
    open_page_tables(conn, later + 99)
    assert tombstone_horizon(conn) == NOW + 11


# -- the tools ----------------------------------------------------------------------


def fetcher(stack: Stack, who: str) -> Any:
    async def fetch(tool: str, args: dict[str, Any]) -> Any:
        result = await stack.call(who, tool, args)
        if result.is_error:
            block = result.content[0]
            assert isinstance(block, types.TextContent)
            raise PagesRefused(block.text)
        return result.structured_content

    return fetch


async def put(stack: Stack, *listings: Listing) -> None:
    def op(conn: sqlite3.Connection) -> None:
        for item in listings:
            put_listing(conn, item)

    await stack.directory.harness.transact(op)


async def full_index(stack: Stack) -> tuple[dict[str, Any], ...]:
    """The live index as the single-message ``get_snapshot`` sells it."""
    return verify_snapshot(await stack.ok(CALLER, "get_snapshot"), stack.directory.public_key).listings


async def test_tools_sell_the_manifest_and_serve_pages_and_changes_to_its_buyer(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as stack:
        pub = stack.directory.public_key
        await put(stack, *(row(n, description="z" * 300) for n in range(3000)))
        fetch = fetcher(stack, CALLER)
        assert NOT_ENTITLED in await stack.error(CALLER, "get_snapshot_changes", {"since": NOW})
        assert "payment_required" in await stack.error(CALLER, "get_snapshot_manifest")
        await stack.directory.credit_tip(CALLER, 30_000_000, 7)
        before = await stack.directory.store.balance(CALLER)
        mirror = await fetch_pages(fetch, pub)
        # One manifest at the snapshot price (300); the pages were free.
        assert await stack.directory.store.balance(CALLER) == before - 300
        assert mirror.snapshot() == await full_index(stack)
        manifest = verify_manifest(await stack.ok(CALLER, "get_snapshot_manifest"), pub)
        assert len(manifest.pages) > 1
        assert manifest.generated_at == NOW

        # The pages are the buyer's: another caller, an unknown generation,
        # a page out of range and a bad index are refused.
        args = {"index": 0, "generatedAt": manifest.generated_at}
        assert NOT_ENTITLED in await stack.error(ADMIN, "get_snapshot_page", args)
        assert "not held" in await stack.error(CALLER, "get_snapshot_page", {"index": 0, "generatedAt": 5})
        assert "out of range" in await stack.error(
            CALLER, "get_snapshot_page", {"index": 999, "generatedAt": manifest.generated_at}
        )
        assert "less than the minimum of 0" in await stack.error(
            CALLER, "get_snapshot_page", {"index": -1, "generatedAt": manifest.generated_at}
        )

        # An unlisting, an expiry, a new listing and a renewal reach the copy as changes.
        stack.clock.advance(60)
        await put(stack, replace(row(9), expires_at=NOW + 60))
        await stack.ok(ADMIN, "unlist", {"uid": uid_of(5)})
        assert await stack.directory.store.expire(uid_of(9), NOW + 60)
        await put(stack, row(7, description="renewed", at=NOW + 60), row(5000, at=NOW + 60))
        assert await mirror.refresh(fetch) == "changes"
        assert mirror.snapshot() == await full_index(stack)
        assert uid_of(5) not in mirror.listings
        assert uid_of(9) not in mirror.listings
        assert mirror.listings[uid_of(7)]["description"] == "renewed"
        copy_at = mirror.generated_at

        # A day on the entitlement has lapsed: refresh buys a manifest and
        # fetches the pages. Past the tombstone horizon an entitled caller
        # is told "too old".
        stack.clock.advance((TOMBSTONE_DAYS + 1) * DAY)
        await stack.ok(ADMIN, "unlist", {"uid": uid_of(6)})
        assert NOT_ENTITLED in await stack.error(CALLER, "get_snapshot_changes", {"since": copy_at})
        assert await mirror.refresh(fetch) == "pages"
        assert mirror.snapshot() == await full_index(stack)
        assert TOO_OLD in await stack.error(CALLER, "get_snapshot_changes", {"since": copy_at})
        assert await mirror.refresh(fetch) == "changes"
        assert mirror.snapshot() == await full_index(stack)


# -- federation ---------------------------------------------------------------------


async def paged_peer(stack: Stack, count: int) -> Directory:
    """A Python directory at PEER_DIR listing ``count`` providers in pages
    of 1 KiB (so several pages), paid by our directory's payer."""
    peer = await stack.add_peer_directory(FAST)

    def op(conn: sqlite3.Connection) -> None:
        for n in range(1, count + 1):
            put_listing(conn, row(n))

    await peer.harness.transact(op)
    return peer


async def test_verify_peer_buys_the_manifest_and_fetches_the_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("brmcp.directory.db._pagetables.PAGE_MAX_BYTES", 1024)
    async with directory_stack(tmp_path) as stack:
        peer = await paged_peer(stack, 12)
        await stack.ok(ADMIN, "add_peer", {"uid": PEER_DIR, "pubKey": peer.public_key})
        assert await stack.ok(ADMIN, "verify_peer", {"uid": PEER_DIR}) == {"newLeads": 12}
        # One manifest bought at the peer's price; the pages were free.
        assert stack.payer.sent == [(PEER_DIR, 300)]
        [spend] = await stack.directory.store.spends()
        assert (spend.tool, spend.atoms, spend.state) == ("get_snapshot_manifest", 300, "paid")
        assert await peer.harness.balance(DIRECTORY) == 0
        leads = (await stack.ok(ADMIN, "leads"))["leads"]
        assert [lead["providerUid"] for lead in leads] == [uid_of(n) for n in range(1, 13)]


async def test_verify_peer_refuses_a_manifest_of_too_many_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("brmcp.directory.db._pagetables.PAGE_MAX_BYTES", 1024)
    monkeypatch.setattr("brmcp.directory.payer._federation.MAX_PEER_PAGES", 2)
    async with directory_stack(tmp_path) as stack:
        peer = await paged_peer(stack, 12)
        await stack.ok(ADMIN, "add_peer", {"uid": PEER_DIR, "pubKey": peer.public_key})
        assert "more than 2" in await stack.error(ADMIN, "verify_peer", {"uid": PEER_DIR})
        assert await stack.directory.store.leads() == []
