"""The bridge mirrors what the bot declares (brmcp/bridge/agent/_mirror.py,
subscriptions.py): resources, templates, prompts and completions are
forwarded live over the shared BR session, resource updates reach the
agents that subscribed, and a bot that declares none of them (a Go bot, a
harness with only tools) yields exactly the previous endpoint.

Agents are the SDK's streamable-HTTP client against the bridge's own
listener; bots are a brmcp Harness or a bare SDK server on the fabric.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

import brmcp.bridge.links._subscriptions as subscriptions
from brmcp.bridge import Bridge, ManualClock
from brmcp.bridge.links import Subscriptions
from brmcp.server import CallContext, Harness, HarnessConfig, PeerContext
from brmcp.testing import Fabric
from brmcp.transport.conn import Conn
from tests.conformance.fixture import STATIC_TEXT, WATCHED_URI, register_fixture_catalog
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
    build_harness,
    fixture_settings,
    until,
)

START = 1_800_000_000
#: What a bridge endpoint declared before resources were mirrored.
TOOLS_ONLY_CAPABILITIES = {"logging": {}, "tools": {"listChanged": True}}


# -- fixture -------------------------------------------------------------------------


@dataclass
class Mirror:
    fabric: Fabric
    bridge: Bridge
    harness: Harness | None
    #: Methods the bot's SDK server received, in order.
    bot_methods: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        address = self.bridge.listen_address
        assert address is not None
        return f"http://{address[0]}:{address[1]}/mcp/{BOT}"

    def count(self, method: str) -> int:
        return self.bot_methods.count(method)


def _recorder(methods: list[str]) -> Callable[..., Awaitable[Any]]:
    async def record(ctx: ServerRequestContext[Any], call_next: Callable[..., Awaitable[Any]]) -> Any:
        methods.append(ctx.method)
        return await call_next(ctx)

    return record


@asynccontextmanager
async def mirror(
    tmp_path: Path, *, harness: Harness | None = None, server: Server[Any] | None = None
) -> AsyncIterator[Mirror]:
    """Fabric, a bot at BOT (``harness`` or a bare SDK ``server``) and a
    bridge at CLIENT with its own listener."""
    assert (harness is None) != (server is None)
    methods: list[str] = []
    bot: Bot
    if harness is not None:
        harness.server.middleware.append(_recorder(methods))
        bot = harness
    else:
        assert server is not None
        bare = server
        bare.middleware.append(_recorder(methods))

        async def accept(conn: Conn) -> None:
            await bare.run(conn.read_stream, conn.write_stream, bare.create_initialization_options())

        bot = accept
    async with bridge_stack(
        tmp_path,
        TestPayer(),
        bot=bot,
        settings=fixture_settings(),
        name=NAME,
        clock=ManualClock(START, auto=True),
    ) as built:
        yield Mirror(built.fabric, built.bridge, harness, methods)


class Inbox:
    """An agent's ``message_handler``: keeps the notifications it receives."""

    def __init__(self) -> None:
        self.items: list[types.ServerNotification] = []

    async def __call__(self, message: IncomingMessage) -> None:
        if not isinstance(message, Exception):
            self.items.append(message)

    def methods(self) -> list[str]:
        return [item.method for item in self.items]

    async def wait_for(self, method: str, count: int = 1) -> None:
        await until(lambda: self.methods().count(method) >= count)


@asynccontextmanager
async def agent(env: Mirror, inbox: Inbox | None = None) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
        streamable_http_client(env.url, http_client=http) as (read, write),
        ClientSession(read, write, read_timeout_seconds=30, message_handler=inbox) as session,
    ):
        await session.initialize()
        yield session


def declared(session: ClientSession) -> dict[str, Any]:
    result = session.initialize_result
    assert result is not None
    return result.capabilities.model_dump(by_alias=True, exclude_none=True, mode="json")


