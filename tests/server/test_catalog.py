"""The harness's free catalog (brmcp/server/catalog/_catalog.py): resources, resource
templates, prompts and completions registered with decorators and add_*
methods, served to SDK clients over the in-memory fabric; capabilities
declared only when something is registered; subscriptions and the
operator's notifications."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
import mcp.types as types
import pydantic
import pytest
from mcp import ClientSession
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPError

from brmcp.server import CallContext, Harness, HarnessConfig, PeerContext
from brmcp.server.catalog import MAX_COMPLETION_VALUES
from tests.kit.harness import ALICE, BOB, BOT, Served, served


def new_harness(tmp_path: Path, **config: Any) -> Harness:
    config.setdefault("allowed_peers", {ALICE, BOB})
    config.setdefault("calls_per_minute", 1000)
    return Harness(HarnessConfig(data_dir=tmp_path, **config))


def caps(session: ClientSession) -> dict[str, Any]:
    result = session.initialize_result
    assert result is not None
    return result.capabilities.model_dump(by_alias=True, exclude_none=True, mode="json")


class Inbox:
    """A ``message_handler`` that keeps the notifications a client receives."""

    def __init__(self) -> None:
        self.items: list[types.ServerNotification] = []
        self._changed = anyio.Event()

    async def __call__(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            return
        self.items.append(message)
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, count: int, limit: float = 10.0) -> None:
        with anyio.fail_after(limit):
            while len(self.items) < count:
                await self._changed.wait()

    def methods(self) -> list[str]:
        return [item.method for item in self.items]


@asynccontextmanager
async def client(srv: Served, peer: str, inbox: Inbox | None = None) -> AsyncIterator[ClientSession]:
    conn = srv.clients[peer].dial(BOT)
    async with ClientSession(
        conn.read_stream, conn.write_stream, read_timeout_seconds=10, message_handler=inbox
    ) as session:
        await session.initialize()
        yield session


async def subscribe(session: ClientSession, uri: str) -> None:
    """``resources/subscribe`` without the SDK helper's 2026 deprecation warning."""
    request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
    await session.send_request(request, types.EmptyResult)


async def unsubscribe(session: ClientSession, uri: str) -> None:
    request = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
    await session.send_request(request, types.EmptyResult)


def catalog_harness(tmp_path: Path, **config: Any) -> Harness:
    """Tools, resources, a template, prompts and completions."""
    harness = new_harness(tmp_path, **config)

    @harness.tool(description="Echo")
    async def echo(ctx: CallContext, text: str = "") -> dict[str, Any]:
        return {"text": text}

    @harness.resource("memo://readme", mime_type="text/markdown", title="Read me", size=7)
    async def readme(ctx: PeerContext) -> str:
        """The read-me."""
        return f"# hi {ctx.peer[:4]}"

    @harness.resource("memo://logo", name="logo")
    async def logo(ctx: PeerContext) -> bytes:
        return b"\x89PNG"

    @harness.resource("memo://stats")
    async def stats(ctx: PeerContext) -> dict[str, Any]:
        return {"target": ctx.target, "n": 3}

    async def explicit(ctx: PeerContext) -> list[types.TextResourceContents]:
        return [
            types.TextResourceContents(uri=ctx.target, text="one"),
            types.TextResourceContents(uri=ctx.target + "#2", text="two"),
        ]

    harness.add_resource("memo://explicit", explicit, name="explicit", description="Two parts")

    @harness.resource_template("notes://{folder}/{id}", mime_type="application/json")
    async def note(ctx: PeerContext, folder: str, id: str) -> dict[str, Any]:
        """One note."""
        return {"folder": folder, "id": id, "uri": ctx.target}

    async def search(ctx: PeerContext, variables: dict[str, Any]) -> str:
        return f"results for {variables.get('q', '<none>')}"

    harness.add_resource_template("search://all{?q}", search, name="search")

    @harness.prompt(title="Greeting")
    async def greet(
        ctx: PeerContext,
        name: Annotated[str, "who to greet"],
        style: Annotated[str | None, pydantic.Field(description="tone")] = None,
    ) -> str:
        """Greets someone."""
        return f"Hello {name} ({style or 'plain'})"

    async def review(ctx: PeerContext, args: dict[str, str]) -> list[Any]:
        return [
            types.PromptMessage(role="assistant", content=types.TextContent(type="text", text="Sure.")),
            f"Review {args['path']}",
            types.ImageContent(type="image", data=base64.b64encode(b"img").decode(), mime_type="image/png"),
        ]

    harness.add_prompt(
        "review",
        review,
        description="Review a file",
        arguments=[types.PromptArgument(name="path", required=True), types.PromptArgument(name="depth")],
    )

    @harness.completion(prompt="greet", argument="name")
    async def names(ctx: PeerContext, value: str, context: dict[str, str]) -> list[str]:
        pool = ["alice", "alfred", "bob"] + [f"al{n:03d}" for n in range(150)]
        return [n for n in pool if n.startswith(value)]

    @harness.completion(resource_template="notes://{folder}/{id}", argument="id")
    async def ids(ctx: PeerContext, value: str, context: dict[str, str]) -> types.Completion:
        return types.Completion(values=[f"{context.get('folder', '?')}-{value}1"], total=1, has_more=False)

    return harness


