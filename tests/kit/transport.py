"""Shared pieces for the transport tests: an official low-level MCP server
with a few tools, an ``accept`` that serves it on each inbound Conn, a
fabric with that bot and one caller, and a helper that opens an initialized
ClientSession on a dialed Conn.

Imported by tests/test_transport_*.py (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.server import Server, ServerRequestContext

from brmcp import Conn, Router
from brmcp.testing import Fabric, uid
from tests.kit import ALICE, BOT
from tests.kit import until as until

MALLORY = uid(14)

TOOLS = [
    types.Tool(name="echo", description="Echo the arguments and the caller", input_schema={"type": "object"}),
    types.Tool(name="big", description="Return n bytes of text", input_schema={"type": "object"}),
    types.Tool(name="sleep", description="Sleep for s seconds", input_schema={"type": "object"}),
]


def big_text(n: int) -> str:
    """Deterministic, non-repeating-looking ASCII text of exactly ``n`` characters."""
    block = "".join(format(i, "08x") for i in range(4096))  # 32 KiB
    return (block * (n // len(block) + 1))[:n]


@dataclass
class Bot:
    """A low-level SDK ``Server`` plus a record of what its handlers saw."""

    accepts: int = 0
    #: every Conn handed to accept, in order
    conns: list[Conn] = field(default_factory=list)
    #: (caller uid from ctx.request, tool name, arguments) per handler execution
    calls: list[tuple[Any, str, dict[str, Any]]] = field(default_factory=list)
    server: Server[Any] = field(init=False)

    def __post_init__(self) -> None:
        self.server = Server(
            "brmcp-test-bot", version="1.0", on_list_tools=self._list, on_call_tool=self._call
        )

    async def _list(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def _call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        args = dict(params.arguments or {})
        self.calls.append((ctx.request, params.name, args))
        if params.name == "big":
            text = big_text(int(args["n"]))
        elif params.name == "sleep":
            await anyio.sleep(float(args["s"]))
            text = "slept"
        else:
            text = json.dumps({"caller": ctx.request, "args": args}, sort_keys=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    async def accept(self, conn: Conn) -> None:
        """A Router ``accept``: serve one inbound session until it closes."""
        self.accepts += 1
        self.conns.append(conn)
        await self.server.run(
            conn.read_stream, conn.write_stream, self.server.create_initialization_options()
        )

    def executions(self, name: str = "echo", key: str = "token") -> Counter[Any]:
        """How often the handler ran per value of argument ``key`` of tool ``name``."""
        return Counter(args.get(key) for _, tool, args in self.calls if tool == name)


@asynccontextmanager
async def session(router: Router, peer: str, *, read_timeout: float = 10.0) -> AsyncIterator[ClientSession]:
    """Dial ``peer`` and yield an initialized handshake-era ClientSession
    whose requests time out after ``read_timeout`` seconds."""
    conn = router.dial(peer)
    async with ClientSession(
        conn.read_stream, conn.write_stream, read_timeout_seconds=read_timeout
    ) as client:
        await client.initialize()
        yield client


class BotAndAlice(NamedTuple):
    fabric: Fabric
    bot: Bot
    #: the bot's server-role router
    server: Router
    #: ALICE's client-role router
    client: Router


@asynccontextmanager
async def bot_and_alice(**server_options: Any) -> AsyncIterator[BotAndAlice]:
    """A fresh :class:`Bot` served at :data:`BOT` on a new fabric (its router
    built with ``server_options``: Router/RouterOptions keywords), and a
    client-role router for :data:`ALICE`."""
    bot = Bot()
    async with (
        Fabric() as fabric,
        fabric.router(BOT, accept=bot.accept, **server_options) as server,
        fabric.router(ALICE) as client,
    ):
        yield BotAndAlice(fabric, bot, server, client)


async def call(
    client: ClientSession, name: str, args: dict[str, Any], read_timeout: float | None = None
) -> str:
    """tools/call without the SDK's implicit tools/list; returns the text
    content. ``read_timeout`` overrides the session's timeout (seconds)."""
    result = await client.send_request(
        types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=args)),
        types.CallToolResult,
        request_read_timeout_seconds=read_timeout,
    )
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def echoed(text: str) -> dict[str, Any]:
    """Decode the echo tool's reply ``{"caller": uid, "args": {...}}``."""
    value = json.loads(text)
    assert isinstance(value, dict)
    return value
