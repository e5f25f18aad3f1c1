"""The official MCP conformance suite (server mode, pinned 0.1.16) against a
bridge whose bot is a brmcp gateway in front of server-everything: fails on
any scenario failing outside ``gateway_baseline.yml`` and on a baseline entry
that now passes. Skips when the node tools or server-everything are missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from .gateway_stack import everything_argv, gateway_conformance_stack
from .nodetools import node_tools_for
from .stack import CLIENT
from .suite import load_baseline, run_suite

GATEWAY_BASELINE = Path(__file__).with_name("gateway_baseline.yml")
#: Scenarios that must pass through the gateway (the ones that do not need the
#: suite's own fixture tools, resources or prompts).
MUST_PASS = {
    "server-initialize",
    "ping",
    "logging-set-level",
    "tools-list",
    "resources-list",
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
}


@pytest.mark.node
async def test_conformance_through_the_gateway_matches_its_baseline(tmp_path: Path) -> None:
    tools = node_tools_for("conformance")
    if isinstance(tools, str):
        pytest.skip(tools)
    argv = everything_argv(tools)
    if argv is None:
        pytest.skip("server-everything not installed: run .ci/node-tools")
    async with gateway_conformance_stack(tmp_path, argv) as stack:
        report = await run_suite(tools, stack.url, tmp_path / "results", baseline_path=GATEWAY_BASELINE)
        statement = await stack.harness.statement(CLIENT)
    print(report.table())
    assert not report.missing, report.table()
    assert not report.new_failures, "new conformance failures:\n" + report.table()
    assert not report.stale, (
        "baseline entries now pass; remove them from gateway_baseline.yml:\n" + report.table()
    )
    assert report.exit_code == 0, "the suite's own baseline check failed:\n" + report.output[-3000:]
    assert set(report.passing) >= MUST_PASS, report.table()
    # No scenario calls a priced tool of server-everything: nothing moved.
    assert statement == []


def test_gateway_baseline_parses() -> None:
    names = load_baseline(GATEWAY_BASELINE)
    assert names
    assert not MUST_PASS & set(names)
