"""Ratings backed by signed receipts and the reputation of a listing
(brmcp/directory/db/_ratings.py, brmcp/directory/db/_reputation.py,
docs/directory.md §Reputation): the receipt key read from the crawl, the
directory's own test receipts, ``rate`` and every way it refuses, ``ratings``
pages, the history of paid tests and re-crawls on the directory's clock,
and a property over hostile sequences of ``rate`` calls."""

from __future__ import annotations

import base64
import itertools
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_
from mcp import ClientSession

import brmcp.directory.db as search_index
import brmcp.directory.db._ratings as ratings
import brmcp.directory.db._reputation as reputation
from brmcp.directory.db import (
    LISTING_SCHEMA,
    MAX_COMMENT,
    MAX_FUTURE_SECONDS,
    MAX_PER_DAY,
    Listing,
    RateIn,
    clean_comment,
    put_listing,
)
from brmcp.directory.model import STATE_PENDING_REVIEW, TestSpec
from brmcp.directory.payer import CallError
from brmcp.protocol.receipts import RECEIPT_KEY_META, ReceiptSigner, args_sha256, verify_receipt
from brmcp.server import Harness
from tests.kit import until

from .stack import (
    ADMIN,
    BUDGET,
    CALLER,
    DAY,
    DIRECTORY,
    FEE,
    PRICE,
    PROVIDER,
    PROVIDER2,
    START,
    Stack,
    directory_stack,
    provider_harness,
    register_args,
)

#: Fresh brclient tip sequence ids (the harness credits each id once).
TIP_SEQ = itertools.count(1000)


def signer_of(seed: int, bot: str = "") -> ReceiptSigner:
    return ReceiptSigner(Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32), bot=bot)


def receipt(
    signer: ReceiptSigner, caller: str, *, call_id: str = "c1", time: int = int(START), atoms: int = PRICE
) -> dict[str, str]:
    return signer.sign(
        call_id=call_id,
        caller=caller,
        tool="fortune",
        args_digest=args_sha256({"topic": "x"}),
        call_key="k",
        atoms=atoms,
        time=time,
    )


def rate_args(provider: str, signed: dict[str, str], stars: int = 4, **extra: Any) -> dict[str, Any]:
    return {"provider": provider, "receipt": signed, "stars": stars, **extra}


async def list_provider(st: Stack, tmp_path: Path, who: str, signer: ReceiptSigner | None) -> Harness:
    """Register, fund, verify and approve ``who`` (signing with ``signer``)."""
    harness, _runs = provider_harness(tmp_path / who[:8])
    harness.config.receipt_signer = signer
    await st.add_provider(who, harness)
    await st.ok(who, "register", register_args())
    await st.directory.credit_tip(who, (FEE + BUDGET) * 1000, next(TIP_SEQ))

    async def parked() -> bool:
        return (await st.directory.pipeline.status(who)).state == STATE_PENDING_REVIEW

    await until(parked)
    await st.ok(ADMIN, "approve", {"uid": who})
    return harness


# -- the crawl, the test and a valid rating --------------------------------------------------------


async def test_listing_carries_the_crawled_key_and_a_verified_test(tmp_path: Path) -> None:
    signer = signer_of(1, bot=PROVIDER)
    async with directory_stack(tmp_path) as st:
        await list_provider(st, tmp_path, PROVIDER, signer)
        out = await st.ok(CALLER, "get_provider", {"uid": PROVIDER})
        assert out["receiptKey"] == signer.public_hex
        tested_at = out["reputation"]["lastTests"][0]["at"]
        assert int(START) <= tested_at <= int(st.clock.now())
        assert out["reputation"] == {
            "ratings": 0,
            "raters": 0,
            "ratedAtoms": 0,
            "paidTests": 1,
            "paidTestsOk": 1,
            "lastTests": [{"at": tested_at, "ok": True, "atoms": PRICE, "receiptVerified": True}],
            "recrawls": 0,
            "recrawlsOk": 0,
        }
        hits = (await st.ok(CALLER, "search", {"query": "fortune"}))["hits"]
        assert hits[0]["reputation"] == {"ratings": 0, "paidTests": 1, "paidTestsOk": 1}
        assert "receiptKey" not in hits[0]