# -- capabilities ------------------------------------------------------------------


async def test_tools_only_harness_declares_exactly_tools(tmp_path: Path) -> None:
    harness = new_harness(tmp_path)

    @harness.tool(description="Echo")
    async def echo(ctx: CallContext) -> str:
        return "ok"

    async with served(harness) as srv, client(srv, ALICE) as session:
        assert caps(session) == {"tools": {"listChanged": False}}
        for call in (session.list_resources(), session.list_prompts(), session.list_resource_templates()):
            with pytest.raises(MCPError) as info:
                await call
            assert info.value.error.code == types.METHOD_NOT_FOUND


async def test_capabilities_follow_registration(tmp_path: Path) -> None:
    harness = new_harness(tmp_path)

    @harness.prompt()
    async def hello(ctx: PeerContext) -> str:
        return "hi"

    async with served(harness) as srv:
        async with client(srv, ALICE) as session:
            assert caps(session) == {"tools": {"listChanged": False}, "prompts": {"listChanged": True}}
            with pytest.raises(MCPError) as info:
                await session.list_resources()
            assert info.value.error.code == types.METHOD_NOT_FOUND

        # Registering while serving: sessions opened afterwards see it.
        @harness.resource("memo://late")
        async def late(ctx: PeerContext) -> str:
            return "late"

        harness.add_completion(_no_values, prompt="hello", argument="x")
        async with client(srv, ALICE) as session:
            assert caps(session) == {
                "tools": {"listChanged": False},
                "prompts": {"listChanged": True},
                "resources": {"subscribe": True, "listChanged": True},
                "completions": {},
            }
            assert [r.uri for r in (await session.list_resources()).resources] == ["memo://late"]


async def _no_values(ctx: PeerContext, value: str, context: dict[str, str]) -> list[str]:
    return []


# -- resources ---------------------------------------------------------------------


