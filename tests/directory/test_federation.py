"""Federation (brmcp/directory/payer/_federation.py, docs/directory.md
§Federation): a curated peer's snapshot bought within the bound and
verified against its stored key, unknown providers turned into leads, a
wrong key yielding nothing, and a lead pursued by invite or, when it cannot
be reached, through a mediated key exchange."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import brmcp.directory.db as dstore
from brmcp.directory import Directory, TestSpec, Timeouts
from brmcp.server import CallContext
from tests.kit import until

from .stack import (
    ADMIN,
    DIRECTORY,
    PEER_DIR,
    PROVIDER,
    PROVIDER2,
    START,
    Stack,
    directory_stack,
    provider_harness,
)

QUICK = Timeouts(dial=1.0, crawl=2.0, call=2.0, pay=2.0, credit_polls=2, credit_poll_delay=3.0)


async def peer_directory(st: Stack, listed: list[str]) -> Directory:
    """A second directory at PEER_DIR listing ``listed`` (written straight
    into its store), paid by our directory's payer like any payee."""
    peer = await st.add_peer_directory(QUICK)
    for uid in listed:
        item = dstore.Listing(
            uid=uid,
            description=f"provider {uid[:4]}",
            tags=("x",),
            test=TestSpec(tool="fortune", max_atoms=10),
            catalog='[{"name":"fortune"}]',
            catalog_checked_at=int(START),
            last_verified_execution=int(START),
            test_latency_ms=1,
            approved_at=int(START),
            renewed_at=0,
            expires_at=int(START) + 86_400,
        )
        await peer.harness.transact(partial(dstore.put_listing, item=item))
    return peer


async def test_verify_peer_makes_leads_and_pursues_them(tmp_path: Path) -> None:
    introduced: list[tuple[str, str]] = []

    class Introduce:
        async def introduce(self, mediator_uid: str, target_uid: str) -> None:
            introduced.append((mediator_uid, target_uid))

    async with directory_stack(tmp_path, timeouts=QUICK, introducer=Introduce()) as st:
        peer = await peer_directory(st, [PROVIDER, PROVIDER2, DIRECTORY])
        assert "not a curated peer" in await st.error(ADMIN, "verify_peer", {"uid": PEER_DIR})
        await st.ok(ADMIN, "add_peer", {"uid": PEER_DIR, "pubKey": peer.public_key})
        assert await st.ok(ADMIN, "verify_peer", {"uid": PEER_DIR}) == {"newLeads": 2}
        # Paid out of the directory's pocket, the peer's price, journaled.
        assert st.payer.sent == [(PEER_DIR, 300)]
        [spend] = await st.directory.store.spends()
        # A Python peer sells its index in pages: the manifest is the purchase.
        assert (spend.uid, spend.tool, spend.escrow, spend.state) == (
            PEER_DIR,
            "get_snapshot_manifest",
            False,
            "paid",
        )
        leads = (await st.ok(ADMIN, "leads"))["leads"]
        assert [lead["providerUid"] for lead in leads] == sorted([PROVIDER, PROVIDER2])
        assert all(lead["state"] == "new" and lead["peerUid"] == PEER_DIR for lead in leads)
        # Verifying again finds nothing new.
        assert await st.ok(ADMIN, "verify_peer", {"uid": PEER_DIR}) == {"newLeads": 0}

        # PROVIDER serves listing_invite and accepts.
        harness, _ = provider_harness(tmp_path / "prov")
        invites: list[dict[str, Any]] = []

        @harness.tool(description="invite")
        async def listing_invite(
            ctx: CallContext, directory: str = "", listingFeeAtoms: int = 0, note: str = ""
        ) -> dict[str, Any]:
            invites.append({"from": ctx.peer, "directory": directory, "fee": listingFeeAtoms})
            return {"accepted": True}

        await st.add_provider(PROVIDER, harness)
        lead = await st.ok(ADMIN, "pursue_lead", {"uid": PROVIDER})
        assert lead["state"] == "invited"
        assert invites == [{"from": DIRECTORY, "directory": "brmcpdir", "fee": 1_000}]

        # PROVIDER2 is not reachable: a mediated KX through the peer, then the invite.
        lead2 = await st.ok(ADMIN, "pursue_lead", {"uid": PROVIDER2})
        assert lead2["state"] == "pursuing"
        assert lead2["note"] == "awaiting key exchange via peer"
        assert introduced == [(PEER_DIR, PROVIDER2)]
        harness2, _ = provider_harness(tmp_path / "prov2")
        harness2.add_tool(
            "listing_invite",
            lambda ctx, args: _accept(),
            description="invite",
            input_schema={"type": "object"},
        )
        await st.add_provider(PROVIDER2, harness2)
        st.directory.notify_kx(PROVIDER2)

        async def invited() -> bool:
            got = await st.directory.store.lead(PROVIDER2)
            return got is not None and got.state == "invited"

        await until(invited)


async def _accept() -> dict[str, Any]:
    return {"accepted": True}


async def test_snapshot_signed_by_another_key_yields_nothing(tmp_path: Path) -> None:
    async with directory_stack(tmp_path, timeouts=QUICK) as st:
        await peer_directory(st, [PROVIDER])
        await st.ok(ADMIN, "add_peer", {"uid": PEER_DIR, "pubKey": "ab" * 32})
        text = await st.error(ADMIN, "verify_peer", {"uid": PEER_DIR})
        assert text == "manifest signed by an unexpected key"
        assert await st.directory.store.leads() == []
        assert await st.error(ADMIN, "pursue_lead", {"uid": PROVIDER}) == "no lead for that uid"


async def test_pursue_without_introducer(tmp_path: Path) -> None:
    async with directory_stack(tmp_path, timeouts=QUICK) as st:
        peer = await peer_directory(st, [PROVIDER])
        await st.ok(ADMIN, "add_peer", {"uid": PEER_DIR, "pubKey": peer.public_key})
        await st.ok(ADMIN, "verify_peer", {"uid": PEER_DIR})
        text = await st.error(ADMIN, "pursue_lead", {"uid": PROVIDER})
        assert text.startswith("invite failed and no introducer is configured")
        assert await st.error(ADMIN, "pursue_lead", {"uid": PROVIDER2}) == "no lead for that uid"