async def test_a_provider_without_a_key_is_listed_but_cannot_be_rated(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        await list_provider(st, tmp_path, PROVIDER, None)
        out = await st.ok(CALLER, "get_provider", {"uid": PROVIDER})
        assert "receiptKey" not in out
        assert out["reputation"]["lastTests"][0]["receiptVerified"] is False
        text = await st.error(CALLER, "rate", rate_args(PROVIDER, receipt(signer_of(1), CALLER)))
        assert text == "the provider announced no receipt key; its receipts cannot be checked"


async def test_a_real_call_receipt_is_accepted_and_shown(tmp_path: Path) -> None:
    signer = signer_of(1, bot=PROVIDER)
    async with directory_stack(tmp_path) as st:
        harness = await list_provider(st, tmp_path, PROVIDER, signer)
        harness.config.receipts = "all"
        # CALLER calls the provider's free echo itself and keeps the receipt.
        conn = st.router_of(CALLER).dial(PROVIDER)
        async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=20) as session:
            await session.initialize()
            listed = await session.list_tools()
            assert (listed.meta or {})[RECEIPT_KEY_META] == signer.public_hex
            result = await session.call_tool("echo", {"text": "hi"})
        assert result.meta is not None
        signed = result.meta["brmcp/signedReceipt"]
        answer = await st.ok(
            CALLER, "rate", rate_args(PROVIDER, signed, 5, comment="quick\x00 and\u202e kind")
        )
        claims = verify_receipt(signed, signer.public_hex)
        assert answer["rating"] == {
            "receiptId": claims.receipt_id,
            "rater": CALLER,
            "stars": 5,
            "comment": "quick and kind",
            "time": int(st.clock.now()),
            "tool": "echo",
            "atoms": 0,
            "receipt": signed,
        }
        page = await st.ok(ADMIN, "ratings", {"provider": PROVIDER})
        assert page == {"ratings": [answer["rating"]], "total": 1}
        # Anyone re-verifies a stored rating from the answer alone.
        again = verify_receipt(page["ratings"][0]["receipt"], signer.public_hex)
        assert (again.caller, again.receipt_id) == (CALLER, claims.receipt_id)
        rep = (await st.ok(ADMIN, "get_provider", {"uid": PROVIDER}))["reputation"]
        assert (rep["ratings"], rep["averageStars"], rep["raters"], rep["ratedAtoms"]) == (1, 5.0, 1, 0)


# -- every refusal ------------------------------------------------------------------------


async def test_every_refusal_names_its_reason(tmp_path: Path) -> None:
    signer = signer_of(1, bot=PROVIDER)
    other = signer_of(2, bot=PROVIDER2)
    async with directory_stack(tmp_path) as st:
        await list_provider(st, tmp_path, PROVIDER, signer)
        await list_provider(st, tmp_path, PROVIDER2, other)
        now = int(st.clock.now())

        async def refused(args: dict[str, Any], who: str = CALLER) -> str:
            return await st.error(who, "rate", args)

        good = receipt(signer, CALLER, time=now)
        # Signed by another bot's key.
        assert await refused(rate_args(PROVIDER, receipt(other, CALLER))) == (
            "receipt refused: receipt signed by an unexpected key"
        )
        # Tampered: more atoms in the payload, the old signature.
        decoded = json.loads(base64.b64decode(good["payload"]))
        decoded["atoms"] = 10**9
        forged = dict(good, payload=base64.b64encode(json.dumps(decoded).encode()).decode())
        assert await refused(rate_args(PROVIDER, forged)) == "receipt refused: receipt signature invalid"
        # A receipt issued to CALLER is no use to ADMIN.
        assert await refused(rate_args(PROVIDER, good), ADMIN) == (
            "receipt refused: it was issued to another caller"
        )
        # The provider's own key, naming another bot.
        elsewhere = signer_of(1, bot=PROVIDER2)
        assert await refused(rate_args(PROVIDER, receipt(elsewhere, CALLER))) == (
            "receipt refused: it names another bot"
        )
        # PROVIDER's receipt offered for PROVIDER2.
        assert (
            await refused(rate_args(PROVIDER2, good))
            == "receipt refused: receipt signed by an unexpected key"
        )
        # Dated too far ahead; exactly the bound is accepted.
        ahead = receipt(signer, CALLER, call_id="ahead", time=now + MAX_FUTURE_SECONDS + 1)
        assert await refused(rate_args(PROVIDER, ahead)) == (
            f"receipt refused: dated {MAX_FUTURE_SECONDS + 1}s after the directory's clock "
            f"(at most {MAX_FUTURE_SECONDS}s)"
        )
        edge = receipt(signer, CALLER, call_id="edge", time=now + MAX_FUTURE_SECONDS)
        await st.ok(CALLER, "rate", rate_args(PROVIDER, edge))
        # Stars out of range, and not a number.
        for stars in (0, 6, -1):
            assert await refused(rate_args(PROVIDER, good, stars)) == (
                f"rate.stars: expected a whole number from 1 to 5, got {stars}"
            )
        assert await refused(rate_args(PROVIDER, good, True)) != ""
        # Unlisted provider, malformed receipt, wrong comment type.
        assert await refused(rate_args(CALLER, good)) == "no listing for that uid"
        assert await refused(
            {"provider": PROVIDER, "receipt": {"payload": 1, "sig": "", "pub": ""}, "stars": 3}
        )
        assert await refused(rate_args(PROVIDER, good, comment=7)) != ""
        huge = dict(good, payload=base64.b64encode(b"x" * 100_000).decode())
        assert (await refused(rate_args(PROVIDER, huge))).startswith(
            "receipt refused: receipt payload malformed"
        )
        assert await refused(rate_args(PROVIDER, dict(good, pub="AB" * 32))) == (
            "receipt refused: receipt public key malformed: expected 64 lowercase hex characters"
        )
        # The first use is accepted, the replay is refused naming the receipt.
        first = await st.ok(CALLER, "rate", rate_args(PROVIDER, good))
        receipt_id = first["rating"]["receiptId"]
        assert await refused(rate_args(PROVIDER, good, 1)) == (
            f"receipt {receipt_id} was already used for a rating"
        )
        # A provider rating itself with its own receipt.
        own = receipt(other, PROVIDER2, call_id="self")
        assert await refused(rate_args(PROVIDER2, own), PROVIDER2) == "a provider cannot rate itself"
        page = await st.ok(CALLER, "ratings", {"provider": PROVIDER})
        assert page["total"] == 2


