"""Strangers against the directory (brmcp/directory/, docs/directory.md):
providers with odd applications and lying catalogs, consumers with hostile
queries, peer directories with crafted snapshots and hosts whose helpers
fail. Each test states what must hold; the money tests check the books to
the atom (the provider's balance at the directory, the spend journal, the
payer's log and the provider's own ledger)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_
from mcp.shared.exceptions import MCPError

import brmcp.directory.db as dstore
from brmcp.directory import Policy, PolicyError, Signer, TestSpec, load_policy
from brmcp.directory.model import (
    MAX_DESCRIPTION_LEN,
    RegisterIn,
    SearchIn,
    go_lower,
    go_trim_space,
    normalize_tags,
    validate_register,
    verify_snapshot,
)
from brmcp.directory.payer import leads_from
from brmcp.directory.tools import search_listings, tool_price
from brmcp.protocol.payment import parse_payment_required
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import uid
from tests.kit import until

from .stack import (
    ADMIN,
    BUDGET,
    CALLER,
    DIRECTORY,
    FEE,
    PEER_DIR,
    PRICE,
    PROVIDER,
    PROVIDER2,
    START,
    Stack,
    directory_stack,
    provider_harness,
    register_args,
)

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
TIPPED = FEE + BUDGET


def _listing(who: str, tools: list[dict[str, Any]], tags: tuple[str, ...] = ("x",)) -> dstore.Listing:
    return dstore.Listing(
        uid=who,
        description="d",
        tags=tags,
        test=TestSpec(tool="t", max_atoms=1),
        catalog=json.dumps(tools),
        catalog_checked_at=int(START),
        last_verified_execution=int(START),
        test_latency_ms=1,
        approved_at=int(START),
        renewed_at=0,
        expires_at=int(START) + 86_400,
    )


async def _publish(st: Stack, item: dstore.Listing) -> None:
    await st.directory.harness.transact(lambda c: dstore.put_listing(c, item))


# -- a provider's application ------------------------------------------------------------


async def test_description_bound_counts_bytes_not_characters(tmp_path: Path) -> None:
    # Go's len() counts bytes: 342 three-byte characters are 1026 bytes.
    async with directory_stack(tmp_path) as st:
        await st.add_client(PROVIDER)
        ascii_edge = "a" * MAX_DESCRIPTION_LEN
        assert (await st.ok(PROVIDER, "register", register_args(description=ascii_edge)))["state"] == (
            "awaiting_funding"
        )
        text = await st.error(PROVIDER, "register", register_args(description=ascii_edge + "a"))
        assert text == "description exceeds 1024 characters"
        assert "description exceeds" in await st.error(
            PROVIDER, "register", register_args(description="€" * 342)
        )
        await st.ok(PROVIDER, "register", register_args(description="€" * 341))
        reg = await st.directory.store.registration(PROVIDER)
        assert reg is not None
        assert reg.description == "€" * 341
        # A 32-byte tag passes, a 33-byte one (11 three-byte characters) does not.
        await st.ok(PROVIDER, "register", register_args(tags=["€" * 10 + "ab"]))
        assert "tags must be 1-32" in await st.error(PROVIDER, "register", register_args(tags=["€" * 11]))
        assert "at most 16 tags" in await st.error(
            PROVIDER, "register", register_args(tags=[f"t{i}" for i in range(17)])
        )


def test_tags_fold_as_go_folds_them() -> None:
    # Go: strings.ToLower (one rune at a time, simple case mapping) of
    # strings.TrimSpace (unicode.IsSpace), karamble/brmcp, directory/pipeline.go.
    assert normalize_tags(("ΟΔΟΣ", "İSTANBUL", "\x1ftag\x1f", " \u00a0Fun\u3000", "fun")) == (
        "οδοσ",
        "istanbul",
        "\x1ftag\x1f",
        "fun",
    )
    # Folding never makes a tag longer in bytes than Go's does.
    assert len("İ".lower().encode()) == 3
    assert go_lower("İ") == "i"
    # A description of information separators is not blank to Go.
    reg = validate_register(RegisterIn.from_json(register_args(description="\x1c\x1d")), BUDGET)
    assert reg.description == "\x1c\x1d"
    assert go_trim_space("\x85 a \u2029") == "a"


@settings(max_examples=200, deadline=None)
@given(st_.lists(st_.text(max_size=40), max_size=20))
def test_normalized_tags_are_unique_lowercase_and_never_grow(tags: list[str]) -> None:
    out = normalize_tags(tags)
    assert len(set(out)) == len(out)
    assert all(tag and tag == go_lower(tag) for tag in out)
    for tag in out:
        assert any(len(tag.encode()) <= len(go_trim_space(raw).encode()) for raw in tags)


def test_search_folds_names_as_go() -> None:
    item = _listing(PROVIDER, [{"name": "ΟΔΟΣ", "description": "İstanbul streets"}])
    assert search_listings([item], SearchIn(query="οδοσ")).total == 1
    assert search_listings([item], SearchIn(query="istanbul")).total == 1


async def test_register_flood_is_rate_limited_and_stores_one_application(tmp_path: Path) -> None:
    from .stack import policy

    async with directory_stack(tmp_path, pol=policy(calls_per_minute=5)) as st:
        await st.add_client(PROVIDER)
        outcomes = [
            await st.call(PROVIDER, "register", register_args(description=f"v{i}")) for i in range(12)
        ]
        refused = [r for r in outcomes if r.is_error]
        assert len(refused) >= 6
        [reg] = await st.directory.store.registrations()
        assert reg.uid == PROVIDER
        assert reg.state == "awaiting_funding"
        assert await st.directory.store.balance(PROVIDER) == 0


async def test_reregistering_never_dodges_the_fee(tmp_path: Path) -> None:
    """Every run that starts takes the fee once; re-registering while
    verified, while running or after a failure never runs without it."""
    async with directory_stack(tmp_path) as st:
        harness, runs = provider_harness(tmp_path / "prov")
        await st.add_provider(PROVIDER, harness)
        tip_seq = iter(range(1, 100))

        async def register_and_fund(tool: str, atoms: int) -> None:
            await st.ok(PROVIDER, "register", register_args(tool=tool))
            await st.directory.credit_tip(PROVIDER, atoms * 1000, next(tip_seq))

        async def parked() -> bool:
            return (await st.directory.pipeline.status(PROVIDER)).state == "pending_review"

        # A failing test (an unknown tool), then a passing one.
        await register_and_fund("nosuchtool", TIPPED)
        await until(parked)
        # No new tip: the balance (TIPPED - FEE) cannot fund a second run.
        await st.ok(PROVIDER, "register", register_args())
        assert (await st.directory.pipeline.status(PROVIDER)).state == "awaiting_funding"
        await st.directory.credit_tip(PROVIDER, FEE * 1000, next(tip_seq))
        await until(parked)
        status = await st.ok(PROVIDER, "register", register_args(description="a better one"))
        assert status["note"].startswith("verified")
        fees = [m for m in await st.directory.harness.statement(PROVIDER) if m.kind == "directory_fee"]
        assert len(fees) == 2
        paid = sum(s.atoms for s in await st.directory.store.spends(PROVIDER))
        assert paid == PRICE
        assert runs
        assert len(runs) == 1
        assert await st.directory.store.balance(PROVIDER) == TIPPED + FEE - 2 * FEE - paid
        assert await harness.balance(DIRECTORY) == 0  # the one payment bought the one run


# -- a lying catalog --------------------------------------------------------------------------

HOSTILE_PRICES = [
    10**29,
    -(10**29),
    1e300,
    -1e300,
    -5,
    1.9,
    "100",
    True,
    None,
    {"n": 1},
    [7],
    INT64_MAX,
    INT64_MIN,
]


@pytest.mark.parametrize("value", HOSTILE_PRICES, ids=repr)
def test_advertised_price_fits_int64(value: Any) -> None:
    price, _ = tool_price({"brmcp/priceAtoms": value})
    assert INT64_MIN <= price <= INT64_MAX


_JSON = st_.recursive(
    st_.none() | st_.booleans() | st_.integers() | st_.floats(allow_nan=False) | st_.text(max_size=5),
    lambda inner: st_.lists(inner, max_size=3) | st_.dictionaries(st_.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    metas=st_.lists(
        st_.dictionaries(st_.sampled_from(["brmcp/priceAtoms", "brmcp/pricing", "x"]), _JSON, max_size=3)
        | _JSON,
        max_size=6,
    ),
    ceiling=st_.integers(min_value=-(2**63), max_value=2**63 - 1),
)
def test_search_survives_any_meta_and_honours_the_ceiling(metas: list[Any], ceiling: int) -> None:
    tools = [{"name": f"t{i}", "_meta": meta} for i, meta in enumerate(metas)]
    out = search_listings([_listing(PROVIDER, tools)], SearchIn(max_price_atoms=ceiling))
    json.dumps(out.to_json(), allow_nan=False)
    for hit in out.hits:
        assert INT64_MIN <= hit.price_atoms <= INT64_MAX
        if ceiling > 0:
            assert hit.pricing == ""
            assert hit.price_atoms <= ceiling


async def test_search_answer_decodes_as_int64_for_go_clients(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        await _publish(st, _listing(PROVIDER, [{"name": "dear", "_meta": {"brmcp/priceAtoms": 10**29}}]))
        out = await st.ok(CALLER, "search", {"query": "dear"})
        assert out["total"] == 1
        assert INT64_MIN <= out["hits"][0]["priceAtoms"] <= INT64_MAX
        assert (await st.ok(CALLER, "search", {"maxPriceAtoms": INT64_MAX - 1}))["total"] == 0


async def test_catalog_that_changes_after_the_crawl_is_judged_by_the_crawl(tmp_path: Path) -> None:
    """The provider lists ``fortune`` free at the crawl, then charges: the
    directory pays nothing and the test fails; the books stay exact."""
    async with directory_stack(tmp_path) as st:
        harness, runs = provider_harness(tmp_path / "prov")
        lists = 0
        real_list = harness._tools.listed

        def lying_list(peer: str) -> Any:
            nonlocal lists
            lists += 1
            tools = real_list(peer)
            if lists == 1:
                return [t.model_copy(update={"meta": None}) for t in tools]
            return tools

        harness._tools.listed = lying_list  # type: ignore[method-assign]
        await st.add_provider(PROVIDER, harness)
        await st.ok(PROVIDER, "register", register_args())
        await st.directory.credit_tip(PROVIDER, TIPPED * 1000, 1)

        async def parked() -> bool:
            return (await st.directory.pipeline.status(PROVIDER)).state == "pending_review"

        await until(parked)
        reg = await st.directory.store.registration(PROVIDER)
        assert reg is not None
        assert "listed as free" in reg.test_err
        assert st.payer.sent == []
        assert await st.directory.store.spends() == []
        assert runs == []
        assert await st.directory.store.balance(PROVIDER) == TIPPED - FEE


# -- tips -------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    tips=st_.lists(
        st_.tuples(
            st_.integers(min_value=-(10**12), max_value=10**12), st_.integers(min_value=0, max_value=8)
        ),
        max_size=12,
    )
)
async def test_odd_tips_credit_whole_atoms_once(tmp_path_factory: Any, tips: list[tuple[int, int]]) -> None:
    """Sub-atom amounts floor, negative ones never credit, a redelivered
    tip (brclient's sequence id with the same sender and amount, the
    harness's key) credits nothing: the balance is the sum of the first
    delivery of each, floored to atoms."""
    async with directory_stack(tmp_path_factory.mktemp("tips")) as st:
        expected: dict[tuple[int, int], int] = {}
        for matoms, seq in tips:
            credited = await st.directory.credit_tip(PROVIDER, matoms, seq)
            if (seq, matoms) not in expected:
                expected[seq, matoms] = max(0, matoms // 1000)
                assert credited == expected[seq, matoms]
            else:
                assert credited == 0
        assert await st.directory.store.balance(PROVIDER) == sum(expected.values())
        moved = sum(m.atoms for m in await st.directory.harness.statement(PROVIDER))
        assert moved == sum(expected.values())


# -- a consumer ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [".*", "' OR 1=1 --", "%", "_", "\\", "(?i)fortune", "\x00", "f" * 100_000, "🎲" * 1000],
    ids=["regex", "sql", "percent", "underscore", "backslash", "inline-flag", "nul", "huge", "emoji"],
)
async def test_hostile_queries_match_literally(tmp_path: Path, query: str) -> None:
    async with directory_stack(tmp_path) as st:
        await _publish(st, _listing(PROVIDER, [{"name": "fortune", "description": "a cookie"}]))
        out = await st.ok(CALLER, "search", {"query": query})
        assert out == {"hits": [], "total": 0}
        assert (await st.ok(CALLER, "search", {"query": "FORTUNE"}))["total"] == 1


async def test_price_ceilings_and_tag_lists_at_the_edges(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        tools = [
            {"name": "cheap", "_meta": {"brmcp/priceAtoms": 5}},
            {"name": "dyn", "_meta": {"brmcp/pricing": "dynamic"}},
        ]
        await _publish(st, _listing(PROVIDER, tools, tags=("fun",)))
        assert (await st.ok(CALLER, "search", {"maxPriceAtoms": -1}))["total"] == 2  # no ceiling
        assert (await st.ok(CALLER, "search", {"maxPriceAtoms": INT64_MAX}))["total"] == 1
        assert "does not fit a signed 64-bit integer" in await st.error(
            CALLER, "search", {"maxPriceAtoms": 2**64}
        )
        assert "is not of type 'integer'" in await st.error(CALLER, "search", {"maxPriceAtoms": 1.5})
        many = [f"tag{i}" for i in range(10_000)]
        assert (await st.ok(CALLER, "search", {"tags": many}))["total"] == 0
        assert (await st.ok(CALLER, "search", {"tags": ["FUN"] * 10_000}))["total"] == 2


async def test_lookups_of_unknown_pending_and_self(tmp_path: Path) -> None:
    suggested: list[tuple[str, str]] = []

    class Suggest:
        async def suggest(self, invitee_uid: str, target_uid: str) -> None:
            suggested.append((invitee_uid, target_uid))

    async with directory_stack(tmp_path, suggester=Suggest()) as st:
        await st.add_client(PROVIDER)
        await st.ok(PROVIDER, "register", register_args())  # pending: awaiting funding
        for who in (PROVIDER, uid(9), DIRECTORY, CALLER, "", "zz", "' OR 1=1 --"):
            assert await st.error(CALLER, "get_provider", {"uid": who}) == "no listing for that uid"
        for who in (PROVIDER, uid(9), DIRECTORY, ""):
            assert await st.error(CALLER, "introduce", {"uid": who}) == "no listing for that uid"
        assert await st.error(CALLER, "introduce", {"uid": CALLER}) == "cannot introduce a caller to itself"
        assert suggested == []
        with pytest.raises(ValueError, match="the directory cannot list itself"):
            await st.directory.pipeline.register(DIRECTORY, RegisterIn.from_json(register_args()))


async def test_admin_tools_are_unknown_to_strangers(tmp_path: Path) -> None:
    from brmcp.directory.tools import ADMIN_TOOLS

    async with directory_stack(tmp_path) as st:
        names = {t.name for t in (await (await st.session(CALLER)).list_tools()).tools}
        assert names.isdisjoint(ADMIN_TOOLS)
        for tool in ADMIN_TOOLS:
            with pytest.raises(MCPError) as caught:
                await st.call(CALLER, tool, {"uid": PROVIDER})
            assert caught.value.error.message == f'unknown tool "{tool}"'

        assert await st.directory.store.peers() == []
        assert not st.directory.admin_log.path.exists()


async def test_get_snapshot_unpaid_is_a_payment_required(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        result = await st.call(CALLER, "get_snapshot")
        refusal = parse_payment_required(result)
        assert refusal is not None
        assert refusal.tool == "get_snapshot"
        assert refusal.price_atoms == 300
        assert "payload" not in json.dumps(result.model_dump(mode="json"))


# -- a peer directory -------------------------------------------------------------------------


def _signed(signer: Signer, listings: list[dict[str, Any]]) -> dict[str, str]:
    body = json.dumps({"v": 1, "generatedAt": int(START), "listings": listings})
    return signer.sign(body.encode())


def test_leads_from_keeps_only_real_strangers() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Signer(Ed25519PrivateKey.generate())
    me = uid(10)  # "aaaa…": has letters, so case matters
    listings: list[dict[str, Any]] = [
        {"uid": uid(11), "description": "fine", "tags": ["x"]},
        {"uid": me.upper(), "description": "the directory itself, shouted"},
        {"uid": PEER_DIR.upper(), "description": "the peer"},
        {"uid": "z" * 64, "description": "not hex"},
        {"uid": uid(11).upper(), "description": "a duplicate, shouted"},
        {"uid": uid(12), "description": "lone \ud800 surrogate", "tags": ["ok", "\udfff"]},
        {"uid": uid(13), "description": 7, "tags": "x"},
        {"uid": None},
        {"uid": uid(11), "description": "a duplicate"},
    ]
    snapshot = verify_snapshot(_signed(key, listings), key.public_hex)
    leads = leads_from(snapshot, me=me, peer_uid=PEER_DIR, now=int(START))
    assert [lead.provider_uid for lead in leads] == [uid(11), uid(12), uid(13)]
    assert leads[1].description == ""
    assert leads[1].tags == ("ok",)
    assert (leads[2].description, leads[2].tags) == ("", ())
    for lead in leads:
        json.dumps(lead.to_json()).encode()  # storable and printable
        lead.description.encode()


@settings(max_examples=30, deadline=None)
@given(st_.lists(st_.dictionaries(st_.sampled_from(["uid", "description", "tags"]), _JSON), max_size=30))
def test_leads_from_any_listing_are_valid_uids(listings: list[dict[str, Any]]) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Signer(Ed25519PrivateKey.generate())
    snapshot = verify_snapshot(_signed(key, listings), key.public_hex)
    leads = leads_from(snapshot, me=DIRECTORY, peer_uid=PEER_DIR, now=0)
    seen = [lead.provider_uid for lead in leads]
    assert len(set(seen)) == len(seen)
    for who in seen:
        assert len(who) == 64
        assert all(c in "0123456789abcdef" for c in who)
        assert who not in (DIRECTORY, PEER_DIR)


async def _snapshot_peer(
    st: Stack, tmp_path: Path, signer: Signer, listings: list[dict[str, Any]]
) -> Harness:
    """A peer directory at PEER_DIR selling ``listings`` signed by ``signer``."""
    harness = Harness(HarnessConfig(data_dir=tmp_path / "peer", allow=lambda _peer: True, name="peer"))

    @harness.tool(price_atoms=300, description="snapshot")
    async def get_snapshot(ctx: CallContext) -> dict[str, Any]:
        return _signed(signer, listings)

    await st.add_provider(PEER_DIR, harness)
    return harness


async def test_crafted_snapshot_from_a_trusted_peer_cannot_break_mining(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Signer(Ed25519PrivateKey.generate())
    listings: list[dict[str, Any]] = [
        {"uid": PROVIDER, "description": "good"},
        {"uid": PROVIDER2, "description": "bad \ud800 text", "tags": ["\udc00"]},
        {"uid": DIRECTORY, "description": "me"},
        {"uid": CALLER.upper() + "x", "description": "too long"},
    ]
    async with directory_stack(tmp_path) as st:
        peer = await _snapshot_peer(st, tmp_path, key, listings)
        await st.ok(ADMIN, "add_peer", {"uid": PEER_DIR, "pubKey": key.public_hex})
        assert await st.ok(ADMIN, "verify_peer", {"uid": PEER_DIR}) == {"newLeads": 2}
        leads = (await st.ok(ADMIN, "leads"))["leads"]
        assert [lead["providerUid"] for lead in leads] == [PROVIDER, PROVIDER2]
        # One purchase, journaled, paid once, credited once.
        assert st.payer.sent == [(PEER_DIR, 300)]
        [spend] = await st.directory.store.spends()
        assert (spend.atoms, spend.escrow, spend.state) == (300, False, "paid")
        assert await peer.balance(DIRECTORY) == 0


async def test_snapshot_signed_by_another_key_buys_nothing_twice(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    trusted, other = (Signer(Ed25519PrivateKey.generate()) for _ in range(2))
    async with directory_stack(tmp_path) as st:
        await _snapshot_peer(st, tmp_path, other, [{"uid": PROVIDER}])
        await st.ok(ADMIN, "add_peer", {"uid": PEER_DIR, "pubKey": trusted.public_hex})
        assert (
            await st.error(ADMIN, "verify_peer", {"uid": PEER_DIR}) == "snapshot signed by an unexpected key"
        )
        assert await st.directory.store.leads() == []
        assert st.payer.sent == [(PEER_DIR, 300)]


def test_tampered_snapshots_never_verify() -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Signer(Ed25519PrivateKey.generate())
    good = _signed(key, [{"uid": PROVIDER}])
    payload = base64.b64decode(good["payload"])
    tampered = dict(good, payload=base64.b64encode(payload.replace(b"3", b"4", 1)).decode())
    for signed in (
        tampered,
        dict(good, sig="00" * 64),
        dict(good, sig="zz"),
        dict(good, payload="not base64!"),
        dict(good, pub=PROVIDER),
        {"payload": good["payload"]},
        [good],
    ):
        with pytest.raises(ValueError):
            verify_snapshot(signed, key.public_hex)


async def test_a_large_snapshot_becomes_leads_once(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Signer(Ed25519PrivateKey.generate())
    many = [{"uid": format(i, "064x"), "description": "p"} for i in range(1, 20_001)]
    snapshot = verify_snapshot(_signed(key, many), key.public_hex)
    leads = leads_from(snapshot, me=DIRECTORY, peer_uid=PEER_DIR, now=0)
    async with directory_stack(tmp_path) as st:
        with anyio.fail_after(60):
            assert await st.directory.store.add_leads(leads) == len(many)
            assert await st.directory.store.add_leads(leads) == 0


# -- the host ---------------------------------------------------------------------------------


async def test_a_failing_suggester_or_introducer_is_a_tool_error(tmp_path: Path) -> None:
    class Broken:
        async def suggest(self, invitee_uid: str, target_uid: str) -> None:
            raise ConnectionError("status server gone")

        async def introduce(self, mediator_uid: str, target_uid: str) -> None:
            raise ConnectionError("brclient gone")

    async with directory_stack(tmp_path, suggester=Broken(), introducer=Broken()) as st:
        await _publish(st, _listing(PROVIDER, [{"name": "fortune"}]))
        said = await st.error(CALLER, "introduce", {"uid": PROVIDER})
        assert said.startswith("suggest: internal error in tool introduce; ")
        lead = dstore.Lead(PROVIDER2, PEER_DIR, dstore.LEAD_NEW, int(START), int(START))
        await st.directory.store.add_leads([lead])
        text = await st.error(ADMIN, "pursue_lead", {"uid": PROVIDER2})
        assert "introduction failed: brclient gone" in text
        assert (await st.directory.store.lead(PROVIDER2)) == lead
        # The directory still serves.
        assert (await st.ok(CALLER, "search", {}))["total"] == 1


# -- the operator's files ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [("zz", '"zz"'), (uid(10).upper(), None), (uid(1) + "0", None), ("", '""')],
    ids=["short", "uppercase", "long", "empty"],
)
def test_policy_refuses_admin_uids_that_are_not_uids(tmp_path: Path, value: str, shown: str | None) -> None:
    path = tmp_path / "brmcpdir.json"
    path.write_text(json.dumps({"admin_uids": [uid(2), value]}))
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert str(path) in message
    assert '"admin_uids"' in message
    assert "64 lowercase hex" in message
    assert "\n" not in message
    if shown:
        assert shown in message


def test_policy_accepts_real_admin_uids(tmp_path: Path) -> None:
    path = tmp_path / "brmcpdir.json"
    path.write_text(json.dumps({"admin_uids": [uid(2), uid(10)]}))
    assert load_policy(path) == Policy(admin_uids=(uid(2), uid(10)))


# -- a test tool that answers too much or too late ----------------------------------------------


async def _books(st: Stack, harness: Harness) -> int:
    """Check the four books agree; returns the atoms paid."""
    spends = await st.directory.store.spends(PROVIDER)
    paid = sum(s.atoms for s in spends)
    assert paid == st.payer.total
    assert len(spends) <= 1
    assert await st.directory.store.balance(PROVIDER) == TIPPED - FEE - paid
    reg = await st.directory.store.registration(PROVIDER)
    assert reg is not None
    assert reg.paid_atoms == paid
    movements = await harness.statement(DIRECTORY)
    assert sum(m.atoms for m in movements if m.kind == "tip") == paid
    assert await harness.balance(DIRECTORY) == sum(m.atoms for m in movements)
    assert 0 <= await harness.balance(DIRECTORY) <= paid
    return paid


async def test_a_result_beyond_the_transport_bound_fails_the_test_once(tmp_path: Path) -> None:
    from brmcp.directory import Timeouts

    quick = Timeouts(dial=2.0, crawl=5.0, call=3.0, pay=2.0, credit_polls=2, credit_poll_delay=3.0)
    async with directory_stack(tmp_path, timeouts=quick) as st:
        harness, _ = provider_harness(tmp_path / "prov")
        runs: list[str] = []

        @harness.tool(price_atoms=PRICE, description="too much")
        async def huge(ctx: CallContext, topic: str = "") -> dict[str, Any]:
            runs.append(ctx.call_key or "")
            return {"blob": "x" * (12 << 20)}

        await st.add_provider(PROVIDER, harness)
        await st.ok(PROVIDER, "register", register_args(tool="huge"))
        await st.directory.credit_tip(PROVIDER, TIPPED * 1000, 1)

        async def parked() -> bool:
            return (await st.directory.pipeline.status(PROVIDER)).state == "pending_review"

        await until(parked, limit=90)
        reg = await st.directory.store.registration(PROVIDER)
        assert reg is not None
        assert reg.test_outcome == "failed"
        assert await _books(st, harness) == PRICE
        assert len(set(runs)) <= 1


async def test_an_answer_after_the_deadline_is_charged_once(tmp_path: Path) -> None:
    from brmcp.directory import Timeouts

    quick = Timeouts(dial=2.0, crawl=2.0, call=1.0, pay=2.0, credit_polls=2, credit_poll_delay=3.0)
    async with directory_stack(tmp_path, timeouts=quick) as st:
        harness, _ = provider_harness(tmp_path / "prov")
        release = anyio.Event()
        runs: list[str] = []

        @harness.tool(price_atoms=PRICE, description="slow")
        async def slow(ctx: CallContext, topic: str = "") -> dict[str, Any]:
            runs.append(ctx.call_key or "")
            await release.wait()
            return {"ok": True}

        await st.add_provider(PROVIDER, harness)
        await st.ok(PROVIDER, "register", register_args(tool="slow"))
        await st.directory.credit_tip(PROVIDER, TIPPED * 1000, 1)

        async def parked() -> bool:
            return (await st.directory.pipeline.status(PROVIDER)).state == "pending_review"

        await until(parked, limit=60)
        release.set()
        reg = await st.directory.store.registration(PROVIDER)
        assert reg is not None
        assert "no answer within 1s" in reg.test_err
        assert await _books(st, harness) == PRICE
        assert len(set(runs)) == 1  # one logical call, under one key


async def test_a_late_answer_reaches_the_retry_under_the_same_key(tmp_path: Path) -> None:
    """The first attempt's deadline passes while the provider still runs the
    paid call; the directory closes that session without cancelling the
    call, so the retry under the same callKey gets the provider's answer:
    the test passes, paid once, run once."""
    from contextlib import asynccontextmanager

    from brmcp.directory import Timeouts

    quick = Timeouts(dial=2.0, crawl=2.0, call=1.0, pay=2.0, credit_polls=2, credit_poll_delay=3.0)
    async with directory_stack(tmp_path, timeouts=quick) as st:
        harness, _ = provider_harness(tmp_path / "prov")
        release = anyio.Event()
        runs: list[str] = []

        @harness.tool(price_atoms=PRICE, description="slow")
        async def slow(ctx: CallContext, topic: str = "") -> dict[str, Any]:
            runs.append(ctx.call_key or "")
            await release.wait()
            return {"ok": True}

        client = st.directory.client
        real_session = client.session
        opened = 0

        @asynccontextmanager
        async def counting(who: str) -> Any:
            nonlocal opened
            opened += 1
            if opened == 2:  # the retry after the first deadline
                release.set()
            async with real_session(who) as session:
                yield session

        client.session = counting  # type: ignore[method-assign,assignment]
        await st.add_provider(PROVIDER, harness)
        await st.ok(PROVIDER, "register", register_args(tool="slow"))
        await st.directory.credit_tip(PROVIDER, TIPPED * 1000, 1)

        async def parked() -> bool:
            return (await st.directory.pipeline.status(PROVIDER)).state == "pending_review"

        await until(parked, limit=60)
        reg = await st.directory.store.registration(PROVIDER)
        assert reg is not None
        assert (reg.test_outcome, reg.test_err) == ("ok", "")
        assert await _books(st, harness) == PRICE
        assert await harness.balance(DIRECTORY) == 0  # charged once, nothing refunded
        assert len(runs) == 1


@settings(max_examples=200, deadline=None)
@given(meta=_JSON)
def test_the_test_listing_of_any_meta_is_never_a_negative_price(meta: Any) -> None:
    from brmcp.directory.payer import listing_in

    catalog = json.dumps([{"name": "t", "inputSchema": {"type": "object"}, "_meta": meta}])
    listing = listing_in(catalog, "t")
    assert listing.kind in ("free", "fixed", "dynamic")
    assert listing.price_atoms > 0 if listing.kind == "fixed" else listing.price_atoms == 0


class _RaisingPayer:
    """A payer whose rail raises something unexpected before any money moves."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []
        self.harnesses: dict[str, Harness] = {}

    @property
    def total(self) -> int:
        return 0

    async def pay(self, payee_uid: str, atoms: int) -> None:
        raise RuntimeError("payer crashed")


@pytest.mark.parametrize("mode", ["fail", "doubt", "hang", "crash"])
async def test_every_payer_failure_keeps_the_books(tmp_path: Path, mode: str) -> None:
    """A definitive failure (or a payer that crashes before paying) returns
    the escrow; a payment in doubt or unconfirmed in time stays journaled
    and debited, because it may have landed."""
    from brmcp.directory import Timeouts

    from .stack import TipPayer

    quick = Timeouts(dial=2.0, crawl=2.0, call=2.0, pay=0.5, credit_polls=2, credit_poll_delay=3.0)
    payer: Any = _RaisingPayer() if mode == "crash" else TipPayer(fail=[mode])
    async with directory_stack(tmp_path, timeouts=quick, payer=payer) as st:
        harness, runs = provider_harness(tmp_path / "prov")
        await st.add_provider(PROVIDER, harness)
        await st.ok(PROVIDER, "register", register_args())
        await st.directory.credit_tip(PROVIDER, TIPPED * 1000, 1)

        async def parked() -> bool:
            return (await st.directory.pipeline.status(PROVIDER)).state == "pending_review"

        await until(parked, limit=60)
        reg = await st.directory.store.registration(PROVIDER)
        assert reg is not None
        assert reg.test_outcome == "failed"
        paid = await _books(st, harness)
        spends = await st.directory.store.spends()
        if mode in ("fail", "crash"):
            assert (paid, spends) == (0, [])
        else:
            assert paid == PRICE
            assert [s.state for s in spends] == ["launched"]
        assert runs == []
