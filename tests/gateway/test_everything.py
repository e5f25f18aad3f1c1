"""The gateway in front of ``@modelcontextprotocol/server-everything`` (npm,
run with the pinned Node 22; nobody here wrote it), over stdio and over
streamable HTTP, through agent → bridge → fabric → gateway → upstream.
Skips with the reason where the Node tools are not installed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INTERNAL_ERROR,
    CreateMessageRequestParams,
    CreateMessageResult,
    EmptyResult,
    LoggingMessageNotificationParams,
    PromptReference,
    ResourceUpdatedNotification,
    SubscribeRequest,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
)

from brmcp.gateway import PriceTable, UpstreamConfig
from brmcp.protocol.payment import PRICE_ATOMS_KEY
from tests.kit.gateway import CLIENT, call, everything_command, gateway_stack, joined, pid_wrapped, until

pytestmark = pytest.mark.node

LONG = "trigger-long-running-operation"
PRICES = PriceTable.parse(
    json.dumps(
        {
            "default": "free",
            "tools": {
                "get-sum": 300,
                LONG: 900,
                "get-resource-reference": 50,
                "get-env": "hidden",
                "gzip-file-as-resource": "hidden",
            },
        }
    )
)


def _command(transport: str = "stdio") -> list[str]:
    command = everything_command(transport)
    if isinstance(command, str):
        pytest.skip(command)
    return command


async def test_tools_prices_free_and_paid_calls(tmp_path: Path) -> None:
    upstream = UpstreamConfig(command=tuple(_command()))
    async with gateway_stack(tmp_path, upstream, PRICES) as env, env.session() as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert "echo" in listed
        assert "get-env" not in listed
        assert "gzip-file-as-resource" not in listed
        assert listed["echo"].meta == {PRICE_ATOMS_KEY: 0}
        assert listed["get-sum"].meta == {PRICE_ATOMS_KEY: 300}
        assert listed["get-sum"].annotations is not None
        assert listed["get-sum"].annotations.read_only_hint is True
        assert listed["get-sum"].input_schema["properties"]["a"]["type"] == "number"

        echoed = await call(session, "echo", {"message": "over Bison Relay"})
        assert "over Bison Relay" in joined(echoed)
        assert env.payer.payments == []

        summed = await call(session, "get-sum", {"a": 2, "b": 40})
        assert not summed.is_error, joined(summed)
        assert "42" in joined(summed)
        assert env.payer.payments == [300]
        assert env.gateway.upstream_calls == 2  # echo once, get-sum once (after the payment)
        assert await env.statement_kinds() == [("credit", 300), ("charge", -300)]
        assert await env.harness.balance(CLIENT) == 0


async def test_upstream_errors_are_refunded(tmp_path: Path) -> None:
    upstream = UpstreamConfig(command=tuple(_command()))
    async with gateway_stack(tmp_path, upstream, PRICES) as env, env.session() as session:
        # isError from the upstream (its own check of the id).
        result = await call(session, "get-resource-reference", {"resourceType": "Text", "resourceId": -3})
        assert result.is_error
        assert "Invalid resourceId" in joined(result)
        assert env.payer.payments == [50]
        assert await env.statement_kinds() == [("credit", 50), ("charge", -50), ("refund", 50)]

        # A JSON-RPC error from the upstream refunds the same way.
        real = env.gateway.upstream.request

        async def json_rpc_error(request: Any, result_type: Any, **kwargs: Any) -> Any:
            if getattr(request.params, "name", None) == "get-resource-reference":
                raise MCPError(code=INTERNAL_ERROR, message="upstream exploded")
            return await real(request, result_type, **kwargs)

        env.gateway.upstream.request = json_rpc_error  # type: ignore[method-assign]
        result = await call(session, "get-resource-reference", {"resourceType": "Text", "resourceId": 1})
        assert result.is_error
        assert "upstream error -32603: upstream exploded" in joined(result)
        # Paid from the balance left by the refund: no new tip.
        assert env.payer.payments == [50]
        kinds = await env.statement_kinds()
        assert kinds[3:] == [("charge", -50), ("refund", 50)]
        assert await env.harness.balance(CLIENT) == 50


async def test_upstream_killed_mid_call_is_refunded_once_and_restarted(tmp_path: Path) -> None:
    pidfile = tmp_path / "upstream.pid"
    upstream = UpstreamConfig(command=tuple(pid_wrapped(_command(), pidfile)))
    progress: list[float] = []
    async with gateway_stack(tmp_path, upstream, PRICES) as env, env.session() as session:
        first_pid = int(pidfile.read_text())

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)
            if len(progress) == 1:
                os.kill(first_pid, signal.SIGKILL)  # the upstream dies while the paid call runs

        with anyio.fail_after(60):
            result = await session.call_tool(
                LONG, {"duration": 30, "steps": 30}, progress_callback=on_progress
            )
        assert result.is_error
        assert "went away during the request" in joined(result)
        assert "refunded" in joined(result)
        assert progress[:1] == [1]  # upstream progress reached the agent
        assert env.payer.payments == [900]
        assert await env.statement_kinds() == [("credit", 900), ("charge", -900), ("refund", 900)]
        assert env.gateway.upstream_calls == 1

        await until(lambda: env.gateway.upstream.generation == 2 and env.gateway.upstream.session is not None)
        assert int(pidfile.read_text()) != first_pid
        again = await call(session, LONG, {"duration": 0.2, "steps": 2})
        assert not again.is_error, joined(again)
        # Paid from the refunded balance: one more charge, no new tip.
        assert env.payer.payments == [900]
        assert (await env.statement_kinds())[3:] == [("charge", -900)]
        assert await env.harness.balance(CLIENT) == 0


async def test_every_call_in_flight_is_refunded_once_when_the_upstream_dies(tmp_path: Path) -> None:
    pidfile = tmp_path / "upstream.pid"
    upstream = UpstreamConfig(command=tuple(pid_wrapped(_command(), pidfile)))
    started: list[int] = []
    results: list[Any] = []
    both_running = anyio.Event()
    async with gateway_stack(tmp_path, upstream, PRICES) as env:

        async def one(n: int) -> None:
            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                if n not in started:
                    started.append(n)
                if len(started) == 2:
                    both_running.set()

            async with env.session() as session:
                results.append(
                    await session.call_tool(
                        LONG, {"duration": 30, "steps": 30}, progress_callback=on_progress
                    )
                )

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 1)
                tg.start_soon(one, 2)
                await both_running.wait()
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
        assert [r.is_error for r in results] == [True, True]
        assert all("went away during the request" in joined(r) for r in results)
        assert env.payer.payments == [900, 900]
        kinds = sorted(await env.statement_kinds())
        assert kinds == sorted([("credit", 900)] * 2 + [("charge", -900)] * 2 + [("refund", 900)] * 2)
        assert await env.harness.balance(CLIENT) == 1800
        assert env.gateway.upstream_calls == 2
        await until(lambda: env.gateway.upstream.generation == 2)


async def test_resources_prompts_completions_and_subscriptions_are_mirrored(tmp_path: Path) -> None:
    upstream = UpstreamConfig(command=tuple(_command()))
    updates: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            updates.append(str(message.params.uri))

    async with (
        gateway_stack(tmp_path, upstream, PRICES) as env,
        env.session(message_handler=on_message) as session,
    ):
        upstream_session, _ = await env.gateway.upstream.ready()
        resources = (await session.list_resources()).resources
        assert resources == (await upstream_session.list_resources()).resources
        uri = str(resources[0].uri)
        read = await session.read_resource(uri)
        assert read.contents == (await upstream_session.read_resource(uri)).contents
        templates = (await session.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == [
            t.uri_template for t in (await upstream_session.list_resource_templates()).resource_templates
        ]
        dynamic = await session.read_resource("demo://resource/dynamic/text/2")
        assert isinstance(dynamic.contents[0], TextResourceContents)
        assert "2" in dynamic.contents[0].text

        prompts = (await session.list_prompts()).prompts
        assert [p.name for p in prompts] == [p.name for p in (await upstream_session.list_prompts()).prompts]
        got = await session.get_prompt("args-prompt", {"city": "Lisbon", "state": "PT"})
        assert "Lisbon" in json.dumps(got.model_dump(mode="json"))
        completion = await session.complete(
            PromptReference(type="ref/prompt", name="completable-prompt"),
            {"name": "department", "value": "E"},
        )
        assert completion.completion.values
        assert all(value.startswith("E") for value in completion.completion.values)

        with pytest.raises(MCPError):
            await session.read_resource("demo://no/such/resource")

        await session.send_request(SubscribeRequest(params=SubscribeRequestParams(uri=uri)), EmptyResult)
        await call(session, "toggle-subscriber-updates")
        await until(lambda: uri in updates)
    assert env.payer.payments == []


async def test_upstream_logs_reach_the_caller_of_the_running_call(tmp_path: Path) -> None:
    upstream = UpstreamConfig(command=tuple(_command()))
    logs: list[LoggingMessageNotificationParams] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async with (
        gateway_stack(tmp_path, upstream, PRICES) as env,
        env.session(logging_callback=on_log) as session,
    ):
        result = await call(session, "toggle-simulated-logging")
        assert not result.is_error, joined(result)
        await until(lambda: bool(logs))
    assert "message" in str(logs[0].data).lower()


async def test_upstream_sampling_is_relayed_to_the_caller(tmp_path: Path) -> None:
    upstream = UpstreamConfig(command=tuple(_command()))
    asked: list[CreateMessageRequestParams] = []

    async def sample(context: Any, params: CreateMessageRequestParams) -> CreateMessageResult:
        asked.append(params)
        return CreateMessageResult(
            role="assistant",
            content=TextContent(type="text", text="sampled by the agent"),
            model="test-model",
        )

    async with gateway_stack(tmp_path, upstream, PRICES) as env:
        # server-everything adds its sampling tool once it sees the gateway's
        # sampling capability, and says so with tools/list_changed.
        await until(lambda: any(s.name == "trigger-sampling-request" for s in env.harness.tools()))
        async with env.session(sampling_callback=sample) as session:
            result = await call(session, "trigger-sampling-request", {"prompt": "say hi", "maxTokens": 5})
        assert not result.is_error, joined(result)
        assert "sampled by the agent" in joined(result)
        assert len(asked) == 1
        assert "say hi" in json.dumps(asked[0].model_dump(mode="json"))


def _wait_listening(port: int, limit: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"server-everything did not listen on port {port}")


@asynccontextmanager
async def everything_http(tmp_path: Path, port: int | None = None) -> AsyncIterator[str]:
    """server-everything's streamable-HTTP transport on ``port`` (default: a
    free loopback port)."""
    from tests.kit.gateway import free_port

    command = _command("streamableHttp")
    port = port or free_port()
    env = {**os.environ, "PORT": str(port)}
    with open(tmp_path / f"everything-http-{port}.log", "ab") as log:  # noqa: ASYNC230
        process = await anyio.open_process(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            await anyio.to_thread.run_sync(_wait_listening, port)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            process.terminate()
            with anyio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
            await process.aclose()


async def test_streamable_http_upstream(tmp_path: Path) -> None:
    async with everything_http(tmp_path) as url:
        upstream = UpstreamConfig(url=url)
        async with gateway_stack(tmp_path, upstream, PRICES) as env, env.session() as session:
            listed = {tool.name: tool.meta for tool in (await session.list_tools()).tools}
            assert listed["get-sum"] == {PRICE_ATOMS_KEY: 300}
            summed = await call(session, "get-sum", {"a": 1, "b": 2})
            assert not summed.is_error, joined(summed)
            assert "3" in joined(summed)
            assert env.payer.payments == [300]
            assert await env.statement_kinds() == [("credit", 300), ("charge", -300)]
            progress: list[float] = []

            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                progress.append(value)

            done = await session.call_tool(LONG, {"duration": 0.3, "steps": 3}, progress_callback=on_progress)
            assert not done.is_error, joined(done)
            assert progress == [1, 2, 3]
            resources = (await session.list_resources()).resources
            assert resources
            prompts = (await session.list_prompts()).prompts
            assert {p.name for p in prompts} >= {"simple-prompt", "args-prompt"}


async def test_streamable_http_upstream_that_stops_is_reconnected(tmp_path: Path) -> None:
    from tests.kit.gateway import free_port

    port = free_port()
    upstream = UpstreamConfig(url=f"http://127.0.0.1:{port}/mcp")
    async with everything_http(tmp_path, port):
        # A call that finds the upstream down waits at most 2 s for it.
        stack = gateway_stack(tmp_path, upstream, PRICES, health_interval=0.2, ready_timeout=2.0)
        env = await stack.__aenter__()
    try:
        # The server is gone: the next call fails and is refunded (whether it
        # reached the gateway before or after a failed ping noticed); the
        # gateway keeps trying to reconnect.
        async with env.session() as session:
            failed = await call(session, "get-sum", {"a": 1, "b": 1})
        assert failed.is_error
        assert env.payer.payments == [300]
        assert await env.statement_kinds() == [("credit", 300), ("charge", -300), ("refund", 300)]
        await until(lambda: env.gateway.upstream.session is None)
        async with everything_http(tmp_path, port):
            await until(
                lambda: env.gateway.upstream.generation >= 2 and env.gateway.upstream.session is not None
            )
            async with env.session() as session:
                summed = await call(session, "get-sum", {"a": 20, "b": 22})
            assert not summed.is_error, joined(summed)
            assert "42" in joined(summed)
            assert env.payer.payments == [300]  # paid from the refunded balance
    finally:
        await stack.__aexit__(None, None, None)