async def test_a_rater_is_held_to_a_few_ratings_per_provider_per_day(tmp_path: Path) -> None:
    signer = signer_of(1, bot=PROVIDER)
    async with directory_stack(tmp_path) as st:
        await list_provider(st, tmp_path, PROVIDER, signer)
        first_at = int(st.clock.now())
        for n in range(MAX_PER_DAY):
            await st.ok(CALLER, "rate", rate_args(PROVIDER, receipt(signer, CALLER, call_id=f"d{n}"), 2))
        extra = receipt(signer, CALLER, call_id="extra")
        text = await st.error(CALLER, "rate", rate_args(PROVIDER, extra))
        assert text.startswith(f"at most {MAX_PER_DAY} ratings of one provider per day")
        assert text.endswith(str(first_at + DAY))
        # Another rater is not held by CALLER's ratings.
        await st.ok(ADMIN, "rate", rate_args(PROVIDER, receipt(signer, ADMIN, call_id="a")))
        st.clock.advance(DAY + 1)
        await st.ok(CALLER, "rate", rate_args(PROVIDER, extra, 5))
        rep = (await st.ok(CALLER, "get_provider", {"uid": PROVIDER}))["reputation"]
        assert (rep["ratings"], rep["raters"], rep["ratedAtoms"]) == (
            MAX_PER_DAY + 2,
            2,
            (MAX_PER_DAY + 2) * PRICE,
        )
        assert rep["averageStars"] == round((2 * MAX_PER_DAY + 4 + 5) / (MAX_PER_DAY + 2), 2)


async def test_ratings_pages_newest_first(tmp_path: Path) -> None:
    signer = signer_of(1, bot=PROVIDER)
    async with directory_stack(tmp_path) as st:
        await list_provider(st, tmp_path, PROVIDER, signer)
        raters = [ADMIN, CALLER]
        for n in range(5):
            st.clock.advance(DAY)
            who = raters[n % 2]
            await st.ok(who, "rate", rate_args(PROVIDER, receipt(signer, who, call_id=f"p{n}"), 1 + n))
        first = await st.ok(CALLER, "ratings", {"provider": PROVIDER, "limit": 2})
        assert [r["stars"] for r in first["ratings"]] == [5, 4]
        assert first["total"] == 5
        second = await st.ok(
            CALLER, "ratings", {"provider": PROVIDER, "limit": 2, "cursor": first["nextCursor"]}
        )
        assert [r["stars"] for r in second["ratings"]] == [3, 2]
        last = await st.ok(
            CALLER, "ratings", {"provider": PROVIDER, "limit": 2, "cursor": second["nextCursor"]}
        )
        assert [r["stars"] for r in last["ratings"]] == [1]
        assert "nextCursor" not in last
        assert (await st.ok(CALLER, "ratings", {"provider": PROVIDER2})) == {"ratings": [], "total": 0}
        for bad in ({"limit": 51}, {"limit": -1}, {"cursor": "x1"}, {"cursor": "9" * 19}, {"cursor": "-1"}):
            assert (await st.error(CALLER, "ratings", {"provider": PROVIDER, **bad})).startswith("ratings.")


