"""MCP Inspector CLI (``@modelcontextprotocol/inspector`` 2.12.0, pinned by
``.ci/node-tools``) as a stock agent against the bridge, with the bearer
header: ``tools/list`` shows the prices in ``_meta``, a paid ``tools/call``
pays once, runs once, is charged once. Uses the shared bridge fixture
(tests/kit/bridge.py: autopay, payer credits the bot's ledger).
Skips when the node tools are missing."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conformance.nodetools import NodeTools, node_tools_for
from tests.kit.bridge import BOT, CLIENT, TOKEN, Env, bridge_env

pytestmark = pytest.mark.node

#: Limit for one Inspector run (seconds); one run normally takes about a second.
RUN_LIMIT = 60.0


@pytest.fixture
def node_tools() -> NodeTools:
    tools = node_tools_for("inspector")
    if isinstance(tools, str):
        pytest.skip(tools)
    return tools


async def inspector(
    tools: NodeTools, home: Path, url: str, *args: str, token: str | None = TOKEN, tty: bool = False
) -> tuple[int, str, str]:
    """Run ``inspector --cli URL --transport http [--header ...] ARGS``;
    returns (exit code, stdout, stderr). HOME points at ``home`` so the
    Inspector's catalog never touches the real one."""
    assert tools.inspector is not None
    command = [str(tools.node), str(tools.inspector), "--cli", url, "--transport", "http"]
    if token is not None:
        command += ["--header", f"Authorization: Bearer {token}"]
    command += list(args)
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "MCP_INSPECTOR_SECRET_STORE": "memory"}
    if tty:
        # util-linux script(1) gives the Inspector a terminal, as a person has.
        command = ["script", "-qec", shlex.join(command), "/dev/null"]
    with anyio.fail_after(RUN_LIMIT):  # run_process kills the Inspector when cancelled
        done = await anyio.run_process(command, env=env, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def _json(stdout: str) -> Any:
    return json.loads(stdout)


def _advertised(env: Env) -> dict[str, dict[str, Any]]:
    return {spec.name: dict(spec.to_tool().meta or {}) for spec in env.harness.tools()}


async def test_inspector_lists_tools_with_prices(tmp_path: Path, node_tools: NodeTools) -> None:
    async with bridge_env(tmp_path) as env:
        code, out, err = await inspector(node_tools, tmp_path, env.url, "--method", "tools/list")
        assert code == 0, err
        listed = {tool["name"]: tool for tool in _json(out)["tools"]}
        assert set(listed) == {"paid", "free", "dyn"}
        assert {name: tool.get("_meta") for name, tool in listed.items()} == _advertised(env)
        assert listed["paid"]["_meta"] == {"brmcp/priceAtoms": 500}
        assert listed["free"]["_meta"] == {"brmcp/priceAtoms": 0}
        assert listed["dyn"]["_meta"] == {"brmcp/pricing": "dynamic"}
        assert listed["paid"]["inputSchema"]["properties"]["count"] == {"type": "integer"}
        assert env.payer.calls == []
        assert env.executions == {}


async def test_inspector_paid_call_pays_once_and_runs_once(tmp_path: Path, node_tools: NodeTools) -> None:
    async with bridge_env(tmp_path) as env:
        code, out, err = await inspector(
            node_tools,
            tmp_path,
            env.url,
            "--method",
            "tools/call",
            "--tool-name",
            "paid",
            "--tool-arg",
            "text=hello",
            "count=3",
        )
        assert code == 0, err
        result = _json(out)
        assert result["isError"] is False
        assert result["structuredContent"] == {"n": 1}
        # The tool's own text, then the bridge's note of what moved (BRIDGE.md §The hard bound).
        assert result["content"][0] == {"type": "text", "text": '{"n":1}'}
        assert result["content"][1]["text"].startswith("brclientd: paid 500 atoms to the bot for this call")
        assert len(result["content"]) == 2
        assert env.payer.calls == [(BOT, 500)]
        assert env.executions == {"paid": 1}
        log = env.bridge.spend_log()
        assert [(e.bot, e.tool, e.atoms, e.status) for e in log.entries] == [(BOT, "paid", 500, "paid")]
        assert log.day_total_atoms == 500
        statement = await env.harness.statement(CLIENT)
        assert [(e.kind, e.atoms) for e in statement] == [("credit", 500), ("charge", -500)]
        assert await env.harness.balance(CLIENT) == 0


async def test_inspector_without_the_token_is_refused(tmp_path: Path, node_tools: NodeTools) -> None:
    async with bridge_env(tmp_path) as env:
        code, out, err = await inspector(node_tools, tmp_path, env.url, "--method", "tools/list", token=None)
        assert code != 0
        assert out == ""
        # The 401 makes the Inspector want OAuth, which it cannot do unattended.
        assert '"auth_required"' in err
        assert env.bridge.link(BOT) is None  # refused at the gate: the bot was never dialed


async def test_inspector_reports_the_bridge_auth_error(tmp_path: Path, node_tools: NodeTools) -> None:
    """A missing or wrong token ends in the Inspector's auth error carrying the
    bridge's hint (the 401's JSON body and ``WWW-Authenticate: Bearer``), not
    in an OAuth login: without a terminal with --stored-auth-only, and with a
    terminal, where it tries its OAuth fallback and reports the bridge's
    refusal of it."""
    async with bridge_env(tmp_path) as env:
        for token in (None, "wrong-token"):
            code, out, err = await inspector(
                node_tools, tmp_path, env.url, "--method", "tools/list", "--stored-auth-only", token=token
            )
            assert code != 0
            assert out == ""
            error = json.loads(err.strip().splitlines()[-1])["error"]
            assert error["code"] == "auth_required"
            assert f"brmcp-bridge --datadir {env.data_dir} config-snippet" in error["message"]
        if shutil.which("script") is not None:
            code, out, err = await inspector(
                node_tools, tmp_path, env.url, "--method", "tools/list", token="wrong-token", tty=True
            )
            assert code != 0
            assert '"auth_required"' in out + err
            assert f"brmcp-bridge --datadir {env.data_dir} config-snippet" in out + err
        assert env.bridge.link(BOT) is None
