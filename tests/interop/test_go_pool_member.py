"""A Go bridge sees a pool member as an ordinary bot (WIRE.md §Pools: a
caller that does not know pools ignores ``brmcp/pool`` and its key).

The reference bridge (Go) calls our harness serving as one member of a
two-member pool on a PostgreSQL book, announcing ``brmcp/pool`` and signing
receipts: the tools list as the reference expects, a paid ``fortune`` is
refused, tipped, reissued with the same callKey and run once, charged once,
and the balance ends at zero.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from brmcp.protocol.receipts import ReceiptSigner
from brmcp.server.pool import PoolConfig
from brmcp.testing import Fabric, uid

from .live import BOT, CLIENT, FORTUNE_PRICE, REFERENCE_META, Tap, agent, go_bridge, py_harness

pytestmark = pytest.mark.interop

SIBLING = uid(77)


@pytest.mark.anyio
async def test_the_go_bridge_buys_from_a_pool_member_as_from_any_bot(
    tmp_path: Path, goref_binary: Path, postgres_url: str
) -> None:
    signer = ReceiptSigner(Ed25519PrivateKey.generate(), bot=BOT)
    async with (
        Fabric() as fabric,
        py_harness(
            fabric,
            tmp_path / "bot",
            store=postgres_url,
            receipt_signer=signer,
            pool=PoolConfig("fortunes", (BOT, SIBLING)),
        ) as harness,
        go_bridge(fabric, goref_binary, tmp_path / "bridge", harness) as bridge,
        agent(bridge.url) as session,
    ):
        tap = Tap()
        fabric.add_tap(tap)
        listed = await session.list_tools()
        assert {t.name: t.meta for t in listed.tools} == REFERENCE_META
        fortune = await session.call_tool("fortune", {})
        assert not fortune.is_error, fortune
        assert bridge.pays == [(BOT, FORTUNE_PRICE)]
        assert harness.executions("fortune") == 1
        assert await harness.balance(CLIENT) == 0
        keys = {a["params"]["_meta"]["brmcp/callKey"] for a in tap.calls("fortune")}
        assert len(keys) == 1
        assert SIBLING not in {dst for _, dst, _ in tap.pms}