async def subscribe(session: ClientSession, uri: str) -> None:
    """``resources/subscribe`` without the SDK helper's 2026 deprecation warning."""
    request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
    await session.send_request(request, types.EmptyResult)


async def unsubscribe(session: ClientSession, uri: str) -> None:
    request = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
    await session.send_request(request, types.EmptyResult)


def catalog_bot(tmp_path: Path) -> Harness:
    harness = Harness(
        HarnessConfig(data_dir=tmp_path / "bot", allowed_peers={CLIENT}, calls_per_minute=100_000)
    )

    @harness.tool(description="Echo")
    async def echo(ctx: CallContext, text: str = "") -> dict[str, Any]:
        return {"text": text}

    register_fixture_catalog(harness)
    return harness


# -- mirrored catalog ------------------------------------------------------------------


async def test_resources_prompts_and_completions_pass_through(tmp_path: Path) -> None:
    async with mirror(tmp_path, harness=catalog_bot(tmp_path)) as env, agent(env) as session:
        assert declared(session) == {
            "completions": {},
            "logging": {},
            "prompts": {"listChanged": True},
            "resources": {"subscribe": True, "listChanged": True},
            "tools": {"listChanged": True},
        }
        resources = (await session.list_resources()).resources
        assert [r.uri for r in resources] == ["test://static-text", "test://static-binary", WATCHED_URI]
        assert resources[0].description == "A fixed text resource."
        text = (await session.read_resource("test://static-text")).contents[0]
        assert isinstance(text, types.TextResourceContents)
        assert (text.mime_type, text.text) == ("text/plain", STATIC_TEXT)
        blob = (await session.read_resource("test://static-binary")).contents[0]
        assert isinstance(blob, types.BlobResourceContents)
        assert blob.mime_type == "image/png"

        templates = (await session.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["test://template/{id}/data"]
        data = (await session.read_resource("test://template/123/data")).contents[0]
        assert isinstance(data, types.TextResourceContents)
        assert json.loads(data.text) == {"id": "123", "templateTest": True, "data": "Data for ID: 123"}

        prompts = (await session.list_prompts()).prompts
        assert [p.name for p in prompts] == [
            "test_simple_prompt",
            "test_prompt_with_arguments",
            "test_prompt_with_embedded_resource",
            "test_prompt_with_image",
        ]
        assert [a.name for a in prompts[1].arguments or []] == ["arg1", "arg2"]
        got = await session.get_prompt("test_prompt_with_arguments", {"arg1": "hello", "arg2": "world"})
        assert got.messages[0].content == types.TextContent(
            type="text", text="Prompt with arguments: arg1='hello', arg2='world'"
        )
        embedded = await session.get_prompt("test_prompt_with_embedded_resource", {"resourceUri": "test://x"})
        first = embedded.messages[0].content
        assert isinstance(first, types.EmbeddedResource)
        assert first.resource.uri == "test://x"
        image = (await session.get_prompt("test_prompt_with_image")).messages[0].content
        assert isinstance(image, types.ImageContent)
        assert image.mime_type == "image/png"

        ref = types.PromptReference(name="test_prompt_with_arguments")
        done = await session.complete(ref, {"name": "arg1", "value": "par"})
        assert (done.completion.values, done.completion.total) == (["paris", "park", "party"], 3)

        # Tools are unchanged alongside.
        echoed = await session.call_tool("echo", {"text": "hi"})
        assert echoed.structured_content == {"text": "hi"}
    # Nothing is priced or paid for here.
    assert not env.bridge.spend_log().entries


async def test_bot_errors_reach_the_agent_unchanged(tmp_path: Path) -> None:
    async with mirror(tmp_path, harness=catalog_bot(tmp_path)) as env, agent(env) as session:
        with pytest.raises(MCPError) as info:
            await session.read_resource("test://missing")
        assert info.value.error == types.ErrorData(
            code=types.INVALID_PARAMS,
            message='unknown resource "test://missing"',
            data={"uri": "test://missing"},
        )
        with pytest.raises(MCPError) as info:
            await session.get_prompt("test_prompt_with_arguments", {"arg1": "only"})
        assert (
            info.value.error.message
            == 'prompt "test_prompt_with_arguments": missing required argument "arg2"'
        )
        with pytest.raises(MCPError) as info:
            await session.complete(types.PromptReference(name="nope"), {"name": "a", "value": ""})
        assert (info.value.error.code, info.value.error.message) == (
            types.INVALID_PARAMS,
            'unknown prompt "nope"',
        )
        # A bot error is an answer, not a transport failure: no new BR session
        # (the first contact went on as the handshake session: the bot serves
        # resources and prompts, which need its standing session).
        link = env.bridge.link(BOT)
        assert link is not None
        assert link.dials == 1


async def test_a_failed_send_is_retried_once_on_a_fresh_session(tmp_path: Path) -> None:
    async with mirror(tmp_path, harness=catalog_bot(tmp_path)) as env, agent(env) as session:
        link = env.bridge.link(BOT)
        assert link is not None
        await session.list_resources()  # the handshake session the first-contact probe chose
        base = link.dials
        env.fabric.fail_sends(CLIENT, count=1)
        text = (await session.read_resource("test://static-text")).contents[0]
        assert isinstance(text, types.TextResourceContents)
        assert text.text == STATIC_TEXT
        assert link.dials == base + 1


# -- subscriptions -------------------------------------------------------------------


async def test_updates_reach_only_the_subscribed_agent(tmp_path: Path) -> None:
    harness = catalog_bot(tmp_path)
    a_inbox, b_inbox = Inbox(), Inbox()
    async with (
        mirror(tmp_path, harness=harness) as env,
        agent(env, a_inbox) as a,
        agent(env, b_inbox) as b,
    ):
        # Both agents used resources, so both hear list changes; this also
        # proves their GET streams are open before any update is sent.
        await a.list_resources()
        await b.list_resources()
        assert await harness.notify_resource_list_changed() == 1  # one BR session: the bridge's
        await a_inbox.wait_for("notifications/resources/list_changed")
        await b_inbox.wait_for("notifications/resources/list_changed")

        await subscribe(a, WATCHED_URI)
        assert env.count("resources/subscribe") == 1
        assert await harness.notify_resource_updated(WATCHED_URI) == 1
        await a_inbox.wait_for("notifications/resources/updated")
        update = a_inbox.items[-1]
        assert isinstance(update, types.ResourceUpdatedNotification)
        assert update.params.uri == WATCHED_URI

        assert await harness.notify_prompt_list_changed() == 1
        await b_inbox.wait_for("notifications/prompts/list_changed")
        assert b_inbox.methods() == [
            "notifications/resources/list_changed",
            "notifications/prompts/list_changed",
        ]

        # A second subscriber shares the bot's subscription.
        await subscribe(b, WATCHED_URI)
        assert env.count("resources/subscribe") == 1
        await harness.notify_resource_updated(WATCHED_URI)
        await b_inbox.wait_for("notifications/resources/updated")
        await a_inbox.wait_for("notifications/resources/updated", 2)

        # The bot is unsubscribed only when the last agent leaves.
        await unsubscribe(a, WATCHED_URI)
        assert env.count("resources/unsubscribe") == 0
        await unsubscribe(b, WATCHED_URI)
        assert env.count("resources/unsubscribe") == 1
        assert await harness.notify_resource_updated(WATCHED_URI) == 0

        with pytest.raises(MCPError) as info:
            await subscribe(a, "test://missing")
        assert info.value.error.code == types.INVALID_PARAMS


async def test_an_ended_agent_session_releases_its_subscriptions(tmp_path: Path) -> None:
    harness = catalog_bot(tmp_path)
    async with mirror(tmp_path, harness=harness) as env:
        async with agent(env) as session:
            await subscribe(session, WATCHED_URI)
            await subscribe(session, "test://static-text")
        # Leaving sends DELETE: the bridge forgets the session and unsubscribes the bot.
        await until(lambda: env.count("resources/unsubscribe") == 2)
        link = env.bridge.link(BOT)
        assert link is not None
        assert link.subscriptions.uris() == []
        assert await harness.notify_resource_updated(WATCHED_URI) == 0


async def test_a_new_bot_session_is_subscribed_again(tmp_path: Path) -> None:
    harness = catalog_bot(tmp_path)
    inbox = Inbox()
    async with mirror(tmp_path, harness=harness) as env, agent(env, inbox) as session:
        await session.list_resources()
        await subscribe(session, WATCHED_URI)
        link = env.bridge.link(BOT)
        assert link is not None
        base = link.dials
        assert link.reset()
        await session.list_resources()  # dials a fresh BR session
        assert link.dials == base + 1
        await until(lambda: env.count("resources/subscribe") == 2)
        await until(lambda: link.subscriptions.uris() == [WATCHED_URI])
        # The old bot session may linger until it idles out; the new one counts.
        assert await harness.notify_resource_updated(WATCHED_URI) >= 1
        await inbox.wait_for("notifications/resources/updated")


async def test_capabilities_are_refreshed_with_a_new_session(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path / "bot", allowed_peers={CLIENT}))

    @harness.resource("memo://one")
    async def one(ctx: PeerContext) -> str:
        return "one"

    async with mirror(tmp_path, harness=harness) as env, agent(env) as session:
        assert "prompts" not in declared(session)
        with pytest.raises(MCPError) as info:
            await session.list_prompts()
        assert info.value.error.code == types.METHOD_NOT_FOUND

        @harness.prompt()
        async def late(ctx: PeerContext) -> str:
            return "late prompt"

        link = env.bridge.link(BOT)
        assert link is not None
        assert link.reset()
        async with agent(env) as fresh:
            assert declared(fresh)["prompts"] == {"listChanged": True}
            assert [p.name for p in (await fresh.list_prompts()).prompts] == ["late"]
        # Dispatch follows the bot live, even for a session opened before.
        assert [p.name for p in (await session.list_prompts()).prompts] == ["late"]


