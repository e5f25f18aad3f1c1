"""Fewer relay round trips between the bridge and its bots (BRIDGE.md §Eras
and snapshots): the modern era with bots that take it,
era detection and fall-back for handshake-only bots, snapshots that survive
restarts, and tools/list_changed relayed to agents. PM counts, not times."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from brmcp import Conn
from brmcp.bridge import Bridge, ManualClock
from brmcp.bridge.links import SNAPSHOT_DIR, BotSnapshot
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric
from tests.kit import pm_parts
from tests.kit.bridge import (
    BOT,
    CLIENT,
    NAME,
    TOKEN,
    TestPayer,
    build_harness,
    call,
    fabric_bridge,
    fixture_settings,
    serve_bot,
    texts,
    until,
)

START = 1_800_000_000


@dataclass
class Rig:
    fabric: Fabric
    data_dir: Path
    stack: AsyncExitStack
    payer: TestPayer
    bridge: Bridge | None = None
    #: Envelope parts between the bridge and the bot (a batch PM counts
    #: each of its parts, WIRE.md §Batches): one per message here.
    parts: int = 0

    def count(self, from_uid: str, to_uid: str, text: str) -> None:
        if {from_uid, to_uid} == {CLIENT, BOT}:
            self.parts += len(pm_parts(text))

    def pms(self) -> int:
        """Messages exchanged so far (single-part ones: one part each)."""
        return self.parts

    async def start_bridge(self) -> Bridge:
        bridge = fabric_bridge(
            self.fabric, self.data_dir, self.payer, name=NAME, clock=ManualClock(START, auto=True)
        )
        await bridge.start()
        self.bridge = bridge
        return bridge

    async def stop_bridge(self) -> None:
        assert self.bridge is not None
        await self.bridge.close()
        self.bridge = None

    @property
    def url(self) -> str:
        assert self.bridge is not None
        address = self.bridge.listen_address
        assert address is not None
        return f"http://{address[0]}:{address[1]}/mcp/{BOT}"

    @asynccontextmanager
    async def agent(self, **callbacks: Any) -> AsyncIterator[ClientSession]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write, read_timeout_seconds=30, **callbacks) as session,
        ):
            await session.initialize()
            yield session

    def snapshot_file(self) -> Path:
        return self.data_dir / SNAPSHOT_DIR / f"{BOT}.json"


@asynccontextmanager
async def rig(tmp_path: Path, *, harness: Harness | None = None, accept: Any = None) -> AsyncIterator[Rig]:
    """Fabric, a bot at BOT (a ``harness`` or an ``accept`` function) and a
    data directory for bridges started with :meth:`Rig.start_bridge`."""
    data_dir = tmp_path / "bridge"
    data_dir.mkdir()
    (data_dir / "mcpclient.json").write_text(fixture_settings().to_json())
    payer = TestPayer()
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric())
        if harness is not None:
            payer.harness = harness
        await serve_bot(stack, fabric, harness if harness is not None else accept)
        r = Rig(fabric, data_dir, stack, payer)
        fabric.add_tap(r.count)
        try:
            yield r
        finally:
            if r.bridge is not None:
                await r.bridge.close()


async def _serve_rest(server: Server[Any], conn: Conn, first: SessionMessage, methods: list[str]) -> None:
    """Serve ``conn`` with the SDK ``server``, starting with the already
    read ``first`` message, recording the method of every later one."""
    send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](16)

    async def pump() -> None:
        async with send:
            await send.send(first)
            async for item in conn.read_stream:
                if isinstance(item, SessionMessage):
                    methods.append(getattr(item.message, "method", ""))
                await send.send(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump)
        await server.run(receive, conn.write_stream, server.create_initialization_options())
        tg.cancel_scope.cancel()


def handshake_only(server: Server[Any], methods: list[str]) -> Any:
    """A bot ``accept`` that speaks only the handshake era, as the Go
    reference does: a first request other than initialize is answered
    ``method "<m>" is invalid during session initialization``."""

    async def accept(conn: Conn) -> None:
        first = await conn.read_stream.receive()
        assert isinstance(first, SessionMessage)
        message = first.message
        method = getattr(message, "method", "")
        methods.append(method)
        if method != "initialize":
            if isinstance(message, types.JSONRPCRequest):
                error = types.JSONRPCError(
                    jsonrpc="2.0",
                    id=message.id,
                    error=types.ErrorData(
                        code=types.INVALID_REQUEST,
                        message=f'method "{method}" is invalid during session initialization',
                    ),
                )
                await conn.write_stream.send(SessionMessage(error))
            return
        await _serve_rest(server, conn, first, methods)

    return accept


def changing_server() -> Server[Any]:
    """A plain SDK bot whose ``grow`` tool adds a tool and says so with
    notifications/tools/list_changed."""
    names = ["grow"]

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[types.Tool(name=n, input_schema={"type": "object"}) for n in names]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name == "grow":
            names.append(f"t{len(names)}")
            await ctx.session.send_tool_list_changed()
        return types.CallToolResult(content=[types.TextContent(type="text", text=params.name)])

    return Server("changing", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


# -- the modern era and snapshots ---------------------------------------------------


async def test_first_contact_is_one_round_trip_and_restart_costs_none(tmp_path: Path) -> None:
    executions: dict[str, int] = {}
    harness = build_harness(tmp_path / "bot", executions)
    with anyio.fail_after(30):
        async with rig(tmp_path, harness=harness) as r:
            await r.start_bridge()
            before = r.pms()
            async with r.agent() as agent:
                # initialize's pre-flight: one marked initialize, answered
                # with the era and the tools (WIRE.md §Eras, first contact).
                assert r.pms() - before == 2
                before = r.pms()
                assert {t.name for t in (await agent.list_tools()).tools} == {"paid", "free", "dyn"}
                assert r.pms() - before == 0
                before = r.pms()
                assert not (await call(agent, "free")).is_error
                assert r.pms() - before == 2
            assert r.bridge is not None
            link = r.bridge.link(BOT)
            assert link is not None
            assert link.era == "modern"
            # The first-contact sid (abandoned: the bot serves the modern
            # era) and the modern one the call went on.
            assert link.dials == 2
            await until(r.snapshot_file().exists)
            saved = r.snapshot_file()
            assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
            snap = BotSnapshot.from_json(saved.read_text())
            assert (snap.bot, snap.era, snap.protocol_version) == (BOT, "modern", "2026-07-28")
            assert {t.name for t in snap.tools} == {"paid", "free", "dyn"}
            assert snap.tools[0].meta is not None
            assert snap.capabilities is not None
            assert snap.capabilities.tools is not None

            # Restart: tools/list is served from the snapshot with no PM.
            await r.stop_bridge()
            await r.start_bridge()
            before = r.pms()
            async with r.agent() as agent:
                listed = await agent.list_tools()
                assert r.pms() - before == 0
                assert {t.name for t in listed.tools} == {"paid", "free", "dyn"}
                assert not (await call(agent, "free")).is_error
                assert r.pms() - before == 2
                link = r.bridge.link(BOT)
                assert link is not None
                # ... and refreshed in the background after that first call.
                await until(lambda: link.refreshes == 1)
                assert r.pms() - before == 4


async def test_handshake_only_bot_is_detected_and_remembered(tmp_path: Path) -> None:
    methods: list[str] = []
    bot = Server("go-like", version="1", on_list_tools=_echo_tools, on_call_tool=_echo_call)
    with anyio.fail_after(30):
        async with rig(tmp_path, accept=handshake_only(bot, methods)) as r:
            await r.start_bridge()
            before = r.pms()
            async with r.agent() as agent:
                # Exactly the reference's warm-up: the marked initialize
                # (answered plainly), initialized, tools/list, its answer.
                assert r.pms() - before == 5
                assert methods[:3] == ["initialize", "notifications/initialized", "tools/list"]
                before = r.pms()
                result = await call(agent, "echo", {"text": "hi"})
                assert not result.is_error
                assert r.pms() - before == 2
            assert r.bridge is not None
            link = r.bridge.link(BOT)
            assert link is not None
            assert link.era == "handshake"
            await until(r.snapshot_file().exists)
            await until(lambda: json.loads(r.snapshot_file().read_text())["era"] == "handshake")

            # The era is remembered: no probe after a restart.
            await r.stop_bridge()
            await r.start_bridge()
            methods.clear()
            before = r.pms()
            async with r.agent() as agent:
                assert (await agent.list_tools()).tools
                assert not (await call(agent, "echo", {"text": "again"})).is_error
            assert methods[0] == "initialize"
            assert "tools/list" not in methods[:3]
            # initialize, answer, initialized; the call and its answer.
            assert r.pms() - before <= 5 + 2  # plus at most the background refresh


def modern_only(server: Server[Any], methods: list[str]) -> Any:
    """A bot ``accept`` that refuses ``initialize`` (a server of the modern
    era only) and serves enveloped requests with the SDK."""

    async def accept(conn: Conn) -> None:
        first = await conn.read_stream.receive()
        assert isinstance(first, SessionMessage)
        message = first.message
        method = getattr(message, "method", "")
        methods.append(method)
        if method == "initialize":
            assert isinstance(message, types.JSONRPCRequest)
            error = types.JSONRPCError(
                jsonrpc="2.0",
                id=message.id,
                error=types.ErrorData(code=types.METHOD_NOT_FOUND, message="initialize: modern era only"),
            )
            await conn.write_stream.send(SessionMessage(error))
            return
        await _serve_rest(server, conn, first, methods)

    return accept


async def test_first_contact_with_a_bot_that_pushes_keeps_its_handshake_session(tmp_path: Path) -> None:
    """A brmcp bot that serves resources (it may push updates) answers the
    marked initialize with its tools, but the bridge stays on that
    handshake session: initialized and tools/list there (5 PMs, the
    reference's warm-up, on one sid), and the era is handshake."""
    executions: dict[str, int] = {}
    harness = build_harness(tmp_path / "bot", executions)

    async def readme(ctx: CallContext) -> str:
        return "hello"

    harness.add_resource("file:///readme", readme, name="readme")
    with anyio.fail_after(30):
        async with rig(tmp_path, harness=harness) as r:
            await r.start_bridge()
            before = r.pms()
            async with r.agent() as agent:
                assert r.pms() - before == 5
                assert {t.name for t in (await agent.list_tools()).tools} == {"paid", "free", "dyn"}
                assert r.pms() - before == 5
                assert not (await call(agent, "free")).is_error
                assert r.pms() - before == 7
            assert r.bridge is not None
            link = r.bridge.link(BOT)
            assert link is not None
            assert link.era == "handshake"
            assert link.dials == 1


async def test_first_contact_with_a_modern_only_bot(tmp_path: Path) -> None:
    """A bot that refuses initialize itself is asked in the modern era; the
    era is remembered."""
    methods: list[str] = []
    bot = Server("modern-only", version="1", on_list_tools=_echo_tools, on_call_tool=_echo_call)
    with anyio.fail_after(30):
        async with rig(tmp_path, accept=modern_only(bot, methods)) as r:
            await r.start_bridge()
            before = r.pms()
            async with r.agent() as agent:
                # The refused initialize (2 PMs), then one modern tools/list.
                assert r.pms() - before == 4
                assert methods[:2] == ["initialize", "tools/list"]
                before = r.pms()
                result = await call(agent, "echo", {"text": "hi"})
                assert not result.is_error
                assert r.pms() - before == 2
            assert r.bridge is not None
            link = r.bridge.link(BOT)
            assert link is not None
            assert link.era == "modern"
            await until(r.snapshot_file().exists)
            await until(lambda: json.loads(r.snapshot_file().read_text())["era"] == "modern")


async def test_tools_list_changed_is_refreshed_then_relayed(tmp_path: Path) -> None:
    methods: list[str] = []
    inbox: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            inbox.append(message.method)

    with anyio.fail_after(30):
        async with rig(tmp_path, accept=handshake_only(changing_server(), methods)) as r:
            await r.start_bridge()
            async with r.agent(message_handler=on_message) as agent:
                assert agent.initialize_result is not None
                tools = agent.initialize_result.capabilities.tools
                assert tools is not None
                assert tools.list_changed is True
                assert [t.name for t in (await agent.list_tools()).tools] == ["grow"]
                assert not (await call(agent, "grow")).is_error
                await until(lambda: "notifications/tools/list_changed" in inbox)
                # Relayed after the refresh: the agent's re-list is already fresh, with no PM.
                before = r.pms()
                assert [t.name for t in (await agent.list_tools()).tools] == ["grow", "t1"]
                assert r.pms() == before
                assert r.snapshot_file().exists()
                await until(lambda: "t1" in r.snapshot_file().read_text())


async def test_unusable_snapshot_is_ignored(tmp_path: Path) -> None:
    executions: dict[str, int] = {}
    harness = build_harness(tmp_path / "bot", executions)
    with anyio.fail_after(30):
        async with rig(tmp_path, harness=harness) as r:
            r.snapshot_file().parent.mkdir(parents=True)
            r.snapshot_file().write_text('{"bot": "nope", "era": "modern"')
            await r.start_bridge()
            before = r.pms()
            async with r.agent() as agent:
                assert r.pms() - before == 2  # asked the bot again
                assert {t.name for t in (await agent.list_tools()).tools} == {"paid", "free", "dyn"}

            def rewritten() -> bool:
                try:
                    return BotSnapshot.from_json(r.snapshot_file().read_text()).bot == BOT
                except ValueError:
                    return False  # still the unusable one: the save runs in the background

            await until(rewritten)


async def test_sampling_from_a_tools_only_bot_falls_back_to_the_handshake(tmp_path: Path) -> None:
    """A modern-era session cannot carry the bot's sampling request: the
    bridge switches that bot to the handshake era and runs the (refunded)
    call again, so the agent still gets its answer."""
    harness = Harness(HarnessConfig(data_dir=tmp_path / "bot", allowed_peers={CLIENT}))
    runs: list[str] = []

    @harness.tool(description="asks the agent's model")
    async def ask(ctx: CallContext, prompt: str) -> str:
        runs.append(prompt)
        request = types.CreateMessageRequest(
            params=types.CreateMessageRequestParams(
                messages=[
                    types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))
                ],
                max_tokens=10,
            )
        )
        answer = await ctx.request.session.send_request(request, types.CreateMessageResult)
        assert isinstance(answer.content, types.TextContent)
        return f"model said {answer.content.text}"

    async def sample(
        ctx: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="yes"), model="m"
        )

    with anyio.fail_after(30):
        async with rig(tmp_path, harness=harness) as r:
            await r.start_bridge()
            async with r.agent(sampling_callback=sample) as agent:
                result = await call(agent, "ask", {"prompt": "ok?"})
                assert [c.text for c in result.content if isinstance(c, types.TextContent)] == [
                    "model said yes"
                ]
                assert runs == ["ok?", "ok?"]
            assert r.bridge is not None
            link = r.bridge.link(BOT)
            assert link is not None
            assert link.era == "handshake"


