"""Every bot is a stranger: the bounds on what a bot sends a bridge
(SECURITY.md "The bridge against a hostile bot"; BRIDGE.md §Eras and
snapshots).

Hostile bots on the in-memory fabric: a bare SDK server whose tool list is
over each bound (bytes, pages, tools, one tool; in ``tools/list`` pages, in a
first-contact ``brmcp/tools`` offer, in a modern ``tools/list`` with
``brmcp/capabilities``), one that floods ``notifications/tools/list_changed``
and log messages, and snapshot files over the file bound. Counts are taken
at the bot; time is a :class:`ManualClock`.
"""

from __future__ import annotations

import json
import logging
import os
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server, ServerRequestContext

from brmcp.bridge import Bridge, ManualClock
from brmcp.bridge.links import (
    LIST_CHANGED_BURST,
    LIST_CHANGED_RATE,
    MAX_RELAYED_BYTES,
    MAX_SNAPSHOT_BYTES,
    MAX_TOOL_BYTES,
    MAX_TOOL_LIST_BYTES,
    MAX_TOOL_PAGES,
    MAX_TOOLS,
    RELAY_BURST,
    RELAY_RATE,
    RELIST_INTERVAL,
    SNAPSHOT_DIR,
    UPDATES_BURST,
    UPDATES_RATE,
    BotLink,
    BotSnapshot,
    LinkError,
    ListedTools,
    RateGate,
    Relay,
    SnapshotStore,
    SnapshotTooLarge,
    Subscriptions,
    ToolListTooLarge,
    json_bytes,
)
from brmcp.protocol.eras import MODERN_VERSIONS_KEY, TOOLS_KEY
from brmcp.protocol.payment import MARKS_REFUSALS_KEY
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.server.firstcontact import FirstContactTap
from brmcp.testing import Fabric
from brmcp.transport.conn import Conn
from tests.kit.bridge import (
    BOT,
    CLIENT,
    INIT,
    NAME,
    TOKEN,
    Bot,
    TestPayer,
    auth,
    bridge_stack,
    fixture_settings,
    until,
)

START = 1_800_000_000
OBJECT: dict[str, Any] = {"type": "object"}


def _remembered(content: bytes) -> dict[str, Any]:
    """A snapshot file's content without its measured round trip (``rtt``,
    rewritten when the measurement moves: not part of what a bot sent)."""
    data = json.loads(content)
    data.pop("rtt", None)
    return data


def tool(name: str, description_bytes: int = 0) -> types.Tool:
    return types.Tool(name=name, description="x" * description_bytes, input_schema=OBJECT)


# -- a hostile bot -------------------------------------------------------------------------