# -- history on the directory's clock ----------------------------------------------------------


async def test_reputation_counts_tests_and_recrawls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    signer = signer_of(1, bot=PROVIDER)
    async with directory_stack(tmp_path) as st:
        harness = await list_provider(st, tmp_path, PROVIDER, signer)
        # A free re-crawl after recrawl_hours, on the injected clock.
        st.clock.advance(25 * 3600)
        await st.directory.sweep()
        crawled_at = int(st.clock.now())
        # A failed re-crawl is counted and leaves the listing and its key.
        real = st.directory.client.crawl

        async def down(uid: str, session: Any = None, *, meta: Any = None) -> list[dict[str, Any]]:
            raise CallError("list tools: provider offline")

        monkeypatch.setattr(st.directory.client, "crawl", down)
        st.clock.advance(3600)
        assert await st.directory.pipeline.recrawl(PROVIDER) is not None
        monkeypatch.setattr(st.directory.client, "crawl", real)
        # A paid re-test (run_verification) is checked against the listed key.
        await st.directory.credit_tip(PROVIDER, BUDGET * 1000, next(TIP_SEQ))
        await st.ok(ADMIN, "run_verification", {"uid": PROVIDER})
        tested_at = int(st.clock.now())

        await st.session(CALLER)  # opened outside until()'s cancel scope

        async def retested() -> bool:
            rep = (await st.ok(CALLER, "get_provider", {"uid": PROVIDER}))["reputation"]
            return bool(rep["paidTests"] == 2)

        await until(retested)
        rep = (await st.ok(CALLER, "get_provider", {"uid": PROVIDER}))["reputation"]
        assert rep["paidTests"] == rep["paidTestsOk"] == 2
        assert rep["lastTests"][0]["at"] >= tested_at
        assert [t["receiptVerified"] for t in rep["lastTests"]] == [True, True]
        assert (rep["recrawls"], rep["recrawlsOk"], rep["lastRecrawlOkAt"]) == (2, 1, crawled_at)

        # The provider rotates its key: the next re-crawl records the new
        # one, and receipts of the old key no longer rate.
        rotated = signer_of(9, bot=PROVIDER)
        harness.config.receipt_signer = rotated
        await st.ok(ADMIN, "recrawl", {"uid": PROVIDER})
        out = await st.ok(CALLER, "get_provider", {"uid": PROVIDER})
        assert out["receiptKey"] == rotated.public_hex
        assert out["reputation"]["recrawlsOk"] == 2
        old = await st.error(CALLER, "rate", rate_args(PROVIDER, receipt(signer, CALLER)))
        assert old == "receipt refused: receipt signed by an unexpected key"
        await st.ok(CALLER, "rate", rate_args(PROVIDER, receipt(rotated, CALLER)))


async def test_a_failed_renewal_keeps_the_listed_key(tmp_path: Path) -> None:
    signer = signer_of(1, bot=PROVIDER)
    async with directory_stack(tmp_path) as st:
        harness = await list_provider(st, tmp_path, PROVIDER, signer)
        harness.config.receipt_signer = signer_of(3, bot=PROVIDER)
        # A renewal nominating a tool that does not exist fails its test.
        await st.ok(PROVIDER, "register", register_args(tool="missing"))
        await st.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1000, next(TIP_SEQ))

        async def parked() -> bool:
            return (await st.directory.pipeline.status(PROVIDER)).state == STATE_PENDING_REVIEW

        await until(parked)
        out = await st.ok(CALLER, "get_provider", {"uid": PROVIDER})
        assert out["receiptKey"] == signer.public_hex
        assert [t["ok"] for t in out["reputation"]["lastTests"]] == [False, True]
        assert out["reputation"]["paidTestsOk"] == 1


