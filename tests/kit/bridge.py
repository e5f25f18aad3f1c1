"""Shared fixture for the bridge tests (the fixture of the Go reference's
``bridge/bridge_test.go``, karamble/brmcp).

:func:`bridge_stack` is the one stack every bridge test stands on: an
in-memory fabric, a bot at BOT (a harness, a raw MCP server, or a bot that
attaches itself) and a bridge at CLIENT with its own data directory and
listener. :func:`bridge_env` is the fixture on it:

A harness bot on the in-memory fabric serves ``paid`` (500 atoms, returns
``{"n": k}``), ``free`` and ``dyn`` (dynamic price 7 atoms); the bridge is
named ``brclientd``, autopay, per-call cap 10 000, per-day cap 100 000,
token ``test-token-0123456789abcdef``, clock at unix 1 800 000 000 in auto
mode; its owned listener binds 127.0.0.1:0. The payer credits the bot's
ledger the way an incoming tip would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult, TextContent

from brmcp import PMSender
from brmcp.bridge import Bridge, BridgeConfig, ManualClock, Payer, Settings
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric
from brmcp.transport.conn import Conn
from tests.kit import BOT, CLIENT
from tests.kit import OTHER_BOT as OTHER_BOT
from tests.kit import until as until

TOKEN = "test-token-0123456789abcdef"
START = 1_800_000_000
NAME = "brclientd"
PAID_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "description": "the text"},
        "count": {"type": "integer"},
    },
}
#: A handshake-era MCP ``initialize`` request (JSON-RPC id 1), for raw HTTP posts.
INIT: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
#: The headers of a streamable-HTTP MCP POST, without credentials.
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def auth(token: str = TOKEN) -> dict[str, str]:
    """:data:`MCP_HEADERS` plus ``Authorization: Bearer <token>``."""
    return {"Authorization": f"Bearer {token}", **MCP_HEADERS}


def fixture_settings(**changes: Any) -> Settings:
    base = Settings(
        enabled=True,
        token=TOKEN,
        mode="autopay",
        per_call_cap_atoms=10_000,
        per_day_cap_atoms=100_000,
        allowed_bots=(BOT,),
    )
    return base.replace(**changes)


class TestPayer:
    """Records every ``pay`` and, by default, credits the bot's ledger with
    the amount (as a confirmed tip would). ``behaviour`` may replace that:
    an async ``(payee, atoms) -> None`` that raises to fail."""

    __test__ = False

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.harness: Harness | None = None
        self.behaviour: Callable[[str, int], Awaitable[None]] | None = None
        self.entered = anyio.Event()

    async def credit(self, payee: str, atoms: int) -> None:
        assert self.harness is not None
        assert payee == BOT
        await self.harness.credit(CLIENT, atoms)

    async def pay(self, payee_uid: str, atoms: int) -> None:
        self.calls.append((payee_uid, atoms))
        self.entered.set()
        if self.behaviour is not None:
            await self.behaviour(payee_uid, atoms)
            return
        await self.credit(payee_uid, atoms)


@dataclass
class Env:
    fabric: Fabric
    harness: Harness
    bridge: Bridge
    payer: TestPayer
    clock: ManualClock
    data_dir: Path
    executions: dict[str, int] = field(default_factory=dict)
    stack: AsyncExitStack | None = None

    @property
    def base_url(self) -> str:
        address = self.bridge.listen_address
        assert address is not None
        return f"http://{address[0]}:{address[1]}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/mcp/{BOT}"

    def new_bridge(self, **overrides: Any) -> Bridge:
        """A second bridge on the same data directory (reload checks)."""
        config = BridgeConfig(
            data_dir=self.data_dir,
            sender=self.fabric.sender(CLIENT),
            payer=self.payer,
            name=NAME,
            clock=self.clock,
            **overrides,
        )
        return Bridge(config)

    @asynccontextmanager
    async def session(
        self, token: str = TOKEN, url: str | None = None, **callbacks: Any
    ) -> AsyncIterator[ClientSession]:
        """An initialized SDK client session through the bridge's listener
        (``callbacks``: ClientSession keyword arguments, e.g. message_handler)."""
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
            streamable_http_client(url or self.url, http_client=http) as (read, write),
            ClientSession(read, write, **callbacks) as session,
        ):
            await session.initialize()
            yield session

    def http(self, **kwargs: Any) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(base_url=self.base_url, timeout=30, **kwargs)


async def call(session: ClientSession, tool: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
    """A tools/call without the SDK's implicit tools/list."""
    request = CallToolRequest(params=CallToolRequestParams(name=tool, arguments=arguments or {}))
    return await session.send_request(request, CallToolResult)


def texts(result: CallToolResult) -> list[str]:
    return [c.text for c in result.content if isinstance(c, TextContent)]


def joined(result: CallToolResult) -> str:
    return "\n".join(texts(result))