# -- a bare SDK bot: cursors, _meta, per-capability gating ---------------------------------


def paging_bot(seen: list[dict[str, Any] | None]) -> Server[Any]:
    """Resources and prompts in two pages each; no subscribe, no completions, no tools."""

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        cursor = params.cursor if params is not None else None
        if cursor is None:
            page = [types.Resource(uri="r://1", name="one")]
            return types.ListResourcesResult(resources=page, next_cursor="page-2")
        if cursor != "page-2":
            raise MCPError(code=types.INVALID_PARAMS, message="bad cursor", data={"cursor": cursor})
        return types.ListResourcesResult(resources=[types.Resource(uri="r://2", name="two")])

    async def list_prompts(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        if params is None or params.cursor is None:
            return types.ListPromptsResult(prompts=[types.Prompt(name="p1")], next_cursor="more")
        return types.ListPromptsResult(prompts=[types.Prompt(name="p2")])

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        # The 2026-07-28 envelope keys are the era's own, not forwarded ones.
        own = {k: v for k, v in (params.meta or {}).items() if not k.startswith("io.modelcontextprotocol/")}
        seen.append(own or None)
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, text="body")],
            _meta={"io.modelcontextprotocol/related": "x", "bot/etag": "v7"},
        )

    return Server(
        "paging-bot",
        version="1",
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
    )