async def _echo_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[types.Tool(name="echo", input_schema={"type": "object"}, _meta={"brmcp/priceAtoms": 0})]
    )


async def _echo_call(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    text = str((params.arguments or {}).get("text", ""))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


def _scripted_bot(offer: dict[str, Any], methods: list[str], *, modern_error: int | None = None) -> Any:
    """A bot ``accept`` that answers a marked initialize with ``offer`` (a
    whole initialize result), serves tools/list (one valid tool ``t``) and
    tools/call after the handshake, and answers modern requests with the
    SDK's ``modern_error`` code when given, else a result without
    ``resultType`` (invalid in the modern era)."""

    async def accept(conn: Conn) -> None:
        initialized = False
        async for item in conn.read_stream:
            if not isinstance(item, SessionMessage):
                continue
            message = item.message
            method = getattr(message, "method", "")
            methods.append(method)
            if method == "notifications/initialized":
                initialized = True
            if not isinstance(message, types.JSONRPCRequest):
                continue
            reply: types.JSONRPCResponse | types.JSONRPCError
            if method == "initialize":
                reply = types.JSONRPCResponse(jsonrpc="2.0", id=message.id, result=offer)
            elif not initialized and modern_error is not None:
                error = types.ErrorData(code=modern_error, message="Unsupported protocol version")
                reply = types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
            elif method == "tools/list":
                tools = [{"name": "t", "inputSchema": {"type": "object"}}]
                reply = types.JSONRPCResponse(jsonrpc="2.0", id=message.id, result={"tools": tools})
            else:
                content = [{"type": "text", "text": "ran"}]
                reply = types.JSONRPCResponse(jsonrpc="2.0", id=message.id, result={"content": content})
            await conn.write_stream.send(SessionMessage(reply))

    return accept


_PLAIN = {
    "protocolVersion": "2025-11-25",
    "capabilities": {"tools": {}},
    "serverInfo": {"name": "s", "version": "1"},
}
_GOOD_TOOLS = {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}


async def test_an_offer_with_a_tool_that_cannot_be_served_is_not_taken(tmp_path: Path) -> None:
    """A first-contact answer whose tool has an invalid input schema is not
    installed (nor remembered): the handshake's own tools/list decides."""
    bad = {"tools": [{"name": "t", "inputSchema": {"type": 5, "properties": "x"}}]}
    offer = {**_PLAIN, "_meta": {"brmcp/modernVersions": ["2026-07-28"], "brmcp/tools": bad}}
    methods: list[str] = []
    with anyio.fail_after(30):
        async with rig(tmp_path, accept=_scripted_bot(offer, methods)) as r:
            await r.start_bridge()
            async with r.agent() as agent:
                assert [t.name for t in (await agent.list_tools()).tools] == ["t"]
                assert texts(await call(agent, "t")) == ["ran"]
            assert methods[:3] == ["initialize", "notifications/initialized", "tools/list"]
            assert r.bridge is not None
            link = r.bridge.link(BOT)
            assert link is not None
            assert link.era == "handshake"


async def test_a_bot_that_offers_the_modern_era_but_refuses_it_falls_back(tmp_path: Path) -> None:
    """The bot names 2026-07-28 in its offer, then answers modern requests
    with the SDK's -32022 "Unsupported protocol version": the bridge
    switches to the handshake era (remembered) and the call still runs."""
    offer = {**_PLAIN, "_meta": {"brmcp/modernVersions": ["2026-07-28"], "brmcp/tools": _GOOD_TOOLS}}
    methods: list[str] = []
    with anyio.fail_after(30):
        async with rig(tmp_path, accept=_scripted_bot(offer, methods, modern_error=-32022)) as r:
            await r.start_bridge()
            async with r.agent() as agent:
                assert texts(await call(agent, "t")) == ["ran"]
            assert r.bridge is not None
            link = r.bridge.link(BOT)
            assert link is not None
            assert link.era == "handshake"
            await until(lambda: json.loads(r.snapshot_file().read_text())["era"] == "handshake")


async def test_an_invalid_modern_result_is_one_clear_error(tmp_path: Path) -> None:
    offer = {**_PLAIN, "_meta": {"brmcp/modernVersions": ["2026-07-28"], "brmcp/tools": _GOOD_TOOLS}}
    methods: list[str] = []
    with anyio.fail_after(30):
        async with rig(tmp_path, accept=_scripted_bot(offer, methods)) as r:
            await r.start_bridge()
            async with r.agent() as agent:
                with pytest.raises(MCPError) as failure:
                    await call(agent, "t")
            message = failure.value.error.message
            assert message.startswith(f"bot {BOT[:8]} answered with an invalid result")
            assert "TaskGroup" not in message
