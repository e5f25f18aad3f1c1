"""The official MCP conformance suite (server mode, pinned 0.1.16) against
the bridge: fails on any scenario failing outside ``baseline.yml`` and on a
baseline entry that now passes. Skips when the node tools are missing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from brmcp.bridge import Bridge

from . import nodetools
from .fixture import PRICES
from .nodetools import INSTALL_HINT, NodeTools, find_node_tools, node_tools_for
from .stack import BOT, CLIENT, conformance_stack
from .suite import BASELINE, load_baseline, parse_baseline, run_suite


@pytest.fixture
def node_tools() -> NodeTools:
    tools = node_tools_for("conformance")
    if isinstance(tools, str):
        pytest.skip(tools)
    return tools


def _paid_tools(bridge: Bridge) -> Counter[str]:
    log = bridge.spend_log()
    assert all(entry.status == "paid" and entry.bot == BOT for entry in log.entries), log.entries
    assert all(entry.atoms == PRICES[entry.tool] for entry in log.entries), log.entries
    return Counter(entry.tool for entry in log.entries)


@pytest.mark.node
async def test_conformance_suite_matches_baseline(tmp_path: Path, node_tools: NodeTools) -> None:
    async with conformance_stack(tmp_path) as stack:
        report = await run_suite(node_tools, stack.url, tmp_path / "results")
        paid = _paid_tools(stack.bridge)
        payments = sorted(atoms for _, atoms in stack.payer.payments)
        statement = await stack.harness.statement(CLIENT)
        balance = await stack.harness.balance(CLIENT)
    print(report.table())
    assert not report.missing, report.table()
    assert not report.new_failures, "new conformance failures:\n" + report.table()
    assert not report.stale, "baseline entries now pass; remove them from baseline.yml:\n" + report.table()
    assert report.exit_code == 0, "the suite's own baseline check failed:\n" + report.output[-3000:]
    # The priced fixture tools went through the payment loop with a stock
    # client: each call the suite made was paid once and charged once.
    assert set(paid) == set(PRICES), paid
    charges = sorted(-entry.atoms for entry in statement if entry.kind == "charge")
    assert charges == payments
    assert not [entry for entry in statement if entry.kind == "refund"]
    assert balance == 0


def test_baseline_file_parses() -> None:
    names = load_baseline()
    # Empty: every scenario passes, SSE polling included.
    assert names == [], f"{BASELINE} lists {names}"
    assert "tools-call-simple-text" not in names


def test_baseline_parser_rejects_malformed_text() -> None:
    assert parse_baseline("# only a comment\nserver:\n  - ping # why\n  - 'tools-list'\n") == [
        "ping",
        "tools-list",
    ]
    assert parse_baseline("server:\n  - ping\nclient:\n  - initialize\n") == ["ping"]
    for bad in (
        "servers:\n  - ping\n",
        "server:\n  ping\n",
        "server: [ping]\n",
        "server:\n  - ping\n  - ping\n",
    ):
        with pytest.raises(ValueError, match="baseline line"):
            parse_baseline(bad)


def test_missing_node_tools_give_the_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodetools, "MODULES", tmp_path / "node_modules")
    monkeypatch.setenv("PATH", str(tmp_path))  # and no system node either
    assert find_node_tools() == INSTALL_HINT
