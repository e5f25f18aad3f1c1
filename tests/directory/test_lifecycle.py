"""A provider's way through the directory over the fabric
(brmcp/directory/payer/_pipeline.py, docs/directory.md §Lifecycle): register,
fund, crawl, one paid test charged once at the provider, review, approval,
the public tools; renewal without review; expiry and free re-crawls on a
ManualClock."""

from __future__ import annotations

from pathlib import Path

from brmcp.directory.model import (
    STATE_AWAITING_FUNDING,
    STATE_LISTED,
    STATE_NONE,
    STATE_PENDING_REVIEW,
    STATE_REJECTED,
    verify_snapshot,
)
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
    START,
    Stack,
    directory_stack,
    provider_harness,
    register_args,
)


async def state_of(st: Stack, uid: str) -> str:
    return (await st.directory.pipeline.status(uid)).state


async def listed_provider(st: Stack, data_dir: Path) -> list[str]:
    """Register, fund, verify and approve PROVIDER; returns its run log."""
    harness, runs = provider_harness(data_dir / "prov")
    await st.add_provider(PROVIDER, harness)
    invoice = await st.ok(PROVIDER, "register", register_args())
    assert invoice["state"] == STATE_AWAITING_FUNDING
    await st.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1000, 1)

    async def parked() -> bool:
        return await state_of(st, PROVIDER) == STATE_PENDING_REVIEW

    await until(parked)
    await st.ok(ADMIN, "approve", {"uid": PROVIDER})
    return runs


