"""An agent's retry never pays twice: resumable agent streams (SSE event
store, priming event, ``retry``, ``Last-Event-ID``) and re-sent calls whose
earlier copy the agent did not receive."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2

from brmcp.bridge.agent import RETRY_INTERVAL_MS, TWIN_GRACE
from tests.kit.bridge import BOT, CLIENT, INIT, auth, bridge_env, until


async def _events(response: httpx2.Response) -> AsyncIterator[dict[str, str]]:
    """The SSE events of a streamed response, as field dicts."""
    event: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if event:
                yield event
            event = {}
            continue
        name, _, value = line.partition(":")
        event[name] = value[1:] if value.startswith(" ") else value


async def _open(http: httpx2.AsyncClient) -> dict[str, str]:
    response = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth())
    assert response.status_code == 200
    sid = response.headers["mcp-session-id"]
    headers = {**auth(), "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
    notified = await http.post(
        f"/mcp/{BOT}", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
    )
    assert notified.status_code == 202
    return headers


def _call(request_id: int, tool: str = "paid") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {"text": "x"}},
    }


async def _priming(http: httpx2.AsyncClient, headers: dict[str, str], body: dict[str, Any]) -> str:
    """POST ``body``, read the priming event, drop the connection; returns its id."""
    async with http.stream("POST", f"/mcp/{BOT}", json=body, headers=headers) as response:
        assert response.status_code == 200
        async for event in _events(response):
            assert event.get("data", "") == ""
            assert event["retry"] == str(RETRY_INTERVAL_MS)
            return event["id"]
    raise AssertionError("no priming event")


async def test_post_streams_are_primed_even_under_an_older_version_header(tmp_path: Path) -> None:
    """The first event of a POST stream is the priming event (id, empty
    data, retry), also when a 2025-11-25 session's request names an older
    MCP-Protocol-Version (as the conformance suite's SSE polling check does)."""
    async with bridge_env(tmp_path) as env, env.http() as http:
        headers = await _open(http)
        headers["mcp-protocol-version"] = "2025-03-26"
        with anyio.fail_after(30):
            async with http.stream("POST", f"/mcp/{BOT}", json=_call(5, "free"), headers=headers) as response:
                events = [event async for event in _events(response)]
        assert events[0]["id"]
        assert events[0].get("data", "") == ""
        assert events[0]["retry"] == str(RETRY_INTERVAL_MS)
        answer = json.loads(events[-1]["data"])
        assert answer["id"] == 5
        assert answer["result"]["structuredContent"] == {"ok": True}
        assert events[-1]["id"]


async def test_a_dropped_stream_is_resumed_with_last_event_id(tmp_path: Path) -> None:
    """The agent's stream drops during a paid call; it resumes with
    Last-Event-ID and receives the outcome: one payment, one execution."""
    async with bridge_env(tmp_path) as env, env.http() as http:
        release = anyio.Event()

        async def slow_tip(payee: str, atoms: int) -> None:
            await release.wait()
            await env.payer.credit(payee, atoms)

        env.payer.behaviour = slow_tip
        headers = await _open(http)
        with anyio.fail_after(30):
            primed = await _priming(http, headers, _call(11))
            await env.payer.entered.wait()
            resume = {**headers, "last-event-id": primed, "accept": "text/event-stream"}
            async with http.stream("GET", f"/mcp/{BOT}", headers=resume) as response:
                assert response.status_code == 200
                release.set()
                answer: dict[str, Any] = {}
                async for event in _events(response):
                    if event.get("data"):
                        answer = json.loads(event["data"])
                        if answer.get("id") == 11:
                            break
        assert answer["result"]["structuredContent"] == {"n": 1}
        assert env.payer.calls == [(BOT, 500)]
        assert env.executions == {"paid": 1}
        assert await env.harness.balance(CLIENT) == 0


async def test_another_session_cannot_replay_a_stream(tmp_path: Path) -> None:
    """Event ids are per session: another agent session resuming with them
    gets nothing of the first session's calls."""
    async with bridge_env(tmp_path) as env, env.http() as http:
        first = await _open(http)
        second = await _open(http)
        with anyio.fail_after(30):
            primed = await _priming(http, first, _call(3, "free"))
            await until(lambda: env.executions.get("free") == 1)
            stolen = {**second, "last-event-id": primed, "accept": "text/event-stream"}
            seen: list[dict[str, str]] = []
            with anyio.move_on_after(1.0):
                async with http.stream("GET", f"/mcp/{BOT}", headers=stolen) as response:
                    async for event in _events(response):
                        seen.append(event)
        assert not [e for e in seen if e.get("data")]


async def test_a_resent_call_after_the_answer_went_into_a_closed_connection_pays_once(tmp_path: Path) -> None:
    """The agent's connection closes; the call is answered into it; the agent
    then sends the same call again (new request id): it receives the same
    outcome, with no second execution and no second payment."""
    async with bridge_env(tmp_path) as env, env.http() as http:
        release = anyio.Event()

        async def slow_tip(payee: str, atoms: int) -> None:
            await release.wait()
            await env.payer.credit(payee, atoms)

        env.payer.behaviour = slow_tip
        headers = await _open(http)
        with anyio.fail_after(30):
            await _priming(http, headers, _call(21))
            await env.payer.entered.wait()
            release.set()
            await until(lambda: env.executions.get("paid") == 1)
            link = env.bridge.link(BOT)
            assert link is not None
            await until(lambda: link.relay.in_flight == 0)
            again = await http.post(f"/mcp/{BOT}", json=_call(22), headers=headers)
        answer = json.loads([e for e in again.text.split("\n") if e.startswith("data: {")][-1][6:])
        assert answer["id"] == 22
        assert answer["result"]["structuredContent"] == {"n": 1}
        assert env.payer.calls == [(BOT, 500)]
        assert env.executions == {"paid": 1}


async def test_a_resent_call_while_the_first_is_paying_pays_once(tmp_path: Path) -> None:
    """The agent's connection closes while its tip is in flight and it sends
    the same call again at once: the re-send waits for the first copy's
    payment and uses it; one payment, one execution, one answer."""
    async with bridge_env(tmp_path) as env, env.http() as http:
        release = anyio.Event()

        async def slow_tip(payee: str, atoms: int) -> None:
            await release.wait()
            await env.payer.credit(payee, atoms)

        env.payer.behaviour = slow_tip
        headers = await _open(http)
        with anyio.fail_after(30):
            await _priming(http, headers, _call(31))
            await env.payer.entered.wait()
            link = env.bridge.link(BOT)
            assert link is not None
            sid = headers["mcp-session-id"]
            # The bridge notices the closed connection.
            await until(lambda: [c.detached for c in link.relay.calls_of(sid)] == [True])
            async with anyio.create_task_group() as tg:

                async def resend() -> None:
                    response = await http.post(f"/mcp/{BOT}", json=_call(32), headers=headers)
                    answers.append(response.text)

                answers: list[str] = []
                tg.start_soon(resend)
                # The re-send took over the first copy's key and waits for it.
                await until(lambda: len(link.relay.calls_of(sid)) == 2)
                await until(lambda: link.relay.calls_of(sid)[0].gone.is_set())
                release.set()
        answer = json.loads([e for e in answers[0].split("\n") if e.startswith("data: {")][-1][6:])
        assert answer["id"] == 32
        assert answer["result"]["structuredContent"] == {"n": 1}
        assert env.payer.calls == [(BOT, 500)]
        assert env.executions == {"paid": 1}
        assert await env.harness.balance(CLIENT) == 0


async def test_a_resent_call_that_overtakes_its_own_disconnect_pays_once(tmp_path: Path) -> None:
    """An agent gives up on a call and sends it again at once: the new
    request reaches the bridge while the first copy's connection is still
    open (the close is on its way on another TCP connection). The re-send
    waits for the first copy to be let go (``TWIN_GRACE``), takes its key
    over, and the bot runs and is paid once."""
    async with bridge_env(tmp_path, auto_clock=False) as env, env.http() as http:
        release = anyio.Event()
        drop_first = anyio.Event()

        async def slow_tip(payee: str, atoms: int) -> None:
            await release.wait()
            await env.payer.credit(payee, atoms)

        env.payer.behaviour = slow_tip
        headers = await _open(http)
        link = env.bridge.link(BOT)
        assert link is not None
        sid = headers["mcp-session-id"]
        answers: list[str] = []

        async def first() -> None:
            async with http.stream("POST", f"/mcp/{BOT}", json=_call(41), headers=headers) as response:
                assert response.status_code == 200
                await drop_first.wait()

        async def resend() -> None:
            response = await http.post(f"/mcp/{BOT}", json=_call(42), headers=headers)
            answers.append(response.text)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await env.payer.entered.wait()
                tg.start_soon(resend)
                # The re-send is held in the grace while the first copy is attached.
                await until(lambda: len(link.relay.calls_of(sid)) == 2 and env.clock.sleepers >= 1)
                assert [c.detached for c in link.relay.calls_of(sid)] == [False, False]
                drop_first.set()
                await until(lambda: link.relay.calls_of(sid)[0].gone.is_set())
                release.set()
        answer = json.loads([e for e in answers[0].split("\n") if e.startswith("data: {")][-1][6:])
        assert answer["id"] == 42
        assert answer["result"]["structuredContent"] == {"n": 1}
        assert env.payer.calls == [(BOT, 500)]
        assert env.executions == {"paid": 1}
        assert await env.harness.balance(CLIENT) == 0


async def test_identical_calls_on_live_connections_stay_independent(tmp_path: Path) -> None:
    """Two identical calls whose connections both stay open past the grace
    are two calls: each runs, and the payments cover both to the atom."""
    async with bridge_env(tmp_path, auto_clock=False) as env, env.http() as http:
        release = anyio.Event()

        async def slow_tip(payee: str, atoms: int) -> None:
            await release.wait()
            await env.payer.credit(payee, atoms)

        env.payer.behaviour = slow_tip
        headers = await _open(http)
        link = env.bridge.link(BOT)
        assert link is not None
        sid = headers["mcp-session-id"]
        answers: list[str] = []

        async def call(request_id: int) -> None:
            response = await http.post(f"/mcp/{BOT}", json=_call(request_id), headers=headers)
            answers.append(response.text)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, 51)
                await env.payer.entered.wait()
                tg.start_soon(call, 52)
                await until(lambda: len(link.relay.calls_of(sid)) == 2 and env.clock.sleepers >= 1)
                env.clock.advance(TWIN_GRACE)
                release.set()
                while len(answers) < 2:
                    await anyio.sleep(0.01)
                    env.clock.advance(1.0)
        results = [json.loads([e for e in a.split("\n") if e.startswith("data: {")][-1][6:]) for a in answers]
        assert sorted(r["result"]["structuredContent"]["n"] for r in results) == [1, 2]
        assert env.executions == {"paid": 2}
        paid = sum(atoms for _, atoms in env.payer.calls)
        assert paid == 2 * 500 + await env.harness.balance(CLIENT)