async def test_resources_list_and_read(tmp_path: Path) -> None:
    async with served(catalog_harness(tmp_path)) as srv, client(srv, ALICE) as session:
        listed = (await session.list_resources()).resources
        assert [(r.uri, r.name, r.mime_type) for r in listed] == [
            ("memo://readme", "readme", "text/markdown"),
            ("memo://logo", "logo", None),
            ("memo://stats", "stats", None),
            ("memo://explicit", "explicit", None),
        ]
        assert (listed[0].title, listed[0].description, listed[0].size) == ("Read me", "The read-me.", 7)

        text = (await session.read_resource("memo://readme")).contents
        assert len(text) == 1
        assert isinstance(text[0], types.TextResourceContents)
        assert (text[0].uri, text[0].mime_type, text[0].text) == (
            "memo://readme",
            "text/markdown",
            "# hi 2222",
        )

        blob = (await session.read_resource("memo://logo")).contents[0]
        assert isinstance(blob, types.BlobResourceContents)
        assert (blob.mime_type, base64.b64decode(blob.blob)) == ("application/octet-stream", b"\x89PNG")

        stats = (await session.read_resource("memo://stats")).contents[0]
        assert isinstance(stats, types.TextResourceContents)
        assert stats.mime_type == "application/json"
        assert json.loads(stats.text) == {"target": "memo://stats", "n": 3}

        parts = (await session.read_resource("memo://explicit")).contents
        assert [(p.uri, getattr(p, "text", None)) for p in parts] == [
            ("memo://explicit", "one"),
            ("memo://explicit#2", "two"),
        ]


async def test_templates_match_and_substitute(tmp_path: Path) -> None:
    async with served(catalog_harness(tmp_path)) as srv, client(srv, ALICE) as session:
        templates = (await session.list_resource_templates()).resource_templates
        assert [(t.uri_template, t.name, t.description) for t in templates] == [
            ("notes://{folder}/{id}", "note", "One note."),
            ("search://all{?q}", "search", None),
        ]
        note = (await session.read_resource("notes://work/42")).contents[0]
        assert isinstance(note, types.TextResourceContents)
        assert json.loads(note.text) == {"folder": "work", "id": "42", "uri": "notes://work/42"}
        found = (await session.read_resource("search://all?q=cats")).contents[0]
        assert isinstance(found, types.TextResourceContents)
        assert found.text == "results for cats"
        bare = (await session.read_resource("search://all")).contents[0]
        assert isinstance(bare, types.TextResourceContents)
        assert bare.text == "results for <none>"


async def test_resource_errors(tmp_path: Path) -> None:
    harness = catalog_harness(tmp_path)

    @harness.resource("memo://broken")
    async def broken(ctx: PeerContext) -> str:
        raise RuntimeError("disk on fire")

    @harness.resource("memo://private")
    async def private(ctx: PeerContext) -> str:
        if ctx.peer != ALICE:
            raise MCPError(code=types.INVALID_PARAMS, message="not for you", data={"peer": ctx.peer})
        return "secret"

    @harness.resource("memo://odd")
    async def odd(ctx: PeerContext) -> object:
        return object()

    async with served(harness) as srv, client(srv, BOB) as session:
        with pytest.raises(MCPError) as info:
            await session.read_resource("memo://nope")
        assert info.value.error.code == types.INVALID_PARAMS
        assert info.value.error.message == 'unknown resource "memo://nope"'
        assert info.value.error.data == {"uri": "memo://nope"}
        with pytest.raises(MCPError) as info:
            await session.read_resource("memo://broken")
        assert (info.value.error.code, info.value.error.message) == (types.INTERNAL_ERROR, "disk on fire")
        with pytest.raises(MCPError) as info:
            await session.read_resource("memo://private")
        assert info.value.error.message == "not for you"
        assert info.value.error.data == {"peer": BOB}
        with pytest.raises(MCPError) as info:
            await session.read_resource("memo://odd")
        assert info.value.error.code == types.INTERNAL_ERROR
        assert "not JSON" in info.value.error.message


async def test_reads_and_prompt_gets_are_rate_limited(tmp_path: Path) -> None:
    harness = catalog_harness(tmp_path, calls_per_minute=2)
    async with served(harness) as srv, client(srv, ALICE) as session:
        await session.read_resource("memo://readme")
        await session.get_prompt("greet", {"name": "x"})
        with pytest.raises(MCPError) as info:
            await session.read_resource("memo://readme")
        assert (info.value.error.code, info.value.error.message) == (
            types.INVALID_REQUEST,
            "rate limited; retry later",
        )
        # Lists and completions take no token.
        await session.list_resources()
        await session.complete(types.PromptReference(name="greet"), {"name": "name", "value": "b"})