def test_history_is_bounded_and_totals_are_kept() -> None:
    conn = sqlite3.connect(":memory:")
    reputation.open_tables(conn)
    ratings.open_tables(conn)
    for n in range(reputation.HISTORY_KEEP + 20):
        reputation.record_test(conn, PROVIDER, at=n, ok=n % 2 == 0, atoms=1, receipt_verified=False)
        reputation.record_recrawl(conn, PROVIDER, at=n, ok=n % 3 == 0)
    kept = conn.execute("SELECT kind, COUNT(*) FROM dir_history GROUP BY kind ORDER BY kind").fetchall()
    assert kept == [("recrawl", reputation.HISTORY_KEEP), ("test", reputation.HISTORY_KEEP)]
    out = reputation.summary(conn, PROVIDER)
    total = reputation.HISTORY_KEEP + 20
    assert (out["paidTests"], out["paidTestsOk"]) == (total, total // 2)
    assert (out["recrawls"], out["recrawlsOk"]) == (total, len(range(0, total, 3)))
    assert out["lastRecrawlOkAt"] == max(range(0, total, 3))
    assert [t["at"] for t in out["lastTests"]] == list(
        range(total - 1, total - 1 - reputation.LAST_TESTS, -1)
    )


def test_comment_is_cleaned_and_cut() -> None:
    assert clean_comment("a\x1b[31mb\u200fc\u2028d\tx  y\n") == "a [31mb c d x y"
    assert clean_comment("\ud800ok") == "ok"
    assert len(clean_comment("w" * 10_000)) == MAX_COMMENT
    assert clean_comment(" " * 1_000_000 + "late") == ""  # only the head is read
    request = RateIn.from_json(
        {"provider": PROVIDER, "receipt": {"payload": "", "sig": "", "pub": ""}, "stars": 3}
    )
    assert request.comment == ""


# -- the property -------------------------------------------------------------------------

PROP_PROVIDER = PROVIDER
PROP_SIGNER = signer_of(7, bot=PROP_PROVIDER)
PROP_OTHER = signer_of(8, bot=PROP_PROVIDER)
PROP_RATERS = (CALLER, ADMIN, DIRECTORY)
#: receipts[(owner, n)]: a receipt the provider issued to rater ``owner``.
PROP_RECEIPTS = {
    (owner, n): receipt(PROP_SIGNER, PROP_RATERS[owner], call_id=f"r{owner}-{n}")
    for owner in range(len(PROP_RATERS))
    for n in range(4)
}


def _forged(signed: dict[str, str], how: str) -> dict[str, str]:
    if how == "other_key":
        claims = verify_receipt(signed)
        return PROP_OTHER.sign(
            call_id=claims.call_id,
            caller=claims.caller,
            tool=claims.tool,
            args_digest=claims.args_sha256,
            call_key=claims.call_key,
            atoms=claims.atoms,
            time=claims.time,
        )
    flipped = "0" if signed["sig"][-1] != "0" else "1"
    return dict(signed, sig=signed["sig"][:-1] + flipped)


def _property_db() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    for statement in LISTING_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    search_index.create_index(conn)
    reputation.open_tables(conn)
    ratings.open_tables(conn)
    put_listing(
        conn,
        Listing(
            uid=PROP_PROVIDER,
            description="d",
            tags=(),
            test=TestSpec("fortune", None, 1),
            catalog="[]",
            catalog_checked_at=0,
            last_verified_execution=0,
            test_latency_ms=0,
            approved_at=0,
            renewed_at=0,
            expires_at=1 << 40,
        ),
    )
    reputation.set_listed_key(conn, PROP_PROVIDER, PROP_SIGNER.public_hex)
    return conn


ATTEMPT = st_.tuples(
    st_.integers(0, len(PROP_RATERS) - 1),  # the receipt's owner
    st_.integers(0, 3),  # which of the owner's receipts
    st_.integers(0, len(PROP_RATERS) - 1),  # who submits it
    st_.sampled_from(["valid", "valid", "valid", "bad_sig", "other_key"]),
    st_.integers(1, 5),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st_.lists(ATTEMPT, max_size=30))
def test_accepted_ratings_are_the_distinct_valid_receipts_of_their_own_callers(
    attempts: list[tuple[int, int, int, str, int]],
) -> None:
    """Whatever mix of valid, replayed, forged and borrowed receipts is sent
    (a day apart, so the daily bound is not what refuses), exactly one
    rating is stored per distinct valid receipt its own caller sent."""
    conn = _property_db()
    expected: set[tuple[int, int]] = set()
    accepted = 0
    for step, (owner, n, submitter, how, stars) in enumerate(attempts):
        signed = PROP_RECEIPTS[(owner, n)]
        if how != "valid":
            signed = _forged(signed, how)
        request = RateIn.from_json({"provider": PROP_PROVIDER, "receipt": signed, "stars": stars})
        now = int(START) + step * DAY
        try:
            ratings.rate(conn, PROP_RATERS[submitter], request, now)
        except ValueError:
            continue
        accepted += 1
        assert how == "valid"
        assert owner == submitter
        expected.add((owner, n))
    assert accepted == len(expected)
    assert expected == {(o, n) for o, n, s, how, _ in attempts if how == "valid" and o == s}
    (stored,) = conn.execute("SELECT COUNT(*) FROM dir_ratings").fetchone()
    assert stored == accepted