def build_harness(data_dir: Path, executions: dict[str, int]) -> Harness:
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir,
            allowed_peers={CLIENT},
            calls_per_minute=100_000,
            name="fixture-bot",
            # A marked call waits this long for a credit the test may never
            # let land (late-credit and failing-payer tests).
            hold_seconds=2.0,
        )
    )

    async def paid(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        executions["paid"] = executions.get("paid", 0) + 1
        return {"n": executions["paid"]}

    async def free(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        executions["free"] = executions.get("free", 0) + 1
        return {"ok": True}

    async def dyn(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        executions["dyn"] = executions.get("dyn", 0) + 1
        return {"dyn": True}

    harness.add_tool("paid", paid, description="A paid tool", input_schema=PAID_SCHEMA, price_atoms=500)
    harness.add_tool("free", free, description="A free tool", input_schema={"type": "object"})
    harness.add_tool(
        "dyn", dyn, description="Priced per call", input_schema={"type": "object"}, price=_seven_atoms
    )
    return harness


async def _seven_atoms(ctx: CallContext, args: dict[str, Any]) -> int:
    return 7


#: A bot for :func:`bridge_stack`: a :class:`Harness` (entered, started and
#: attached at its uid), a function serving each MCP connection the fabric
#: accepts for the uid (e.g. an SDK server's ``run``), or an async context
#: manager that attaches itself to the fabric when entered (a hostile bot).
Bot = Harness | Callable[[Conn], Awaitable[None]] | AbstractAsyncContextManager[Any]


async def serve_bot(stack: AsyncExitStack, fabric: Fabric, bot: Bot, uid: str = BOT) -> None:
    """Put ``bot`` on the (entered) ``fabric`` at ``uid``, its context on ``stack``."""
    if isinstance(bot, Harness):
        await stack.enter_async_context(bot)
        router = await bot.start(fabric.sender(uid))
        fabric.attach(uid, router.handle_pm)
    elif isinstance(bot, AbstractAsyncContextManager):
        await stack.enter_async_context(bot)
    else:
        await stack.enter_async_context(fabric.router(uid, accept=bot))


def fabric_bridge(
    fabric: Fabric,
    data_dir: Path,
    payer: Payer,
    *,
    sender: PMSender | None = None,
    listen: str | None = "127.0.0.1:0",
    client: str = CLIENT,
    **config: Any,
) -> Bridge:
    """A bridge at ``client`` on ``fabric`` (PMs to it attached; not
    started): ``sender`` instead of the fabric's sender for ``client`` (e.g.
    one that records or wraps it); ``config`` adds :class:`BridgeConfig`
    fields."""
    bridge = Bridge(
        BridgeConfig(
            data_dir=data_dir,
            sender=sender if sender is not None else fabric.sender(client),
            payer=payer,
            listen=listen,
            **config,
        )
    )
    fabric.attach(client, bridge.handle_pm)
    return bridge


@dataclass
class Stack:
    """What :func:`bridge_stack` built: the fabric, the bridge (started), its
    data directory, and the exit stack that unwinds them."""

    fabric: Fabric
    bridge: Bridge
    data_dir: Path
    stack: AsyncExitStack


@asynccontextmanager
async def bridge_stack(
    tmp_path: Path,
    payer: Payer,
    *,
    bot: Bot | None,
    settings: Settings | None = None,
    fabric: Fabric | None = None,
    sender: PMSender | None = None,
    listen: str | None = "127.0.0.1:0",
    bot_uid: str = BOT,
    client: str = CLIENT,
    **config: Any,
) -> AsyncIterator[Stack]:
    """The fabric, the bot and the bridge, entered: ``fabric`` (a clean
    :class:`Fabric` when None; entered here), ``bot`` at ``bot_uid``
    (:func:`serve_bot`; None: the caller attaches one), and a bridge at
    ``client`` (:func:`fabric_bridge`) whose data directory is
    ``tmp_path/bridge``, with ``settings`` written there first when given."""
    data_dir = tmp_path / "bridge"
    data_dir.mkdir(parents=True, exist_ok=True)
    if settings is not None:
        (data_dir / "mcpclient.json").write_text(settings.to_json())
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(fabric if fabric is not None else Fabric())
        if bot is not None:
            await serve_bot(stack, fabric, bot, bot_uid)
        bridge = fabric_bridge(fabric, data_dir, payer, sender=sender, listen=listen, client=client, **config)
        await stack.enter_async_context(bridge)
        yield Stack(fabric, bridge, data_dir, stack)


@asynccontextmanager
async def bridge_env(
    tmp_path: Path,
    *,
    settings: Settings | None = None,
    auto_clock: bool = True,
    listen: str | None = "127.0.0.1:0",
    write_settings: bool = True,
    spend_entries: list[dict[str, Any]] | None = None,
    clock: ManualClock | None = None,
    **config: Any,
) -> AsyncIterator[Env]:
    """The fixture, entered: fabric, harness at BOT, bridge at CLIENT
    (:func:`bridge_stack`); ``config`` adds :class:`BridgeConfig` fields."""
    data_dir = tmp_path / "bridge"
    data_dir.mkdir(exist_ok=True)
    if spend_entries is not None:
        (data_dir / "mcpspend.json").write_text(json.dumps(spend_entries, indent=2))
    if clock is None:
        clock = ManualClock(START, auto=auto_clock)
    payer = TestPayer()
    executions: dict[str, int] = {}
    harness = build_harness(tmp_path / "bot", executions)
    payer.harness = harness
    written = (settings or fixture_settings()) if write_settings else None
    async with bridge_stack(
        tmp_path, payer, bot=harness, settings=written, listen=listen, name=NAME, clock=clock, **config
    ) as built:
        yield Env(built.fabric, harness, built.bridge, payer, clock, built.data_dir, executions, built.stack)