# -- prompts -----------------------------------------------------------------------


async def test_prompts_list_and_get(tmp_path: Path) -> None:
    async with served(catalog_harness(tmp_path)) as srv, client(srv, ALICE) as session:
        prompts = {p.name: p for p in (await session.list_prompts()).prompts}
        assert list(prompts) == ["greet", "review"]
        greet = prompts["greet"]
        assert (greet.title, greet.description) == ("Greeting", "Greets someone.")
        assert [(a.name, a.description, a.required) for a in greet.arguments or []] == [
            ("name", "who to greet", True),
            ("style", "tone", False),
        ]
        result = await session.get_prompt("greet", {"name": "Ann", "style": "warm"})
        assert result.description == "Greets someone."
        assert [(m.role, m.content) for m in result.messages] == [
            ("user", types.TextContent(type="text", text="Hello Ann (warm)"))
        ]
        default = await session.get_prompt("greet", {"name": "Bo"})
        assert default.messages[0].content == types.TextContent(type="text", text="Hello Bo (plain)")

        review = await session.get_prompt("review", {"path": "a.py"})
        assert [m.role for m in review.messages] == ["assistant", "user", "user"]
        assert review.messages[1].content == types.TextContent(type="text", text="Review a.py")
        assert isinstance(review.messages[2].content, types.ImageContent)


async def test_prompt_argument_errors(tmp_path: Path) -> None:
    async with served(catalog_harness(tmp_path)) as srv, client(srv, ALICE) as session:
        cases = [
            ("greet", {}, 'prompt "greet": missing required argument "name"'),
            ("greet", {"name": "a", "mood": "x"}, 'prompt "greet": unknown argument "mood"'),
            ("nope", {}, 'unknown prompt "nope"'),
        ]
        for name, args, message in cases:
            with pytest.raises(MCPError) as info:
                await session.get_prompt(name, args)
            assert (info.value.error.code, info.value.error.message) == (types.INVALID_PARAMS, message)


# -- completions -------------------------------------------------------------------


async def test_completions(tmp_path: Path) -> None:
    async with served(catalog_harness(tmp_path)) as srv, client(srv, ALICE) as session:
        prompt = types.PromptReference(name="greet")
        few = (await session.complete(prompt, {"name": "name", "value": "alf"})).completion
        assert (few.values, few.total, few.has_more) == (["alfred"], 1, False)
        many = (await session.complete(prompt, {"name": "name", "value": "al"})).completion
        assert len(many.values) == MAX_COMPLETION_VALUES
        assert (many.values[:2], many.total, many.has_more) == (["alice", "alfred"], 152, True)
        none = (await session.complete(prompt, {"name": "style", "value": "w"})).completion
        assert none.values == []

        template = types.ResourceTemplateReference(uri="notes://{folder}/{id}")
        ids = await session.complete(
            template, {"name": "id", "value": "7"}, context_arguments={"folder": "work"}
        )
        assert ids.completion.values == ["work-71"]

        for ref, message in (
            (types.PromptReference(name="nope"), 'unknown prompt "nope"'),
            (types.ResourceTemplateReference(uri="x://{y}"), 'unknown resource template "x://{y}"'),
        ):
            with pytest.raises(MCPError) as info:
                await session.complete(ref, {"name": "a", "value": ""})
            assert (info.value.error.code, info.value.error.message) == (types.INVALID_PARAMS, message)


# -- subscriptions and notifications -------------------------------------------------