async def test_cursors_meta_and_partial_capabilities(tmp_path: Path) -> None:
    seen: list[dict[str, Any] | None] = []
    async with mirror(tmp_path, server=paging_bot(seen)) as env, agent(env) as session:
        # The bot declared resources without subscribe, and prompts: the endpoint says the same.
        assert declared(session) == {
            "logging": {},
            "prompts": {"listChanged": False},
            "resources": {"subscribe": False, "listChanged": False},
            "tools": {"listChanged": True},
        }
        first = await session.list_resources()
        assert ([r.uri for r in first.resources], first.next_cursor) == (["r://1"], "page-2")
        second = await session.list_resources(params=types.PaginatedRequestParams(cursor="page-2"))
        assert ([r.uri for r in second.resources], second.next_cursor) == (["r://2"], None)
        with pytest.raises(MCPError) as info:
            await session.list_resources(params=types.PaginatedRequestParams(cursor="bogus"))
        assert info.value.error == types.ErrorData(
            code=types.INVALID_PARAMS, message="bad cursor", data={"cursor": "bogus"}
        )
        prompts = await session.list_prompts()
        assert ([p.name for p in prompts.prompts], prompts.next_cursor) == (["p1"], "more")
        more = await session.list_prompts(params=types.PaginatedRequestParams(cursor="more"))
        assert [p.name for p in more.prompts] == ["p2"]

        # The agent's own _meta goes through; its progress token and the
        # SDK-managed keys do not, either way.
        meta = cast(types.RequestParamsMeta, {"progress_token": 5, "x.example/trace": "t-1"})
        request = types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri="r://1", _meta=meta))
        read = await session.send_request(request, types.ReadResourceResult)
        assert seen == [{"x.example/trace": "t-1"}]
        assert read.meta == {"bot/etag": "v7"}

        # Methods the bot did not declare stay unknown.
        for call in (
            subscribe(session, "r://1"),
            session.complete(types.PromptReference(name="p1"), {"name": "a", "value": ""}),
        ):
            with pytest.raises(MCPError) as info:
                await call
            assert info.value.error.code == types.METHOD_NOT_FOUND
        # No tools declared: none listed, and no tools/list sent to the bot.
        assert (await session.list_tools()).tools == []
    assert "resources/subscribe" not in env.bot_methods
    assert "completion/complete" not in env.bot_methods
    # Only the first-contact probe (modern era: it answered -32601 and
    # server/discover told what it serves).
    assert env.count("tools/list") <= 1