async def test_full_lifecycle(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        harness, runs = provider_harness(tmp_path / "prov")
        await st.add_provider(PROVIDER, harness)

        invoice = await st.ok(PROVIDER, "register", register_args())
        assert invoice == {
            "state": STATE_AWAITING_FUNDING,
            "requiredAtoms": FEE + BUDGET,
            "shortfallAtoms": FEE + BUDGET,
            "feeAtoms": FEE,
            "testBudgetAtoms": BUDGET,
        }
        # A partial tip funds nothing yet.
        await st.directory.credit_tip(PROVIDER, FEE * 1000, 1)
        status = await st.ok(PROVIDER, "my_status")
        assert status["balanceAtoms"] == FEE
        assert status["shortfallAtoms"] == BUDGET
        # A redelivered tip credits nothing.
        assert await st.directory.credit_tip(PROVIDER, FEE * 1000, 1) == 0
        await st.directory.credit_tip(PROVIDER, BUDGET * 1000, 2)

        async def parked() -> bool:
            return await state_of(st, PROVIDER) == STATE_PENDING_REVIEW

        await until(parked)
        # The fee went, the test cost PRICE out of the escrow, paid once.
        assert await st.directory.harness.balance(PROVIDER) == BUDGET - PRICE
        assert st.payer.sent == [(PROVIDER, PRICE)]
        assert len(runs) == 1
        assert await harness.balance(DIRECTORY) == 0
        kinds = [(e.kind, e.atoms) for e in await harness.statement(DIRECTORY)]
        assert kinds == [("tip", PRICE), ("charge", -PRICE)]
        spends = await st.directory.store.spends()
        assert [(s.uid, s.atoms, s.state, s.escrow) for s in spends] == [(PROVIDER, PRICE, "paid", True)]

        pending = await st.ok(ADMIN, "pending_registrations")
        [reg] = pending["registrations"]
        assert reg["state"] == STATE_PENDING_REVIEW
        assert reg["testOutcome"] == "ok"
        assert reg["paidAtoms"] == PRICE
        assert reg["tags"] == ["fun", "fortune"]
        assert "testErr" not in reg

        # Not listed before approval.
        assert (await st.ok(CALLER, "search", {"query": "fortune"}))["total"] == 0
        approved = await st.ok(ADMIN, "approve", {"uid": PROVIDER})
        assert approved == {"state": STATE_LISTED, "expiresAt": int(START) + 30 * DAY}

        found = await st.ok(CALLER, "search", {"query": "FORTUNE"})
        assert found["total"] == 1
        [hit] = found["hits"]
        assert hit == {
            "providerUid": PROVIDER,
            "tool": "fortune",
            "description": "A fortune cookie",
            "priceAtoms": PRICE,
            "tags": ["fun", "fortune"],
            "catalogCheckedAt": int(START),
            "lastVerifiedExecution": int(START),
            "reputation": {"ratings": 0, "paidTests": 1, "paidTestsOk": 1},
        }
        assert (await st.ok(CALLER, "search", {"maxPriceAtoms": PRICE - 1}))["total"] == 1  # echo, free
        assert (await st.ok(CALLER, "search", {"tags": ["nope"]}))["total"] == 0

        provider = await st.ok(CALLER, "get_provider", {"uid": PROVIDER})
        assert [t["name"] for t in provider["catalog"]] == ["fortune", "echo"]
        assert provider["catalog"][0]["_meta"]["brmcp/priceAtoms"] == PRICE
        assert provider["approvedAt"] == int(START)
        assert "renewedAt" not in provider
        assert await st.error(CALLER, "get_provider", {"uid": CALLER}) == "no listing for that uid"

        assert await st.ok(CALLER, "list_categories") == {"tags": {"fortune": 1, "fun": 1}}
        terms = await st.ok(CALLER, "policy")
        assert terms["pubKey"] == st.directory.public_key
        assert terms["listingFeeAtoms"] == FEE

        # get_snapshot is priced: fund the caller, then buy it.
        assert "payment_required" in await st.error(CALLER, "get_snapshot")
        await st.directory.credit_tip(CALLER, 300_000, 7)
        signed = await st.ok(CALLER, "get_snapshot")
        snap = verify_snapshot(signed, st.directory.public_key)
        assert [item["uid"] for item in snap.listings] == [PROVIDER]
        assert snap.listings[0]["catalog"][0]["name"] == "fortune"

        assert (await st.ok(PROVIDER, "my_status"))["state"] == STATE_LISTED
        assert (await st.ok(CALLER, "my_status")) == {"state": STATE_NONE}


async def test_renewal_lists_without_review_and_keeps_approval(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        runs = await listed_provider(st, tmp_path)
        st.clock.advance(DAY)
        await st.ok(PROVIDER, "register", register_args())
        await st.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1000, 2)

        async def renewed() -> bool:
            reg = await st.directory.store.registration(PROVIDER)
            return reg is None and (await st.directory.store.listing(PROVIDER) or 0) != 0

        await until(renewed)
        listing = await st.directory.store.listing(PROVIDER)
        assert listing is not None
        assert listing.approved_at == int(START)
        assert listing.renewed_at == int(START) + DAY
        assert listing.expires_at == int(START) + 31 * DAY
        assert len(runs) == 2


async def test_failed_renewal_keeps_live_listing(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        await listed_provider(st, tmp_path)
        # The renewal nominates a tool that does not exist: the test fails.
        await st.ok(PROVIDER, "register", register_args(tool="missing"))
        await st.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1000, 2)

        async def parked() -> bool:
            return await state_of(st, PROVIDER) == STATE_PENDING_REVIEW

        await until(parked)
        assert (await st.ok(CALLER, "search", {"query": "fortune"}))["total"] == 1
        status = await st.ok(PROVIDER, "my_status")
        assert "missing" in status["note"]
        assert "verification has not passed" in await st.error(ADMIN, "approve", {"uid": PROVIDER})


async def test_reject_surfaces_reason(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        harness, _ = provider_harness(tmp_path / "prov")
        await st.add_provider(PROVIDER, harness)
        await st.ok(PROVIDER, "register", register_args())
        await st.ok(ADMIN, "reject", {"uid": PROVIDER, "reason": "spam"})
        assert await st.ok(PROVIDER, "my_status") == {"state": STATE_REJECTED, "note": "spam"}


async def test_register_refuses_self_and_bad_input(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        harness, _ = provider_harness(tmp_path / "prov")
        await st.add_provider(PROVIDER, harness)
        assert "maxAtoms" in await st.error(PROVIDER, "register", register_args(max_atoms=0))
        assert "description" in await st.error(PROVIDER, "register", register_args(description=" "))
        assert "cannot list itself" in str(await _self_register(st))


async def _self_register(st: Stack) -> str:
    from brmcp.directory.model import RegisterIn

    try:
        await st.directory.pipeline.register(DIRECTORY, RegisterIn.from_json(register_args()))
    except ValueError as exc:
        return str(exc)
    return ""


async def test_register_while_testing_keeps_the_running_one(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        harness, _ = provider_harness(tmp_path / "prov")
        await st.add_provider(PROVIDER, harness)
        await st.ok(PROVIDER, "register", register_args())
        # Pretend the run is mid-test: a second register must not replace it.
        reg = await st.directory.store.registration(PROVIDER)
        assert reg is not None
        import dataclasses

        import brmcp.directory.db as dstore

        await st.directory.harness.transact(
            lambda c: dstore.put_registration(c, dataclasses.replace(reg, state="testing"))
        )
        answer = await st.ok(PROVIDER, "register", register_args(description="other"))
        assert answer["state"] == "testing"
        assert answer["note"] == "verification in progress; the previous registration continues"
        after = await st.directory.store.registration(PROVIDER)
        assert after is not None
        assert after.description == "fortunes on demand"


async def test_expiry_sweep_and_free_recrawl(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        runs = await listed_provider(st, tmp_path)
        st.clock.advance(25 * 3600)
        await st.directory.sweep()
        listing = await st.directory.store.listing(PROVIDER)
        assert listing is not None
        assert listing.catalog_checked_at == int(START) + 25 * 3600
        assert listing.last_verified_execution == int(START)
        assert len(runs) == 1  # a recrawl never calls a tool

        recrawled = await st.ok(ADMIN, "recrawl", {"uid": PROVIDER})
        assert recrawled["catalogCheckedAt"] == int(START) + 25 * 3600

        st.clock.advance(30 * DAY)
        await st.directory.sweep()
        assert await st.directory.store.listing(PROVIDER) is None
        assert (await st.ok(CALLER, "search"))["total"] == 0
        assert (await st.ok(PROVIDER, "my_status"))["state"] == STATE_NONE


async def test_introduce_needs_a_suggester_and_a_listing(tmp_path: Path) -> None:
    suggested: list[tuple[str, str]] = []

    class Suggest:
        async def suggest(self, invitee_uid: str, target_uid: str) -> None:
            suggested.append((invitee_uid, target_uid))

    async with directory_stack(tmp_path, suggester=Suggest()) as st:
        assert await st.error(CALLER, "introduce", {"uid": PROVIDER}) == "no listing for that uid"
        await listed_provider(st, tmp_path)
        assert await st.error(CALLER, "introduce", {"uid": CALLER}) == "cannot introduce a caller to itself"
        answer = await st.ok(CALLER, "introduce", {"uid": PROVIDER})
        assert answer["suggested"] is True
        assert suggested == [(CALLER, PROVIDER)]

    async with directory_stack(tmp_path / "b") as st:
        text = await st.error(CALLER, "introduce", {"uid": PROVIDER})
        assert text == "this directory does not support introductions"
