"""The admin tools: invisible and uncallable for everyone but the policy's
``admin_uids``, each mutating call appended to ``adminlog.json``
(brmcp/directory/tools/_admin.py, docs/directory.md §Admin)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from brmcp.directory.tools import ADMIN_TOOLS, PUBLIC_TOOLS

from .stack import ADMIN, CALLER, PROVIDER, START, directory_stack, provider_harness, register_args

PEER_KEY = "ab" * 32


async def test_admin_tools_hidden_and_refused_for_non_admins(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        caller_tools = [t.name for t in (await (await st.session(CALLER)).list_tools()).tools]
        assert caller_tools == list(PUBLIC_TOOLS)
        admin_tools = [t.name for t in (await (await st.session(ADMIN)).list_tools()).tools]
        assert admin_tools == list(PUBLIC_TOOLS) + list(ADMIN_TOOLS)
        for name in ADMIN_TOOLS:
            with pytest.raises(MCPError, match="unknown tool"):
                await st.call(CALLER, name, {})
        assert not (tmp_path / "dir" / "adminlog.json").exists()


async def test_admin_calls_are_logged_one_line_each(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        harness, _ = provider_harness(tmp_path / "prov")
        await st.add_provider(PROVIDER, harness)
        await st.ok(PROVIDER, "register", register_args())

        assert await st.ok(ADMIN, "add_peer", {"uid": CALLER, "pubKey": PEER_KEY}) == {"added": True}
        assert "uid (64-hex) and pubKey are required" in await st.error(
            ADMIN, "add_peer", {"uid": "short", "pubKey": PEER_KEY}
        )
        assert await st.ok(ADMIN, "flag", {"uid": PROVIDER, "note": "watch"}) == {"flagged": True}
        rejected = await st.ok(ADMIN, "reject", {"uid": PROVIDER, "reason": "spam"})
        assert rejected == {"state": "rejected", "note": "spam"}
        assert await st.ok(ADMIN, "remove_peer", {"uid": CALLER}) == {"removed": True}
        assert await st.error(ADMIN, "approve", {"uid": PROVIDER}) == "nothing pending review for that uid"
        assert await st.error(ADMIN, "unlist", {"uid": PROVIDER}) == "no listing for that uid"

        stats = await st.ok(ADMIN, "stats")
        assert stats == {
            "live": 0,
            "inPipeline": 0,
            "pendingReview": 0,
            "leads": 0,
            "peers": 0,
            "spendEntries": 0,
            "spendAtoms": 0,
        }
        assert await st.ok(ADMIN, "leads") == {"leads": []}
        assert await st.ok(ADMIN, "pending_registrations") == {"registrations": []}

    lines = (tmp_path / "dir" / "adminlog.json").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert [e["action"] for e in entries] == ["add_peer", "flag", "reject", "remove_peer"]
    assert entries[0] == {
        "ts": int(START),
        "actor": ADMIN,
        "action": "add_peer",
        "args": {"uid": CALLER, "pubKey": PEER_KEY},
    }
    assert entries[2]["args"] == {"uid": PROVIDER, "reason": "spam"}
    assert list(entries[0]) == ["ts", "actor", "action", "args"]
    assert (tmp_path / "dir" / "adminlog.json").stat().st_mode & 0o777 == 0o600


async def test_spot_check_reuses_the_residual_balance(tmp_path: Path) -> None:
    from .test_lifecycle import listed_provider

    async with directory_stack(tmp_path) as st:
        runs = await listed_provider(st, tmp_path)
        # The residual (BUDGET - PRICE) is short of a full test budget.
        text = await st.error(ADMIN, "run_verification", {"uid": PROVIDER})
        assert "cannot fund" in text
        await st.directory.credit_tip(PROVIDER, 10_000_000, 99)
        status = await st.ok(ADMIN, "run_verification", {"uid": PROVIDER})
        assert status["state"] in ("testing", "listed")

        async def done() -> bool:
            return await st.directory.store.registration(PROVIDER) is None

        from tests.kit import until

        await until(done)
        assert len(runs) == 2
        listing = await st.directory.store.listing(PROVIDER)
        assert listing is not None
        assert listing.renewed_at == int(START)