# -- bots that declare none of it ------------------------------------------------------


def tools_only_sdk_bot() -> Server[Any]:
    """A bot like the Go reference: tools and nothing else."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])

    return Server("go-like-bot", version="1", on_list_tools=list_tools)


def _sse_json(body: str) -> dict[str, Any]:
    for line in body.splitlines():
        if line.startswith("data: ") and line[len("data: ") :].strip():  # skip priming events
            value: dict[str, Any] = json.loads(line[len("data: ") :])
            return value
    raise AssertionError(f"no SSE data line in {body!r}")


@pytest.mark.parametrize("kind", ["harness", "sdk"])
async def test_tools_only_bots_keep_the_previous_endpoint(tmp_path: Path, kind: str) -> None:
    if kind == "harness":
        bot: dict[str, Any] = {"harness": build_harness(tmp_path / "bot", {})}
    else:
        bot = {"server": tools_only_sdk_bot()}
    async with mirror(tmp_path, **bot) as env:
        link_url = f"/mcp/{BOT}"
        address = env.bridge.listen_address
        assert address is not None
        async with httpx2.AsyncClient(base_url=f"http://{address[0]}:{address[1]}", timeout=30) as http:
            answer = await http.post(link_url, json=INIT, headers=auth())
            result = _sse_json(answer.text)["result"]
            assert result["capabilities"] == TOOLS_ONLY_CAPABILITIES
            headers = {**auth(), "mcp-session-id": answer.headers["mcp-session-id"]}
            headers["mcp-protocol-version"] = "2025-11-25"
            for number, (method, params) in enumerate(
                [
                    ("resources/list", {}),
                    ("resources/templates/list", {}),
                    ("resources/read", {"uri": "x://y"}),
                    ("resources/subscribe", {"uri": "x://y"}),
                    ("prompts/list", {}),
                    ("prompts/get", {"name": "p"}),
                    (
                        "completion/complete",
                        {"ref": {"type": "ref/prompt", "name": "p"}, "argument": {"name": "a", "value": ""}},
                    ),
                ],
                start=2,
            ):
                body = {"jsonrpc": "2.0", "id": number, "method": method, "params": params}
                reply = _sse_json((await http.post(link_url, json=body, headers=headers)).text)
                assert reply == {
                    "jsonrpc": "2.0",
                    "id": number,
                    "error": {"code": -32601, "message": "Method not found", "data": method},
                }
    # None of it reached the bot.
    assert not [m for m in env.bot_methods if m.startswith(("resources/", "prompts/", "completion/"))]


# -- the subscription registry on its own ------------------------------------------------


class _AgentSession:
    """Stands in for an agent's ServerSession: records notifications, or fails."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.got: list[str] = []

    async def send_notification(self, notification: types.ServerNotification) -> None:
        if self.fail:
            raise anyio.ClosedResourceError
        uri = getattr(notification.params, "uri", None)
        self.got.append(f"{notification.method} {uri}" if uri else notification.method)