class HostileBot:
    """A bare SDK server at BOT. ``pages`` is the tool list it serves (page
    ``i`` under cursor ``str(i)``; ``meta`` on the first page). Its tools:
    ``announce`` sends ``tools/list_changed`` ``n`` times (argument ``n``,
    default 1), ``logs`` sends ``n`` log messages of ``size`` bytes of data.
    ``methods`` records every request it received."""

    def __init__(self, pages: list[list[types.Tool]], meta: dict[str, Any] | None = None) -> None:
        self.pages = pages
        self.meta = meta
        self.methods: list[str] = []

    def lists(self) -> int:
        return self.methods.count("tools/list")

    def server(self) -> Server[Any]:
        async def list_tools(
            ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            index = int(params.cursor) if params is not None and params.cursor else 0
            more = index + 1 < len(self.pages)
            return types.ListToolsResult(
                tools=self.pages[index],
                next_cursor=str(index + 1) if more else None,
                _meta=self.meta if index == 0 else None,
            )

        async def call_tool(
            ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
        ) -> types.CallToolResult:
            args = params.arguments or {}
            count = int(args.get("n", 1))
            if params.name == "announce":
                for _ in range(count):
                    await ctx.session.send_tool_list_changed()
            elif params.name == "logs":
                data = "y" * int(args.get("size", 10))
                message = types.LoggingMessageNotification(
                    params=types.LoggingMessageNotificationParams(level="info", logger="hostile", data=data)
                )
                for _ in range(count):
                    await ctx.session.send_notification(message, related_request_id=ctx.request_id)
            return types.CallToolResult(content=[types.TextContent(type="text", text=params.name)])

        server: Server[Any] = Server("hostile", version="1", on_list_tools=list_tools, on_call_tool=call_tool)

        async def record(ctx: ServerRequestContext[Any], call_next: Callable[..., Awaitable[Any]]) -> Any:
            self.methods.append(ctx.method)
            return await call_next(ctx)

        server.middleware.append(record)
        return server


def good_list() -> list[list[types.Tool]]:
    return [[tool("announce"), tool("logs")]]


@dataclass
class Env:
    fabric: Fabric
    bridge: Bridge
    data_dir: Path
    clock: ManualClock
    bot: HostileBot | None
    stack: AsyncExitStack
    notes: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        address = self.bridge.listen_address
        assert address is not None
        return f"http://{address[0]}:{address[1]}/mcp/{BOT}"

    @property
    def link(self) -> BotLink:
        link = self.bridge.link(BOT)
        assert link is not None
        return link

    @property
    def snapshot_file(self) -> Path:
        return self.data_dir / SNAPSHOT_DIR / f"{BOT}.json"

    @asynccontextmanager
    async def agent(self, **callbacks: Any) -> AsyncIterator[ClientSession]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write, read_timeout_seconds=30, **callbacks) as session,
        ):
            await session.initialize()
            yield session

    async def initialize_status(self) -> int:
        """An agent's raw ``initialize`` POST: the HTTP status."""
        async with httpx2.AsyncClient(timeout=30) as http:
            return (await http.post(self.url, json=INIT, headers=auth())).status_code


@asynccontextmanager
async def hostile(
    tmp_path: Path,
    bot: HostileBot | None = None,
    *,
    harness: Harness | None = None,
    offer: Callable[[], dict[str, Any]] | None = None,
    clock: ManualClock | None = None,
    snapshot: BotSnapshot | None = None,
) -> AsyncIterator[Env]:
    """Fabric, the bot at BOT (``bot``, its first-contact answers extended by
    ``offer``; or a ``harness``) and a bridge at CLIENT on ``clock`` (auto by
    default); ``snapshot`` is written to the bridge's data directory first."""
    data_dir = tmp_path / "bridge"
    data_dir.mkdir()
    if snapshot is not None:
        SnapshotStore(data_dir).save(snapshot)
    clock = clock or ManualClock(START, auto=True)
    served: Bot
    if harness is not None:
        served = harness
    else:
        assert bot is not None
        server = bot.server()

        async def accept(conn: Conn) -> None:
            options = server.create_initialization_options()
            if offer is None:
                await server.run(conn.read_stream, conn.write_stream, options)
                return
            tap = FirstContactTap(conn.read_stream, conn.write_stream, offer)
            await server.run(tap.read_stream, tap.write_stream, options)

        served = accept
    async with bridge_stack(
        tmp_path, TestPayer(), bot=served, settings=fixture_settings(), name=NAME, clock=clock
    ) as built:
        yield Env(built.fabric, built.bridge, data_dir, clock, bot, built.stack)


async def call(session: ClientSession, name: str, **arguments: Any) -> types.CallToolResult:
    request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=arguments))
    return await session.send_request(request, types.CallToolResult)


# -- tool lists ----------------------------------------------------------------------------

#: 16 tools of 192 KiB of description: a page of 3 MiB, each tool under MAX_TOOL_BYTES.
BIG_PAGE = [tool(f"big{i}", 192 * 1024) for i in range(16)]


