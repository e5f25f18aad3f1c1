"""Round trips against the Go reference: the Go bridge ignores our receipts and
pays once; our bridge falls back to the handshake era with the Go harness,
remembers it, and pays alongside without paying twice."""

from __future__ import annotations

import json
from pathlib import Path

from mcp.types import TextContent

from brmcp.protocol.payment import BALANCE_ATOMS_KEY, CHARGED_ATOMS_KEY, REFUSAL_KEY, payment_required_text
from brmcp.testing import Fabric

from .live import BOT, CLIENT, FORTUNE_PRICE, Tap, agent, go_bridge, go_harness, py_bridge, py_harness


async def test_go_bridge_passes_our_receipts_through_and_pays_once(
    tmp_path: Path, goref_binary: Path
) -> None:
    tap = Tap()
    async with Fabric() as fabric:
        fabric.add_tap(tap)
        async with (
            py_harness(fabric, tmp_path / "bot") as harness,
            go_bridge(fabric, goref_binary, tmp_path / "bridge", harness) as bridge,
            agent(bridge.url) as s,
        ):
            result = await s.call_tool("fortune", {})
            assert not result.is_error
            assert bridge.pays == [(BOT, FORTUNE_PRICE)]
            assert harness.executions("fortune") == 1
            assert await harness.balance(CLIENT) == 0
            # The receipt reached the agent through the Go bridge unchanged.
            assert result.meta is not None
            assert (result.meta[CHARGED_ATOMS_KEY], result.meta[BALANCE_ATOMS_KEY]) == (FORTUNE_PRICE, 0)
            # The bot's answers on the wire carry it; the refusal does not: its
            # text is the Go harness's, byte for byte, and its only _meta is the
            # genuine-refusal mark, which the Go bridge ignores.
            answers = [m for m in tap.json(BOT, CLIENT) if "result" in m and "content" in m["result"]]
            assert answers[0]["result"]["_meta"] == {REFUSAL_KEY: True}
            refusal = answers[0]["result"]["content"][0]["text"]
            assert refusal == payment_required_text("fortune", FORTUNE_PRICE, 0)
            assert json.loads(refusal)["error"] == "payment_required"
            assert answers[-1]["result"]["_meta"] == {CHARGED_ATOMS_KEY: FORTUNE_PRICE, BALANCE_ATOMS_KEY: 0}


async def test_our_bridge_with_the_go_harness_falls_back_and_pays_once(
    tmp_path: Path, goref_binary: Path
) -> None:
    tap = Tap()
    async with Fabric() as fabric:
        fabric.add_tap(tap)
        async with (
            go_harness(fabric, goref_binary, tmp_path / "bot") as harness,
            py_bridge(fabric, tmp_path / "bridge", harness) as bridge,
            agent(bridge.url) as s,
        ):
            link = bridge.bridge.link(BOT)
            assert link is not None
            assert link.era == "handshake"
            methods = [m.get("method") for m in tap.json(CLIENT, BOT)]
            # The marked initialize (the Go harness answers it plainly), then
            # exactly the reference's warm-up: no PM more than the Go bridge.
            assert methods[:3] == ["initialize", "notifications/initialized", "tools/list"]
            # The first request also asks whether the bot takes batches
            # (WIRE.md §Batches); the Go harness's answer lacks the mark, so
            # no later request carries it and no batch is ever sent.
            first = tap.json(CLIENT, BOT)[0]["params"]["_meta"]
            assert first == {"brmcp/listTools": True, "brmcp/batch": 1490000}
            assert all(
                "brmcp/batch" not in (m.get("params") or {}).get("_meta", {})
                for m in tap.json(CLIENT, BOT)[1:]
            )
            assert bridge.bridge.router.batch_limit(BOT) is None
            fortune = await s.call_tool("fortune", {})
            assert not fortune.is_error, [c.text for c in fortune.content if isinstance(c, TextContent)]
            # Paid alongside: the Go harness ignored the mark and refused; the
            # bridge waited for its payment and reissued; one payment, one run.
            assert bridge.pays == [(BOT, FORTUNE_PRICE)]
            assert harness.executions("fortune") == 1
            assert await harness.balance(CLIENT) == 0
            calls = tap.calls("fortune")
            assert calls[0]["params"]["_meta"]["brmcp/payAlongside"] == FORTUNE_PRICE
            assert len({c["params"]["_meta"]["brmcp/callKey"] for c in calls}) == 1
        snapshot = json.loads((tmp_path / "bridge" / "mcpsnapshots" / f"{BOT}.json").read_text())
        assert snapshot["era"] == "handshake"