def _ctx(session: _AgentSession, sid: str | None) -> ServerRequestContext[Any]:
    headers = {"mcp-session-id": sid} if sid is not None else {}
    return ServerRequestContext(
        session=session,  # type: ignore[arg-type]
        lifespan_context={},
        protocol_version="2025-11-25",
        method="resources/subscribe",
        request_id=1,
        request=SimpleNamespace(headers=headers),
    )


async def test_registry_routes_sub_resources_and_drops_dead_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    orphans: list[str] = []
    registry = Subscriptions(on_orphan=orphans.append)
    forwarded: list[str] = []

    def forward(label: str) -> Callable[[], Awaitable[None]]:
        async def send() -> None:
            forwarded.append(label)

        return send

    live, dead = _AgentSession(), _AgentSession(fail=True)
    await registry.subscribe(_ctx(live, "a"), "file:///docs", forward("sub docs"))
    await registry.subscribe(_ctx(dead, "b"), "file:///docs", forward("sub docs again"))
    await registry.subscribe(_ctx(dead, "b"), "file:///img", forward("sub img"))
    assert forwarded == ["sub docs", "sub img"]

    # A sub-resource reaches the subscriber of its parent; the failing
    # session is forgotten and its last-subscriber URI reported.
    assert await registry.deliver_update("file:///docs/a.txt") == 1
    assert live.got == ["notifications/resources/updated file:///docs/a.txt"]
    assert orphans == ["file:///img"]
    assert registry.uris() == ["file:///docs"]
    assert await registry.deliver_update("file:///documents") == 0

    # Unsubscribing the last subscriber forwards; an unknown one does nothing.
    await registry.unsubscribe(_ctx(live, "a"), "file:///nothing", forward("unsub nothing"))
    await registry.unsubscribe(_ctx(live, "a"), "file:///docs", forward("unsub docs"))
    assert forwarded[2:] == ["unsub docs"]

    with pytest.raises(MCPError) as info:
        await registry.subscribe(_ctx(live, None), "file:///docs", forward("never"))
    assert info.value.error.code == types.INVALID_REQUEST

    # Past the agent limit the least recently active session is forgotten.
    monkeypatch.setattr(subscriptions, "MAX_AGENTS", 2)
    await registry.subscribe(_ctx(live, "a"), "x://1", forward("sub 1"))
    registry.watch(_ctx(_AgentSession(), "c"))
    registry.watch(_ctx(_AgentSession(), "d"))
    assert registry.agents == 2
    assert orphans[-1] == "x://1"
    assert await registry.broadcast(types.PromptListChangedNotification()) == 2
