"""The bridge relays the bot's in-call traffic to the calling agent
(brmcp/bridge/links/_relay.py): progress, log messages, sampling and elicitation;
and the conformance stack's bearer proxy keeps the real gate in force.

Runs the conformance fixture bot (tests/conformance/) with the Python SDK
as the agent, through the proxy; no Node.js needed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
from mcp import ClientSession
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.server import ServerRequestContext
from mcp.types import (
    INVALID_REQUEST,
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestFormParams,
    ElicitRequestParams,
    ElicitResult,
    EmptyResult,
    ErrorData,
    LoggingLevel,
    LoggingMessageNotificationParams,
    SamplingMessage,
    SetLevelRequest,
    SetLevelRequestParams,
    TextContent,
)

from brmcp.bridge.links import Relay
from tests.conformance.fixture import PRICES
from tests.conformance.stack import BOT, CLIENT, Stack, conformance_stack

INIT = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
    b'"capabilities":{},"clientInfo":{"name":"probe","version":"1"}}}'
)
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@asynccontextmanager
async def agent(stack: Stack, **callbacks: Any) -> AsyncIterator[ClientSession]:
    """An initialized SDK agent session through the proxy (no token)."""
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        streamable_http_client(stack.url, http_client=http) as (read, write),
        ClientSession(read, write, read_timeout_seconds=30, **callbacks) as session,
    ):
        await session.initialize()
        yield session


async def call(
    session: ClientSession, tool: str, arguments: dict[str, Any] | None = None, **kw: Any
) -> CallToolResult:
    request = CallToolRequest(params=CallToolRequestParams(name=tool, arguments=arguments or {}))
    return await session.send_request(request, CallToolResult, **kw)


async def set_level(session: ClientSession, level: LoggingLevel) -> None:
    """``logging/setLevel`` without the SDK helper's deprecation warning."""
    await session.send_request(SetLevelRequest(params=SetLevelRequestParams(level=level)), EmptyResult)


def text(result: CallToolResult) -> str:
    """The tool's own text: the bridge's money note (its last item on a paid
    call, BRIDGE.md §The hard bound) left out."""
    items = [c.text for c in result.content if isinstance(c, TextContent)]
    return "\n".join(t for t in items if not t.startswith("brmcp-bridge: "))


async def test_proxy_supplies_the_token_but_not_the_host_checks(tmp_path: Path) -> None:
    async with conformance_stack(tmp_path) as stack, httpx2.AsyncClient(timeout=30) as http:
        direct = await http.post(stack.direct_url, headers=JSON_HEADERS, content=INIT)
        assert direct.status_code == 401
        proxied = await http.post(stack.url, headers=JSON_HEADERS, content=INIT)
        assert proxied.status_code == 200
        assert proxied.headers["content-type"].startswith("text/event-stream")
        assert proxied.headers["mcp-session-id"]
        assert '"serverInfo"' in proxied.text
        evil_host = await http.post(
            stack.url, headers={**JSON_HEADERS, "Host": "evil.example.com"}, content=INIT
        )
        assert evil_host.status_code == 421
        evil_origin = await http.post(
            stack.url, headers={**JSON_HEADERS, "Origin": "http://evil.example.com"}, content=INIT
        )
        assert evil_origin.status_code == 403
        assert stack.proxy.requests == 3  # the direct request did not pass the proxy


async def test_progress_is_relayed_in_order_before_the_paid_result(tmp_path: Path) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with conformance_stack(tmp_path) as stack, agent(stack) as session:
        result = await call(session, "test_tool_with_progress", progress_callback=on_progress)
        assert text(result) == "Progress tool completed"
        assert [(p, t) for p, t, _ in seen] == [(0.0, 100.0), (50.0, 100.0), (100.0, 100.0)]
        assert seen[-1][2] == "step 3 of 3"
        assert stack.payer.payments == [(BOT, PRICES["test_tool_with_progress"])]
        assert await stack.harness.balance(CLIENT) == 0


async def test_bot_is_not_asked_for_progress_without_an_agent_token(tmp_path: Path) -> None:
    async with conformance_stack(tmp_path) as stack, agent(stack) as session:
        before = stack.fabric.link(BOT, CLIENT).pms
        result = await call(session, "test_tool_with_progress")
        assert text(result) == "Progress tool completed"
        # The result (paid alongside, so no payment_required first), or the
        # refusal and the result: no progress PMs crossed the relay.
        assert stack.fabric.link(BOT, CLIENT).pms - before in (1, 2)


async def test_log_messages_follow_the_agents_level_and_precede_the_result(tmp_path: Path) -> None:
    logs: list[LoggingMessageNotificationParams] = []
    idle_logs: list[LoggingMessageNotificationParams] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async def on_idle_log(params: LoggingMessageNotificationParams) -> None:
        idle_logs.append(params)

    async with (
        conformance_stack(tmp_path) as stack,
        agent(stack, logging_callback=on_log) as session,
        agent(stack, logging_callback=on_idle_log) as idle,
    ):
        await set_level(idle, "debug")
        await set_level(session, "warning")
        await call(session, "test_tool_with_logging")
        assert logs == []
        await set_level(session, "info")
        result = await call(session, "test_tool_with_logging")
        assert text(result) == "Tool with logging executed successfully"
        assert [p.data for p in logs] == [
            "Tool execution started",
            "Tool processing data",
            "Tool execution completed",
        ]
        assert {(p.level, p.logger) for p in logs} == {("info", "conformance-fixture")}
        assert idle_logs == []  # no call of that agent was in flight


