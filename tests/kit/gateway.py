"""Shared pieces for the gateway tests: agent → bridge → fabric → gateway
(a Harness in front of an upstream MCP server) → upstream.

``async with gateway_stack(tmp_path, upstream, prices) as env`` starts, on
loopback: an in-memory :class:`~brmcp.testing.Fabric`; a harness at
:data:`BOT` (allowing :data:`CLIENT` only) with a :class:`~brmcp.gateway.Gateway`
in front of ``upstream``; a bridge at :data:`CLIENT` with its own listener,
autopay and caps of 100 000 atoms per call; and a payer that credits the
bot's ledger as a confirmed tip would. ``env.session()`` opens an SDK client
session through the bridge's HTTP endpoint.

Also: finding the upstreams nobody here wrote (``mcp-server-time`` from
PyPI, ``@modelcontextprotocol/server-everything`` from npm run with the
pinned Node 22) and a stdio wrapper that records the upstream's pid, so a
test can kill it mid-call.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult, TextContent

from brmcp.bridge import Bridge, Settings
from brmcp.gateway import Gateway, PriceTable, UpstreamConfig
from brmcp.server import Harness, HarnessConfig
from brmcp.testing import Fabric, uid
from tests.kit import until as until
from tests.kit.bridge import bridge_stack
from tests.kit.paths import REPO

BOT = uid(0x6A)
CLIENT = uid(0x6C)
TOKEN = "gateway-token-0123456789abcdef"
NODE_MODULES = REPO / ".tools" / "node" / "node_modules"
EVERYTHING = NODE_MODULES / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
NODE_HINT = "server-everything not installed: run .ci/node-tools (needs node and npm)"


def time_server_command() -> list[str]:
    """argv of ``mcp-server-time`` (PyPI, in the test extra) at UTC."""
    exe = shutil.which(
        "mcp-server-time", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    )
    if exe is None:
        return [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
    return [exe, "--local-timezone", "UTC"]


def everything_command(transport: str = "stdio") -> list[str] | str:
    """argv of server-everything under the pinned Node 22, or a skip reason."""
    from tests.conformance.nodetools import find_node_tools

    if not EVERYTHING.is_file():
        return NODE_HINT
    tools = find_node_tools()
    if isinstance(tools, str):
        return tools
    return [str(tools.node), str(EVERYTHING), transport]


def pid_wrapped(command: list[str], pidfile: Path) -> list[str]:
    """``command`` run through ``sh``, which writes its pid to ``pidfile``
    and then becomes the command (``exec``), so the pid is the upstream's."""
    quoted = " ".join("'" + part.replace("'", "'\\''") + "'" for part in command)
    return ["/bin/sh", "-c", f"echo $$ > '{pidfile}'; exec {quoted}"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CreditingPayer:
    """The bridge's payer: credits the bot's ledger with each payment (as a
    confirmed tip would) and records the amounts."""

    def __init__(self) -> None:
        self.harness: Harness | None = None
        self.payments: list[int] = []

    async def pay(self, payee_uid: str, atoms: int) -> None:
        assert payee_uid == BOT, payee_uid
        assert self.harness is not None
        self.payments.append(atoms)
        await self.harness.credit(CLIENT, atoms)


@dataclass
class GatewayEnv:
    fabric: Fabric
    harness: Harness
    gateway: Gateway
    bridge: Bridge
    payer: CreditingPayer
    stack: AsyncExitStack
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        address = self.bridge.listen_address
        assert address is not None
        return f"http://{address[0]}:{address[1]}/mcp/{BOT}"

    @asynccontextmanager
    async def session(self, **kwargs: Any) -> AsyncIterator[ClientSession]:
        """An initialized SDK client session through the bridge's listener."""
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write, **kwargs) as session,
        ):
            await session.initialize()
            yield session

    def bridge_link_stale(self) -> bool:
        """Whether the bridge's tool snapshot of the bot is marked stale."""
        links = getattr(self.bridge, "_links", {})
        link = links.get(BOT)
        return link is not None and bool(link.stale)

    def bridge_link_lists(self, tool: str) -> bool:
        """Whether the bridge's tool snapshot of the bot has ``tool`` (the
        bridge refreshes it as soon as the bot says its list changed)."""
        links = getattr(self.bridge, "_links", {})
        link = links.get(BOT)
        return link is not None and link.tool(tool) is not None

    async def statement_kinds(self) -> list[tuple[str, int]]:
        return [(entry.kind, entry.atoms) for entry in await self.harness.statement(CLIENT)]


@asynccontextmanager
async def gateway_stack(
    tmp_path: Path,
    upstream: UpstreamConfig,
    prices: PriceTable,
    *,
    errlog_name: str = "upstream.stderr",
    **upstream_options: Any,
) -> AsyncIterator[GatewayEnv]:
    settings = Settings(
        enabled=True,
        token=TOKEN,
        mode="autopay",
        per_call_cap_atoms=100_000,
        per_day_cap_atoms=1_000_000,
        allowed_bots=(BOT,),
    )
    upstream_options.setdefault("backoff_initial", 0.05)
    bridge_dir = tmp_path / "bridge"
    bridge_dir.mkdir(parents=True, exist_ok=True)  # and tmp_path, where the errlog lives
    async with AsyncExitStack() as stack:
        errlog = stack.enter_context(open(tmp_path / errlog_name, "w"))  # noqa: SIM115, ASYNC230
        harness = Harness(
            HarnessConfig(
                data_dir=tmp_path / "bot",
                allowed_peers={CLIENT},
                calls_per_minute=100_000,
                name="brmcp-gateway-test",
                tools_list_changed=True,
            )
        )
        gateway = Gateway(harness, upstream, prices, base_dir=tmp_path, errlog=errlog, **upstream_options)
        # The gateway's task group is entered before the harness (whose
        # router owns a task group too), so they unwind in order.
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        await tg.start(gateway.run)
        payer = CreditingPayer()
        payer.harness = harness
        built = await stack.enter_async_context(
            bridge_stack(tmp_path, payer, bot=harness, settings=settings, bot_uid=BOT, client=CLIENT)
        )
        yield GatewayEnv(built.fabric, harness, gateway, built.bridge, payer, stack)


async def call(session: ClientSession, tool: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
    """A tools/call without the SDK's implicit tools/list and output check."""
    request = CallToolRequest(params=CallToolRequestParams(name=tool, arguments=arguments or {}))
    return await session.send_request(request, CallToolResult)


def joined(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))
