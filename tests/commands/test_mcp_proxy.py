"""A stdio-only MCP client reaching a bridge endpoint through ``mcp-proxy``
(PyPI; a maintained stdio ↔ streamable-HTTP proxy, not ours), exactly as the
README's "Stdio-only agents" configuration runs it:

    stdio client → mcp-proxy --transport streamablehttp URL (token from
    API_ACCESS_TOKEN) → brmcp-bridge → fabric → harness bot

mcp-proxy 0.13 needs the MCP SDK 1.x, so it lives in its own virtual
environment (``.ci/install.d/50-mcp-proxy.sh`` → ``.tools/mcp-proxy``); the test
skips with that hint when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult

from brmcp.protocol.payment import PRICE_ATOMS_KEY
from tests.kit.bridge import BOT, TOKEN, bridge_env
from tests.kit.paths import REPO

MCP_PROXY = REPO / ".tools" / "mcp-proxy" / "bin" / "mcp-proxy"
HINT = "mcp-proxy not installed: run .ci/install.d/50-mcp-proxy.sh"


def _proxy_params(url: str, token: str) -> StdioServerParameters:
    """What an agent's stdio config says: the command, the URL, the token in
    the environment (not on the command line, where ps would show it)."""
    return StdioServerParameters(
        command=str(MCP_PROXY),
        args=["--transport", "streamablehttp", url],
        env={"API_ACCESS_TOKEN": token},
    )


@pytest.fixture
def proxy_installed() -> None:
    if not MCP_PROXY.is_file():
        pytest.skip(HINT)


@pytest.mark.usefixtures("proxy_installed")
async def test_stdio_client_pays_through_mcp_proxy_and_the_bridge(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env:
            errlog = (tmp_path / "mcp-proxy.stderr").open("w")
            try:
                params = _proxy_params(env.url, TOKEN)
                async with (
                    stdio_client(params, errlog=errlog) as (read, write),
                    ClientSession(read, write) as s,
                ):
                    init = await s.initialize()
                    assert init.server_info.name  # the bridge's endpoint answered through the proxy
                    tools = {tool.name: tool for tool in (await s.list_tools()).tools}
                    assert tools["paid"].meta is not None
                    assert tools["paid"].meta[PRICE_ATOMS_KEY] == 500
                    free = await s.send_request(
                        CallToolRequest(params=CallToolRequestParams(name="free", arguments={})),
                        CallToolResult,
                    )
                    assert not free.is_error
                    paid = await s.send_request(
                        CallToolRequest(params=CallToolRequestParams(name="paid", arguments={"text": "x"})),
                        CallToolResult,
                    )
                    assert not paid.is_error, paid
                    assert paid.structured_content == {"n": 1}
            finally:
                errlog.close()
            # The bridge paid once (autopay) and the bot ran the tool once.
            assert env.payer.calls == [(BOT, 500)]
            assert env.executions == {"free": 1, "paid": 1}
            spent = [(e.tool, e.atoms, e.status) for e in env.bridge.spend_log().entries]
            assert spent == [("paid", 500, "paid")]


@pytest.mark.usefixtures("proxy_installed")
async def test_wrong_token_through_mcp_proxy_is_refused(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env:
            errlog = (tmp_path / "mcp-proxy.stderr").open("w")
            try:
                params = _proxy_params(env.url, "not-the-token-000000000000")
                # The proxy exits; the SDK reports it inside task-group exception groups.
                with pytest.raises(BaseException) as info:
                    async with (
                        stdio_client(params, errlog=errlog) as (read, write),
                        ClientSession(read, write, read_timeout_seconds=20) as s,
                    ):
                        await s.initialize()
            finally:
                errlog.close()
            assert "Connection closed" in repr(info.value)
            assert "401" in (tmp_path / "mcp-proxy.stderr").read_text()  # the bridge refused the token
            assert env.payer.calls == []
            assert env.executions == {}