async def test_subscribers_alone_hear_of_updates(tmp_path: Path) -> None:
    harness = catalog_harness(tmp_path)
    alice_inbox, bob_inbox = Inbox(), Inbox()
    async with (
        served(harness) as srv,
        client(srv, ALICE, alice_inbox) as alice,
        client(srv, BOB, bob_inbox) as bob,
    ):
        await subscribe(alice, "memo://readme")
        await subscribe(alice, "notes://work/1")
        await bob.list_resources()  # bob hears list changes only
        assert await harness.notify_resource_updated("memo://readme") == 1
        assert await harness.notify_resource_updated("memo://logo") == 0
        assert await harness.notify_resource_list_changed() == 2
        await alice_inbox.wait_for(2)
        await bob_inbox.wait_for(1)
        assert alice_inbox.methods() == [
            "notifications/resources/updated",
            "notifications/resources/list_changed",
        ]
        first = alice_inbox.items[0]
        assert isinstance(first, types.ResourceUpdatedNotification)
        assert first.params.uri == "memo://readme"
        assert bob_inbox.methods() == ["notifications/resources/list_changed"]

        await unsubscribe(alice, "memo://readme")
        await unsubscribe(alice, "memo://never")  # not subscribed: still {}
        assert await harness.notify_resource_updated("memo://readme") == 0
        assert await harness.notify_resource_updated("notes://work/1") == 1
        assert await harness.notify_prompt_list_changed() == 2
        await alice_inbox.wait_for(4)
        assert alice_inbox.methods()[2:] == [
            "notifications/resources/updated",
            "notifications/prompts/list_changed",
        ]

        with pytest.raises(MCPError) as info:
            await subscribe(alice, "memo://nope")
        assert info.value.error.code == types.INVALID_PARAMS

    # Sessions that ended are forgotten.
    assert await harness.notify_resource_updated("notes://work/1") == 0


# -- registration errors -------------------------------------------------------------


def test_registration_is_checked(tmp_path: Path) -> None:
    harness = catalog_harness(tmp_path)
    with pytest.raises(ValueError, match="already registered"):
        harness.add_resource("memo://readme", _read_nothing, name="again")
    with pytest.raises(ValueError, match="looks like a URI template"):
        harness.add_resource("memo://{x}", _read_nothing, name="x")
    with pytest.raises(ValueError, match="has no variables"):
        harness.add_resource_template("memo://plain", _template_nothing, name="plain")
    with pytest.raises(ValueError, match="already registered"):
        harness.add_resource_template("notes://{folder}/{id}", _template_nothing, name="again")
    with pytest.raises(ValueError, match="already registered"):
        harness.add_prompt("greet", _prompt_nothing)
    with pytest.raises(ValueError, match="exactly one of"):
        harness.add_completion(_no_values, argument="a")
    with pytest.raises(ValueError, match="exists"):
        harness.add_completion(_no_values, prompt="greet", argument="name")

    with pytest.raises(TypeError, match="must be the template's variables"):

        @harness.resource_template("t://{a}/{b}")
        async def wrong(ctx: PeerContext, a: str) -> str:
            return a

    with pytest.raises(TypeError, match="give q a default"):

        @harness.resource_template("t://x{?q}")
        async def needs_default(ctx: PeerContext, q: str) -> str:
            return q

    with pytest.raises(TypeError, match="must be a str"):

        @harness.prompt()
        async def typed(ctx: PeerContext, n: int) -> str:
            return str(n)

    with pytest.raises(TypeError, match="use resource_template"):

        @harness.resource("memo://params")
        async def params(ctx: PeerContext, x: str) -> str:
            return x

    with pytest.raises(TypeError, match="async function"):
        harness.resource("memo://sync")(_sync_handler)


async def _read_nothing(ctx: PeerContext) -> str:
    return ""


async def _template_nothing(ctx: PeerContext, variables: dict[str, Any]) -> str:
    return ""


async def _prompt_nothing(ctx: PeerContext, args: dict[str, str]) -> str:
    return ""


def _sync_handler(ctx: PeerContext) -> str:
    return ""