async def test_sampling_and_elicitation_reach_the_calling_agent(tmp_path: Path) -> None:
    prompts: list[CreateMessageRequestParams] = []
    forms: list[ElicitRequestParams] = []

    async def sample(ctx: ClientRequestContext, params: CreateMessageRequestParams) -> CreateMessageResult:
        prompts.append(params)
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text="hello from the agent"), model="m"
        )

    async def elicit(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        forms.append(params)
        return ElicitResult(action="accept", content={"username": "ann", "email": "ann@example.com"})

    async with (
        conformance_stack(tmp_path) as stack,
        agent(stack, sampling_callback=sample, elicitation_callback=elicit) as s,
    ):
        sampled = await call(s, "test_sampling", {"prompt": "say hello"})
        assert text(sampled) == "LLM response: hello from the agent"
        assert len(prompts) == 1
        assert prompts[0].max_tokens == 100
        first = prompts[0].messages[0].content
        assert isinstance(first, TextContent)
        assert first.text == "say hello"
        elicited = await call(s, "test_elicitation", {"message": "who are you?"})
        assert (
            text(elicited)
            == 'User response: action=accept, content={"email":"ann@example.com","username":"ann"}'
        )
        assert [f.message for f in forms] == ["who are you?"]
        assert isinstance(forms[0], ElicitRequestFormParams)
        assert forms[0].requested_schema["required"] == ["username", "email"]


async def test_agent_without_sampling_gets_the_bots_error(tmp_path: Path) -> None:
    async with conformance_stack(tmp_path) as stack, agent(stack) as session:
        result = await call(session, "test_sampling", {"prompt": "hi"})
        assert result.is_error
        assert "sampling/createMessage: the agent does not support it" in text(result)


async def test_bot_requests_are_refused_when_two_agents_have_calls_in_flight(tmp_path: Path) -> None:
    entered = anyio.Event()
    release = anyio.Event()

    async def slow_elicit(ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        entered.set()
        await release.wait()
        return ElicitResult(action="decline")

    async def sample(ctx: ClientRequestContext, params: CreateMessageRequestParams) -> CreateMessageResult:
        raise AssertionError("must not be asked while another agent's call is in flight")

    first: list[CallToolResult] = []

    async with (
        conformance_stack(tmp_path) as stack,
        agent(stack, elicitation_callback=slow_elicit) as a,
        agent(stack, sampling_callback=sample) as b,
    ):

        async def first_call() -> None:
            first.append(await call(a, "test_elicitation", {"message": "wait"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(first_call)
            with anyio.fail_after(10):
                await entered.wait()
            refused = await call(b, "test_sampling", {"prompt": "hi"})
            release.set()
        assert refused.is_error
        assert "calls from several agents are in flight" in text(refused)
        assert text(first[0]) == "User response: action=decline, content=null"
        link = stack.bridge.link(BOT)
        assert link is not None
        assert link.relay.in_flight == 0


class _StubSession:
    """Stands in for the agent request's ServerSession (progress only)."""

    def __init__(self) -> None:
        self.progress: list[float] = []

    async def report_progress(self, progress: float, total: float | None, message: str | None) -> None:
        await anyio.sleep(0.01)
        self.progress.append(progress)


def _agent_ctx(session: _StubSession, meta: dict[str, Any] | None) -> ServerRequestContext[Any]:
    return ServerRequestContext(
        session=session,  # type: ignore[arg-type]
        lifespan_context={},
        protocol_version="2025-11-25",
        method="tools/call",
        request_id=7,
        meta=meta,  # type: ignore[arg-type]
        request=SimpleNamespace(headers={"mcp-session-id": "s1"}),
    )


async def test_relay_drops_non_increasing_progress_and_settles_after_writes() -> None:
    relay = Relay()
    session = _StubSession()
    with relay.track(_agent_ctx(session, {"progress_token": "t"})) as call:
        assert call is not None
        assert call.wants_progress
        assert relay.in_flight == 1
        async with anyio.create_task_group() as tg:
            for value in (0.0, 50.0, 50.0, 20.0, 100.0):
                await call.progress(value, 100.0, None)
            tg.start_soon(call.progress, 150.0, None, None)
            await anyio.lowlevel.checkpoint()
            await call.settle()
            assert session.progress == [0.0, 50.0, 100.0, 150.0]  # settle waited for the last write
    assert relay.in_flight == 0
    with relay.track(_agent_ctx(session, None)) as call:
        assert call is not None
        assert not call.wants_progress


async def test_relay_refuses_bot_requests_with_no_call_in_flight() -> None:
    relay = Relay()
    params = CreateMessageRequestParams(
        messages=[SamplingMessage(role="user", content=TextContent(type="text", text="hi"))], max_tokens=5
    )
    answer = await relay.on_sampling(None, params)  # type: ignore[arg-type]
    assert isinstance(answer, ErrorData)
    assert answer.code == INVALID_REQUEST
    assert answer.message == "sampling/createMessage: no agent call is in flight"
    with relay.track(None) as call:  # a direct call (no agent request) is not tracked
        assert call is None
        assert relay.in_flight == 0