async def test_a_64_page_list_of_3_mib_pages_is_refused_at_the_second_page(tmp_path: Path) -> None:
    """192 MiB of tool list if followed; the bridge asks for two pages (the
    second takes it over 4 MiB), holds none of it and persists nothing."""
    assert json_bytes(types.ListToolsResult(tools=BIG_PAGE)) < MAX_TOOL_LIST_BYTES
    bot = HostileBot([BIG_PAGE] * 64)
    with anyio.fail_after(60):
        async with hostile(tmp_path, bot) as env:
            assert await env.initialize_status() == 503
            assert bot.lists() == 2
            link = env.link
            with pytest.raises(ToolListTooLarge, match=r"over 4194304 bytes of JSON \(MAX_TOOL_LIST_BYTES\)"):
                await link.refresh()
            assert bot.lists() == 4
            assert link.tools is None
            assert link.tools_bytes == 0
            assert link.snapshot() is None
            assert not env.snapshot_file.exists()


#: Tools of 200 KiB that take BIG_PAGE's list just over MAX_TOOL_LIST_BYTES.
_REST = MAX_TOOL_LIST_BYTES - json_bytes(types.ListToolsResult(tools=BIG_PAGE))
JUST_OVER = [tool(f"rest{i}", 200 * 1024) for i in range(_REST // (200 * 1024) + 1)]

#: Hostile lists, each just over one bound, and the pages the bridge asks
#: for before it refuses: (pages, bound named, pages asked).
OVER_BOUNDS = {
    "pages": ([[tool(f"p{i}")] for i in range(MAX_TOOL_PAGES + 1)], "MAX_TOOL_PAGES", MAX_TOOL_PAGES),
    "tools": (
        [[tool(f"a{i}") for i in range(600)], [tool(f"b{i}") for i in range(MAX_TOOLS + 1 - 600)]],
        "MAX_TOOLS",
        2,
    ),
    "one tool": ([[tool("ok"), tool("huge", MAX_TOOL_BYTES)]], "MAX_TOOL_BYTES", 1),
    "bytes": ([BIG_PAGE, JUST_OVER], "MAX_TOOL_LIST_BYTES", 2),
}


@pytest.mark.parametrize("bound", sorted(OVER_BOUNDS))
async def test_a_list_over_a_bound_is_refused_and_the_snapshot_in_force_stays(
    tmp_path: Path, bound: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="brmcp.bridge")
    pages, name, asked = OVER_BOUNDS[bound]
    bot = HostileBot(good_list())
    with anyio.fail_after(60):
        async with hostile(tmp_path, bot) as env, env.agent() as agent:
            assert [t.name for t in (await agent.list_tools()).tools] == ["announce", "logs"]
            await until(env.snapshot_file.exists)
            saved = env.snapshot_file.read_bytes()
            link = env.link
            held = link.tools_bytes
            assert 0 < held < 1024
            before = bot.lists()
            # The bot's list grows over the bound, and it says so.
            bot.pages = pages
            assert not (await call(agent, "announce")).is_error
            await until(lambda: f"({name})" in caplog.text)
            assert "the whole list is refused" in caplog.text
            assert bot.lists() - before == asked
            # The old list stays in force: served with no PM, held, persisted.
            lists = bot.lists()
            assert [t.name for t in (await agent.list_tools()).tools] == ["announce", "logs"]
            assert bot.lists() == lists
            assert [t.name for t in link.tools or []] == ["announce", "logs"]
            assert link.tools_bytes == held
            assert _remembered(env.snapshot_file.read_bytes()) == _remembered(saved)


async def test_a_first_contact_offer_over_a_bound_is_refused(tmp_path: Path) -> None:
    """The ``brmcp/tools`` of a marked initialize answer is one page, held
    to the same bounds: 1,025 tools are refused at the first round trip."""
    bot = HostileBot(good_list())
    offered = [tool(f"t{i}").model_dump(by_alias=True, exclude_none=True) for i in range(MAX_TOOLS + 1)]

    def offer() -> dict[str, Any]:
        return {MODERN_VERSIONS_KEY: ["2026-07-28"], TOOLS_KEY: {"tools": offered}}

    with anyio.fail_after(60):
        async with hostile(tmp_path, bot, offer=offer) as env:
            assert await env.initialize_status() == 503
            link = env.link
            with pytest.raises(
                LinkError, match=r"first-contact brmcp/tools: more than 1024 tools \(MAX_TOOLS\)"
            ):
                await link.refresh()
            assert bot.methods == ["initialize", "initialize"]  # no tools/list: refused at the offer
            assert link.era is None  # nothing learnt from it
            assert link.tools is None
            assert not env.snapshot_file.exists()


async def test_a_modern_tools_list_over_a_bound_keeps_the_remembered_snapshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A brmcp harness (modern ``tools/list`` with ``brmcp/capabilities``)
    that now lists 1,025 tools: the remembered snapshot stays, on disk too."""
    caplog.set_level(logging.WARNING, logger="brmcp.bridge")
    harness = Harness(
        HarnessConfig(data_dir=tmp_path / "bot", allowed_peers={CLIENT}, calls_per_minute=10_000)
    )

    async def noop(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {}

    for i in range(MAX_TOOLS + 1):
        harness.add_tool(f"t{i}", noop, description="", input_schema=OBJECT)
    remembered = BotSnapshot(
        bot=BOT,
        era="modern",
        protocol_version="2026-07-28",
        capabilities=types.ServerCapabilities(tools=types.ToolsCapability(list_changed=False)),
        tools=[tool("t0")],
        updated=START,
        marks_refusals=True,
    )
    with anyio.fail_after(60):
        async with hostile(tmp_path, harness=harness, snapshot=remembered) as env, env.agent() as agent:
            saved = env.snapshot_file.read_bytes()
            assert [t.name for t in (await agent.list_tools()).tools] == ["t0"]
            assert not (await call(agent, "t0")).is_error
            # The background refresh after that first call is refused.
            await until(lambda: "tools/list: more than 1024 tools (MAX_TOOLS)" in caplog.text)
            link = env.link
            assert link.era == "modern"
            assert [t.name for t in link.tools or []] == ["t0"]
            assert link.marks_refusals
            assert _remembered(env.snapshot_file.read_bytes()) == _remembered(saved)
            assert [t.name for t in (await agent.list_tools()).tools] == ["t0"]


# -- brmcp/marksRefusals ---------------------------------------------------------------------


async def test_marks_refusals_is_read_persisted_and_replaced(tmp_path: Path) -> None:
    bot = HostileBot(good_list(), meta={MARKS_REFUSALS_KEY: True})
    with anyio.fail_after(60):
        async with hostile(tmp_path, bot) as env, env.agent() as agent:
            await agent.list_tools()
            link = env.link
            assert link.marks_refusals

            def saved() -> str:
                return env.snapshot_file.read_text() if env.snapshot_file.exists() else ""

            await until(lambda: '"marks_refusals":true' in saved())
            # A link built from the file has it before any PM.
            remembered = SnapshotStore(env.data_dir).load(BOT)
            assert remembered is not None
            assert remembered.marks_refusals
            async with anyio.create_task_group() as tg:
                info = types.Implementation(name="t", version="1")
                rebuilt = BotLink(BOT, env.bridge.router, tg, info, snapshot=remembered)
                assert rebuilt.marks_refusals
                assert rebuilt.tools_bytes == link.tools_bytes
                rebuilt.close()
            # A list over a bound changes nothing.
            bot.pages, bot.meta = [BIG_PAGE, BIG_PAGE], None
            assert link.doubt_tools()
            with pytest.raises(ToolListTooLarge):
                await link.refresh()
            assert link.marks_refusals
            assert '"marks_refusals":true' in saved()
            # A list without the mark replaces it.
            bot.pages = good_list()
            assert not (await call(agent, "announce")).is_error
            await until(lambda: not link.marks_refusals)
            await until(lambda: '"marks_refusals":false' in saved())


async def test_marks_refusals_from_a_first_contact_offer(tmp_path: Path) -> None:
    bot = HostileBot(good_list())
    listed = {"tools": [t.model_dump(by_alias=True, exclude_none=True) for t in good_list()[0]]}

    def offer() -> dict[str, Any]:
        return {
            MODERN_VERSIONS_KEY: ["2026-07-28"],
            TOOLS_KEY: {**listed, "_meta": {MARKS_REFUSALS_KEY: True}},
        }

    with anyio.fail_after(60):
        async with hostile(tmp_path, bot, offer=offer) as env, env.agent() as agent:
            assert [t.name for t in (await agent.list_tools()).tools] == ["announce", "logs"]
            assert bot.methods == ["initialize"]  # the offer brought the tools
            assert env.link.era == "modern"
            assert env.link.marks_refusals
            await until(env.snapshot_file.exists)
            assert BotSnapshot.from_json(env.snapshot_file.read_text()).marks_refusals


def test_snapshot_marks_refusals_key_is_optional_and_checked() -> None:
    old = {"bot": BOT, "era": "modern", "protocol_version": "2026-07-28", "tools": [], "updated": 1}
    assert BotSnapshot.from_json(json.dumps(old)).marks_refusals is False
    marked = BotSnapshot.from_json(json.dumps({**old, "marks_refusals": True}))
    assert marked.marks_refusals is True
    assert isinstance(marked.tools, ListedTools)
    assert marked.tools.marks_refusals is True
    assert json.loads(marked.to_json())["marks_refusals"] is True
    with pytest.raises(ValueError, match="marks_refusals must be true or false"):
        BotSnapshot.from_json(json.dumps({**old, "marks_refusals": "yes"}))


# -- snapshot files ------------------------------------------------------------------------


def test_a_snapshot_file_over_the_bound_is_ignored_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="brmcp.bridge")
    store = SnapshotStore(tmp_path)
    store.directory.mkdir()
    path = store.path(BOT)
    with path.open("wb") as fh:
        fh.truncate(1 << 30)  # 1 GiB, sparse: reading it would show in the peak
    tracemalloc.start()
    try:
        assert store.load(BOT) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024
    assert f"{1 << 30} bytes, over the {MAX_SNAPSHOT_BYTES}-byte bound; not read" in caplog.text
    # Exactly at the bound it is read (and here, being zeros, not JSON).
    os.truncate(path, MAX_SNAPSHOT_BYTES)
    caplog.clear()
    assert store.load(BOT) is None
    assert "not JSON" in caplog.text
    # A FIFO is not opened for reading in a way that blocks.
    path.unlink()
    os.mkfifo(path)
    caplog.clear()
    assert store.load(BOT) is None
    assert "not a regular file" in caplog.text


def test_a_snapshot_over_the_bound_is_never_written(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    small = BotSnapshot(bot=BOT, era="modern", protocol_version="2026-07-28", tools=[tool("a")])
    store.save(small)
    before = store.path(BOT).read_bytes()
    tools = [tool(f"t{i}", 200 * 1024) for i in range(MAX_SNAPSHOT_BYTES // (200 * 1024) + 1)]
    big = BotSnapshot(bot=BOT, era="modern", protocol_version="2026-07-28", tools=tools)
    with pytest.raises(SnapshotTooLarge, match=f"over the {MAX_SNAPSHOT_BYTES}-byte bound"):
        store.save(big)
    assert store.path(BOT).read_bytes() == before
    assert [p.name for p in store.directory.iterdir()] == [f"{BOT}.json"]  # no temporary left


def test_every_accepted_list_fits_a_snapshot_file() -> None:
    """The largest list the bounds let through (4 MiB of tools) is written:
    the file bound is twice the list bound."""
    per_tool = MAX_TOOL_BYTES - 1024
    count = MAX_TOOL_LIST_BYTES // (per_tool + 64)
    tools = [tool(f"t{i:04d}", per_tool - 64) for i in range(count)]
    size = sum(json_bytes(t) for t in tools)
    assert MAX_TOOL_LIST_BYTES - MAX_TOOL_BYTES < size <= MAX_TOOL_LIST_BYTES
    snapshot = BotSnapshot(
        bot=BOT,
        era="handshake",
        protocol_version="2025-11-25",
        capabilities=types.ServerCapabilities(tools=types.ToolsCapability(list_changed=True)),
        tools=tools,
    )
    text = snapshot.to_json()
    assert len(text.encode()) < MAX_SNAPSHOT_BYTES // 2 + 4096


# -- notification floods -------------------------------------------------------------------


async def test_a_list_changed_flood_makes_at_most_one_refresh_per_interval(tmp_path: Path) -> None:
    """1,000 ``tools/list_changed`` (ten calls of 100: under the router's
    inbox of 128): the bot is asked ``tools/list`` once at once, once more
    RELIST_INTERVAL seconds later on the bridge's clock, and the agents are
    told twice."""
    bot = HostileBot(good_list())
    changes: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changes.append(message.method)

    clock = ManualClock(START)  # moves only when told to
    with anyio.fail_after(60):
        async with hostile(tmp_path, bot, clock=clock) as env, env.agent(message_handler=on_message) as agent:
            await agent.list_tools()
            assert bot.lists() == 1
            for _ in range(10):
                assert not (await call(agent, "announce", n=100)).is_error
            # The first refresh went at once; the other 999 wait as one.
            await until(lambda: clock.sleepers == 1 and len(changes) == 1)
            assert bot.lists() == 2
            # Served meanwhile from the snapshot, not asked of the bot.
            await agent.list_tools()
            assert bot.lists() == 2
            clock.advance(RELIST_INTERVAL)
            await until(lambda: len(changes) == 2)
            assert bot.lists() == 3
            # After a quiet interval the next change is fetched at once again.
            clock.advance(RELIST_INTERVAL)
            assert not (await call(agent, "announce")).is_error
            await until(lambda: len(changes) == 3)
            assert bot.lists() == 4


@pytest.mark.paced  # the flood/funding timing it bounds is the paced one
async def test_a_log_flood_relayed_to_one_agent_is_bounded(tmp_path: Path) -> None:
    """1,000 log messages during ten calls: RELAY_BURST reach the agent while
    the relay's clock stands still, RELAY_RATE more per second after; a
    message over MAX_RELAYED_BYTES never does."""
    bot = HostileBot(good_list())
    got: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        got.append(params)

    relay_clock = ManualClock(0)
    with anyio.fail_after(60):
        async with hostile(tmp_path, bot) as env, env.agent(logging_callback=on_log) as agent:
            await agent.list_tools()
            gate = env.link.relay.gate
            gate.clock = relay_clock.now
            for _ in range(10):
                assert not (await call(agent, "logs", n=100)).is_error
            assert len(got) == RELAY_BURST
            assert gate.dropped == 1000 - RELAY_BURST
            relay_clock.advance(1.0)
            assert not (await call(agent, "logs", n=100)).is_error
            assert len(got) == RELAY_BURST + int(RELAY_RATE)
            # Oversized: dropped whatever the rate.
            relay_clock.advance(10.0)
            got.clear()
            assert not (await call(agent, "logs", n=1, size=MAX_RELAYED_BYTES)).is_error
            assert not (await call(agent, "logs", n=1, size=100)).is_error
            assert [len(p.data) for p in got] == [100]


class _ProgressAgent:
    """Stands in for the agent request's ServerSession (progress only)."""

    def __init__(self) -> None:
        self.progress: list[float] = []

    async def report_progress(self, progress: float, total: float | None, message: str | None) -> None:
        self.progress.append(progress)


async def test_a_progress_flood_is_bounded_with_the_log_messages() -> None:
    clock = ManualClock(0)
    relay = Relay(clock=clock.now)
    agent = _ProgressAgent()
    ctx: ServerRequestContext[Any] = ServerRequestContext(
        session=agent,  # type: ignore[arg-type]
        lifespan_context={},
        protocol_version="2025-11-25",
        method="tools/call",
        request_id=7,
        meta={"progress_token": "t"},
        request=SimpleNamespace(headers={"mcp-session-id": "s1"}),
    )
    with relay.track(ctx) as call:
        assert call is not None
        for value in range(1000):
            await call.progress(float(value), None, None)
        assert agent.progress == [float(v) for v in range(RELAY_BURST)]
        clock.advance(1.0)
        for value in range(1000, 2000):
            await call.progress(float(value), None, None)
        assert len(agent.progress) == RELAY_BURST + int(RELAY_RATE)
        assert agent.progress[-1] == 1000.0 + RELAY_RATE - 1
        clock.advance(10.0)
        await call.progress(5000.0, None, "z" * (MAX_RELAYED_BYTES + 1))
        await call.progress(5001.0, None, "fine")
        assert agent.progress[-1] == 5001.0
        assert 5000.0 not in agent.progress
    assert relay.gate.dropped == 2000 - RELAY_BURST - int(RELAY_RATE)


def test_rate_gate_burst_then_rate_and_one_warning_per_run(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="brmcp.bridge")
    clock = ManualClock(0)
    gate = RateGate("things", burst=3, rate=2.0, clock=clock.now)
    assert [gate.take() for _ in range(5)] == [True, True, True, False, False]
    clock.advance(0.5)  # one token
    assert [gate.take() for _ in range(3)] == [True, False, False]
    clock.advance(100.0)  # refilled to the burst, not beyond
    assert [gate.take() for _ in range(4)] == [True, True, True, False]
    assert gate.dropped == 5
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3  # one per run of drops
    assert "2 things dropped" in caplog.text


class _Agent:
    def __init__(self) -> None:
        self.got: list[str] = []

    async def send_notification(self, notification: types.ServerNotification) -> None:
        self.got.append(notification.method)


def _ctx(session: _Agent, sid: str) -> ServerRequestContext[Any]:
    return ServerRequestContext(
        session=session,  # type: ignore[arg-type]
        lifespan_context={},
        protocol_version="2025-11-25",
        method="resources/subscribe",
        request_id=1,
        request=SimpleNamespace(headers={"mcp-session-id": sid}),
    )


async def test_resource_list_changes_and_updates_floods_are_bounded() -> None:
    clock = ManualClock(0)
    registry = Subscriptions(clock=clock.now)
    agents = [_Agent() for _ in range(3)]
    for n, agent in enumerate(agents):
        await registry.subscribe(_ctx(agent, f"s{n}"), "file:///d", _forwarded)
    for _ in range(1000):
        await registry.broadcast(types.ResourceListChangedNotification())
        await registry.broadcast(types.PromptListChangedNotification())
        assert await registry.deliver_update("file:///d/x") == 3  # meant for three, relayed or not
    for agent in agents:
        assert agent.got.count("notifications/resources/list_changed") == LIST_CHANGED_BURST
        assert agent.got.count("notifications/prompts/list_changed") == LIST_CHANGED_BURST
        assert agent.got.count("notifications/resources/updated") == UPDATES_BURST
    clock.advance(1.0)
    for _ in range(1000):
        await registry.broadcast(types.ResourceListChangedNotification())
        await registry.deliver_update("file:///d/x")
    assert agents[0].got.count("notifications/resources/list_changed") == LIST_CHANGED_BURST + int(
        LIST_CHANGED_RATE
    )
    assert agents[0].got.count("notifications/resources/updated") == UPDATES_BURST + int(UPDATES_RATE)
    # An update nobody watches is not counted against the bound.
    assert await registry.deliver_update("file:///elsewhere") == 0
    assert registry.gate("notifications/resources/updated").dropped == 2000 - UPDATES_BURST - int(
        UPDATES_RATE
    )


async def _forwarded() -> None:
    return None
