"""Agents discover, users decide: the bridge's own endpoint ``/mcp/discover``
(brmcp/bridge/agent/_discover.py), the parked add-bot requests
(brmcp/bridge/find/_botrequests.py), their admin routes
(brmcp/bridge/admin/_botrequestroutes.py) and the ``approvals`` command (BRIDGE.md
§Finding bots through directories).

A fake directory (a harness at DIR serving ``search``, ``get_provider`` and
``introduce``) sits on the in-memory fabric; an MCP SDK agent talks to the
bridge's HTTP listener; the user decides through the admin routes with the
admin token. The property test drives the queue of a real bridge through
random interleavings of requests, decisions, withdrawals and timeouts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.types import CallToolResult

from brmcp.bridge import Bridge, BridgeConfig, ManualClock, Settings, cli
from brmcp.bridge.base import load_settings
from brmcp.bridge.daemon import write_runtime
from brmcp.bridge.find import MAX_PENDING, RequestEnded
from brmcp.server import CallContext, Harness, HarnessConfig
from tests.kit import CLIENT, until
from tests.kit.bridge import INIT, TOKEN, Stack, auth, bridge_stack, call, joined


def huid(tag: str) -> str:
    """A 64-hex test uid of its own."""
    return hashlib.sha256(tag.encode()).hexdigest()


DIR = huid("directory")
P1 = huid("provider 1")
P2 = huid("provider 2")
KNOWN = huid("already allowed")
START = 1_800_000_000
TIMEOUT = 90


def base_settings(**changes: Any) -> Settings:
    return Settings(
        enabled=True,
        token=TOKEN,
        mode="approval",
        per_call_cap_atoms=700,
        per_day_cap_atoms=9_000,
        allowed_bots=(KNOWN,),
        approval_timeout_secs=TIMEOUT,
        directories=(DIR,),
    ).replace(**changes)


class Contacts:
    """brclient's contacts as the bridge sees them: a set."""

    def __init__(self, known: set[str]) -> None:
        self.known = known

    async def is_contact(self, uid: str) -> bool:
        return uid in self.known

    async def wait_kx(self, uid: str, wait_secs: float) -> bool:
        return uid in self.known


@dataclass
class FakeDirectory:
    """What the fake directory was asked, and what its get_provider answers."""

    introduced: list[str] = field(default_factory=list)
    provider: dict[str, Any] = field(default_factory=dict)


def directory_harness(data_dir: Path, state: FakeDirectory) -> Harness:
    harness = Harness(HarnessConfig(data_dir=data_dir, allowed_peers={CLIENT}, name="fake-directory"))

    async def search(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        hit = {
            "providerUid": P1,
            "tool": "fortune",
            "description": "a fortune\x1b[31m",
            "priceAtoms": 500,
            "tags": ["fun"],
            "catalogCheckedAt": START - 60,
            "lastVerifiedExecution": START - 60,
        }
        return {"hits": [hit, {"providerUid": "zz", "tool": "bad"}], "total": 2}

    async def get_provider(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return state.provider or {"uid": args.get("uid"), "description": "nothing known"}

    async def introduce(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        state.introduced.append(str(args.get("uid")))
        return {"suggested": True, "note": "sent"}

    schema: dict[str, Any] = {"type": "object"}
    harness.add_tool("search", search, description="search", input_schema=schema)
    harness.add_tool("get_provider", get_provider, description="provider", input_schema=schema)
    harness.add_tool("introduce", introduce, description="introduce", input_schema=schema)
    return harness


@dataclass
class World:
    stack: Stack
    clock: ManualClock
    contacts: Contacts
    directory: FakeDirectory

    @property
    def bridge(self) -> Bridge:
        return self.stack.bridge

    @property
    def base_url(self) -> str:
        address = self.bridge.listen_address
        assert address is not None
        return f"http://{address[0]}:{address[1]}"

    @property
    def settings_file(self) -> Path:
        return self.stack.data_dir / "mcpclient.json"

    def admin(self, token: str | None = None) -> httpx2.AsyncClient:
        given = self.bridge.admin_token if token is None else token
        return httpx2.AsyncClient(
            base_url=self.base_url, headers={"Authorization": f"Bearer {given}"}, timeout=30
        )

    async def requests(self) -> dict[str, Any]:
        async with self.admin() as http:
            response = await http.get("/admin/bot-requests")
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    async def decide(self, request_id: str, approve: bool) -> httpx2.Response:
        async with self.admin() as http:
            return await http.post(f"/admin/bot-requests/{request_id}", json={"approve": approve})

    async def pending_uids(self) -> list[str]:
        return [r["uid"] for r in (await self.requests())["pending"]]

    @asynccontextmanager
    async def agent(self, token: str = TOKEN) -> AsyncIterator[ClientSession]:
        from mcp.client.streamable_http import streamable_http_client

        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
            streamable_http_client(f"{self.base_url}/mcp/discover", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@asynccontextmanager
async def world(tmp_path: Path, *, contacts: set[str] | None = None, **changes: Any) -> AsyncIterator[World]:
    state = FakeDirectory()
    clock = ManualClock(START)
    known = Contacts(contacts if contacts is not None else {DIR, P1, P2})
    harness = directory_harness(tmp_path / "directory", state)
    async with bridge_stack(
        tmp_path, _NoPayer(), bot=harness, bot_uid=DIR, settings=base_settings(**changes), clock=clock
    ) as stack:
        stack.bridge.use_contacts(known)
        yield World(stack, clock, known, state)


class _NoPayer:
    """Nothing in these tests may pay."""

    async def pay(self, payee_uid: str, atoms: int) -> None:
        raise AssertionError(f"paid {atoms} atoms to {payee_uid}")


def structured(result: CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None, joined(result)
    return dict(result.structured_content)


def without_allowed(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    data.pop("allowed_bots")
    return data


# -- the endpoint ----------------------------------------------------------------------


async def test_agent_finds_requests_and_the_user_approves_exactly_that_uid(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as agent:
            tools = {t.name: t for t in (await agent.list_tools()).tools}
            assert set(tools) == {"find_tools", "provider_details", "request_bot"}
            for tool in tools.values():
                assert "user" in (tool.description or "")
            found = structured(await call(agent, "find_tools", {"query": "fortune"}))
            assert [(h["providerUid"], h["tool"]) for h in found["hits"]] == [(P1, "fortune")]
            claim = found["hits"][0]["claims"][0]
            assert claim["directory"] == DIR
            assert claim["description"] == "a fortune[31m"  # the escape character dropped
            assert found["directories"][0]["dropped"] == 1

            before = without_allowed(w.settings_file)
            version = w.bridge.change_version
            answers: list[CallToolResult] = []

            async def ask() -> None:
                answers.append(
                    await call(agent, "request_bot", {"uid": P1.upper(), "reason": "to read fortunes"})
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await until(lambda: bool(w.bridge.bot_requests.pending()))
                listed = await w.requests()
                [pending] = listed["pending"]
                assert set(pending) == {
                    "id",
                    "uid",
                    "reason",
                    "via",
                    "agent",
                    "requestedAt",
                    "expiresAt",
                    "contact",
                }
                assert pending["uid"] == P1
                assert pending["reason"] == "to read fortunes"
                assert pending["via"] is None
                assert pending["requestedAt"] == START
                assert pending["expiresAt"] == START + TIMEOUT
                assert listed["recent"] == []
                # The approvals page's change notifier heard of it.
                assert w.bridge.change_version > version
                version = w.bridge.change_version
                await until(lambda: w.bridge.bot_requests.pending()[0].contact is True)
                response = await w.decide(pending["id"], True)
                assert response.status_code == 200
                assert response.json() == {"id": pending["id"], "outcome": "approved"}
            assert w.bridge.change_version > version
            [answer] = answers
            body = structured(answer)
            assert body["outcome"] == "approved"
            assert body["kxPending"] is False
            assert f"/mcp/{P1}" in joined(answer)
            assert w.bridge.settings.allowed_bots == (KNOWN, P1)
            assert without_allowed(w.settings_file) == before
            assert json.loads(w.settings_file.read_text())["allowed_bots"] == [KNOWN, P1]
            assert w.directory.introduced == []
            recent = (await w.requests())["recent"]
            assert recent == [{"id": pending["id"], "uid": P1, "outcome": "approved", "endedAt": START}]
            # A second decision does not count.
            again = await w.decide(pending["id"], False)
            assert again.status_code == 409
            assert "already ended (approved)" in again.json()["error"]


async def test_approval_without_kx_asks_the_directory_and_tells_the_user(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path, contacts={DIR}) as w, w.agent() as agent:
            answers: list[CallToolResult] = []

            async def ask() -> None:
                answers.append(await call(agent, "request_bot", {"uid": P2, "via": DIR}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await until(lambda: bool(w.bridge.bot_requests.pending()))
                await until(lambda: w.bridge.bot_requests.pending()[0].contact is False)
                [pending] = (await w.requests())["pending"]
                assert pending["contact"] is False
                assert pending["via"] == DIR
                assert (await w.decide(pending["id"], True)).status_code == 200
            body = structured(answers[0])
            assert body["kxPending"] is True
            assert "accepted the KX suggestion" in body["text"]
            assert DIR in body["text"]
            assert w.directory.introduced == [P2]
            assert w.bridge.settings.allowed_bots == (KNOWN, P2)


async def test_deny_leaves_the_settings_file_byte_for_byte(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as agent:
            before = w.settings_file.read_bytes()
            answers: list[CallToolResult] = []

            async def ask() -> None:
                answers.append(await call(agent, "request_bot", {"uid": P1}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await until(lambda: bool(w.bridge.bot_requests.pending()))
                rid = w.bridge.bot_requests.pending()[0].id
                response = await w.decide(rid, False)
                assert response.json() == {"id": rid, "outcome": "denied"}
            assert structured(answers[0])["outcome"] == "denied"
            assert "denied" in joined(answers[0])
            assert w.settings_file.read_bytes() == before
            assert w.bridge.settings.allowed_bots == (KNOWN,)


async def test_a_request_times_out_on_the_bridge_clock(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as agent:
            before = w.settings_file.read_bytes()
            answers: list[CallToolResult] = []

            async def ask() -> None:
                answers.append(await call(agent, "request_bot", {"uid": P1}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await until(lambda: bool(w.bridge.bot_requests.pending()))
                rid = w.bridge.bot_requests.pending()[0].id
                await until(lambda: w.clock.sleepers > 0)
                w.clock.advance(TIMEOUT - 1)
                assert w.bridge.bot_requests.pending()  # not yet
                w.clock.advance(1)
            assert structured(answers[0])["outcome"] == "timed out"
            assert "within 1m30s" in joined(answers[0])
            assert (await w.requests())["recent"][0]["outcome"] == "timed out"
            late = await w.decide(rid, True)
            assert late.status_code == 409
            assert w.settings_file.read_bytes() == before


async def test_same_uid_twice_is_one_request_and_both_waiters_hear_the_decision(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as first, w.agent() as second:
            answers: list[CallToolResult] = []

            async def ask(agent: ClientSession) -> None:
                answers.append(await call(agent, "request_bot", {"uid": P1}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, first)
                tg.start_soon(ask, second)
                await until(lambda: w.clock.sleepers >= 2)
                assert await w.pending_uids() == [P1]
                rid = w.bridge.bot_requests.pending()[0].id
                assert (await w.decide(rid, True)).status_code == 200
            assert [structured(a)["outcome"] for a in answers] == ["approved", "approved"]
            assert {structured(a)["id"] for a in answers} == {rid}
            assert w.bridge.settings.allowed_bots == (KNOWN, P1)


async def test_the_seventeenth_pending_request_is_refused_at_once(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as agent:
            async with anyio.create_task_group() as tg:
                for n in range(MAX_PENDING):
                    tg.start_soon(call, agent, "request_bot", {"uid": huid(f"bot {n}")})
                await until(lambda: len(w.bridge.bot_requests.pending()) == MAX_PENDING)
                refused = await call(agent, "request_bot", {"uid": huid("one more")})
                assert refused.is_error
                assert f"{MAX_PENDING} add-bot requests already wait" in joined(refused)
                assert len(w.bridge.bot_requests.pending()) == MAX_PENDING
                # A uid already pending still joins its request.
                tg.start_soon(call, agent, "request_bot", {"uid": huid("bot 0")})
                await until(lambda: w.clock.sleepers >= MAX_PENDING + 1)
                assert len(w.bridge.bot_requests.pending()) == MAX_PENDING
                for request in w.bridge.bot_requests.pending():
                    assert (await w.decide(request.id, False)).status_code == 200
            assert w.bridge.settings.allowed_bots == (KNOWN,)


async def test_an_allowed_uid_answers_at_once_and_parks_nothing(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as agent:
            for uid in (KNOWN, DIR):
                answer = await call(agent, "request_bot", {"uid": uid})
                assert structured(answer)["outcome"] == "already allowed"
            assert (await w.requests()) == {"pending": [], "recent": []}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"uid": "zz"}, 'request_bot: uid "zz" is not a 64-hex Bison Relay uid'),
        ({}, "request_bot: uid null is not a 64-hex Bison Relay uid"),
        ({"uid": 7}, "request_bot: uid 7 is not a 64-hex Bison Relay uid"),
        ({"uid": P1, "reason": "x" * 201}, "request_bot: reason has 201 characters; at most 200"),
        ({"uid": P1, "reason": "ok\x00\u202e"}, "reason holds control or other non-printing characters"),
        ({"uid": P1, "reason": ["list"]}, 'request_bot: reason ["list"] must be a string'),
        ({"uid": P1, "per_call_cap_atoms": 10**9}, "request_bot: unknown key 'per_call_cap_atoms'"),
        ({"uid": P1, "via": "nope"}, 'request_bot: via "nope" is not a 64-hex Bison Relay uid'),
        ({"uid": P1, "via": P2}, f"via: {P2} is not one of the directories"),
    ],
)
async def test_hostile_arguments_are_refused_with_one_clear_line(
    tmp_path: Path, arguments: dict[str, Any], expected: str
) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as agent:
            before = w.settings_file.read_bytes()
            result = await call(agent, "request_bot", arguments)
            assert result.is_error
            assert expected in joined(result)
            assert "\n" not in joined(result)
            assert w.bridge.bot_requests.pending() == []
            assert w.settings_file.read_bytes() == before


async def test_find_and_provider_details_refuse_bad_arguments(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as agent:
            for tool, arguments, expected in (
                ("find_tools", {}, "find_tools: query is required"),
                ("find_tools", {"query": "x", "maxPrice": 3}, "find: unknown key 'maxPrice'"),
                ("find_tools", {"query": "x" * 300}, "query must be a string of at most 256"),
                ("find_tools", {"query": "x", "maxPriceAtoms": -1}, "must be an integer >= 0"),
                ("provider_details", {"uid": "zz"}, "provider_details: uid"),
                ("provider_details", {"uid": P1, "x": 1}, "unknown key 'x'"),
                ("nothing", {}, 'unknown tool "nothing"'),
            ):
                result = await call(agent, tool, arguments)
                assert result.is_error, tool
                assert expected in joined(result), joined(result)


async def test_provider_details_are_the_directory_claims_bounded(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as agent:
            w.directory.provider = {
                "uid": P1,
                "description": "d" * 5000 + "\x07",
                "tags": [f"t{n}" for n in range(40)],
                "catalog": [{"name": f"tool{n}", "_meta": {"brmcp/priceAtoms": n}} for n in range(80)]
                + [{"name": 5}],
                "catalogCheckedAt": "yesterday",
                "lastVerifiedExecution": START - 5,
                "testLatencyMs": -3,
            }
            details = structured(await call(agent, "provider_details", {"uid": P1}))
            assert details["uid"] == P1
            assert details["now"] == START
            [answer] = details["directories"]
            assert answer["directory"] == DIR
            assert answer["outcome"] == "ok"
            claims = answer["claims"]
            assert len(claims["description"]) == 300
            assert len(claims["tags"]) == 16
            assert len(claims["catalog"]) == 50
            assert claims["catalog"][3] == {
                "name": "tool3",
                "description": "",
                "priceAtoms": 3,
                "pricing": "",
            }
            assert claims["catalogDropped"] == 31
            assert claims["catalogCheckedAt"] is None
            assert claims["lastVerifiedExecution"] == START - 5
            assert claims["testLatencyMs"] is None
            assert w.bridge.settings.allowed_bots == (KNOWN,)


async def test_an_agent_cannot_decide_and_the_routes_check_their_input(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as agent:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, agent, "request_bot", {"uid": P1})
                await until(lambda: bool(w.bridge.bot_requests.pending()))
                rid = w.bridge.bot_requests.pending()[0].id
                for headers in ({"Authorization": f"Bearer {TOKEN}"}, {}):
                    async with httpx2.AsyncClient(base_url=w.base_url, headers=headers, timeout=30) as http:
                        assert (await http.get("/admin/bot-requests")).status_code == 401
                        response = await http.post(f"/admin/bot-requests/{rid}", json={"approve": True})
                        assert response.status_code == 401
                async with w.admin() as http:
                    for body in ({"approve": "yes"}, {"approve": True, "per_call_cap_atoms": 5}, [True]):
                        response = await http.post(f"/admin/bot-requests/{rid}", json=body)
                        assert response.status_code == 400
                        assert (
                            response.json()["error"] == 'body must be {"approve": true} or {"approve": false}'
                        )
                    unknown = await http.post("/admin/bot-requests/0123456789abcdef", json={"approve": True})
                    assert unknown.status_code == 404
                    assert (await http.put("/admin/bot-requests")).status_code == 405
                assert w.bridge.bot_requests.pending()
                assert (await w.decide(rid, False)).status_code == 200
            assert w.bridge.settings.allowed_bots == (KNOWN,)


async def test_the_endpoint_keeps_the_gate_of_the_bot_endpoints(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w:
            url = f"{w.base_url}/mcp/discover"
            async with httpx2.AsyncClient(timeout=30) as http:
                assert (
                    await http.post(url, json=INIT, headers=auth("wrong-token-0123456789"))
                ).status_code == 401
                evil = {**auth(), "Origin": "http://evil.example"}
                assert (await http.post(url, json=INIT, headers=evil)).status_code == 403
                assert (await http.post(url, json=[INIT], headers=auth())).status_code == 400
                big = b" " * (4 * 1024 * 1024 + 1)
                assert (await http.post(url, content=big, headers=auth())).status_code == 413
                plain = {**auth(), "Content-Type": "text/plain"}
                assert (await http.post(url, content=b"{}", headers=plain)).status_code == 415
                assert (await http.put(url, headers=auth())).status_code == 405
                assert (await http.post(url, json=INIT, headers=auth())).status_code == 200


async def test_an_agent_that_disconnects_withdraws_its_request(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w:
            url = f"{w.base_url}/mcp/discover"
            async with httpx2.AsyncClient(timeout=30) as http:
                opened = await http.post(url, json=INIT, headers=auth())
                headers = {
                    **auth(),
                    "Mcp-Session-Id": opened.headers["mcp-session-id"],
                    "MCP-Protocol-Version": "2025-11-25",
                }
                await http.post(
                    url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
                )
                message = {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "request_bot", "arguments": {"uid": P1}},
                }
                async with http.stream("POST", url, json=message, headers=headers) as response:
                    assert response.status_code == 200
                    await until(lambda: bool(w.bridge.bot_requests.pending()))
            await until(lambda: not w.bridge.bot_requests.pending())
            [ended] = (await w.requests())["recent"]
            assert ended["uid"] == P1
            assert ended["outcome"] == "withdrawn"
            assert w.bridge.settings.allowed_bots == (KNOWN,)


async def test_approvals_command_lists_and_decides_bot_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w, w.agent() as agent:
            data_dir = w.stack.data_dir
            write_runtime(data_dir, listen=w.base_url[7:], url=w.base_url, sighup=False)

            async def run(*argv: str) -> int:
                code: int = await anyio.to_thread.run_sync(cli.main, ["--datadir", str(data_dir), *argv])
                return code

            answers: list[CallToolResult] = []

            async def ask() -> None:
                answers.append(await call(agent, "request_bot", {"uid": P1, "reason": "fortunes please"}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask)
                await until(lambda: bool(w.bridge.bot_requests.pending()))
                rid = w.bridge.bot_requests.pending()[0].id
                assert await run("approvals") == 0
                out = capsys.readouterr().out
                assert f"{rid}" in out
                assert f"add bot {P1}" in out
                assert "reason: fortunes please" in out
                assert "no cap changes" in out
                assert await run("approvals", "approve", rid) == 0
                assert capsys.readouterr().out.strip() == f"approved add bot {rid}"
            assert structured(answers[0])["outcome"] == "approved"
            assert await run("approvals", "deny", rid) == 1
            assert "already ended (approved)" in capsys.readouterr().err
            assert w.bridge.settings.allowed_bots == (KNOWN, P1)


# -- the property -------------------------------------------------------------------------


class _Sender:
    async def send_pm(self, peer_uid: str, text: str) -> None:
        raise AssertionError("nothing is sent")


UIDS = [huid(f"candidate {n}") for n in range(5)]
_step = st.one_of(
    st.tuples(st.just("ask"), st.integers(0, len(UIDS) - 1)),
    st.tuples(st.just("decide"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("leave"), st.integers(0, 20)),
    st.tuples(st.just("tick"), st.integers(1, 60)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_step, max_size=25))
def test_allowed_bots_grow_by_exactly_the_approved_uids(
    tmp_path_factory: pytest.TempPathFactory, steps: list[Any]
) -> None:
    data_dir = tmp_path_factory.mktemp("bridge")
    initial = base_settings(allowed_bots=(KNOWN,), directories=None)
    (data_dir / "mcpclient.json").write_text(initial.to_json())

    async def scenario() -> None:
        clock = ManualClock(START)
        config = BridgeConfig(data_dir=data_dir, sender=_Sender(), payer=_NoPayer(), clock=clock)
        approved: set[str] = set()
        async with Bridge(config) as bridge, anyio.create_task_group() as tg:
            queue = bridge.bot_requests
            waiters: list[anyio.CancelScope] = []

            async def ask(uid: str, scope: anyio.CancelScope) -> None:
                with scope:
                    await queue.request(uid, reason="r")

            for step in steps:
                if step[0] == "ask":
                    scope = anyio.CancelScope()
                    waiters.append(scope)
                    tg.start_soon(ask, UIDS[step[1]], scope)
                elif step[0] == "decide":
                    pending = queue.pending()
                    if pending:
                        request = pending[step[1] % len(pending)]
                        try:
                            await queue.decide(request.id, step[2])
                        except RequestEnded:
                            pass
                        else:
                            if step[2]:
                                approved.add(request.uid)
                elif step[0] == "leave" and waiters:
                    waiters[step[1] % len(waiters)].cancel()
                else:
                    clock.advance(step[1])
                for _ in range(5):
                    await anyio.lowlevel.checkpoint()
            after = bridge.settings
            assert set(after.allowed_bots or ()) == {KNOWN} | approved
            assert len(after.allowed_bots or ()) == 1 + len(approved)
            assert after.replace(allowed_bots=initial.allowed_bots) == initial
            outcomes = {(e.request.uid, e.outcome) for e in queue.recent(256)}
            assert {uid for uid, outcome in outcomes if outcome == "approved"} == approved
            tg.cancel_scope.cancel()
        on_disk = load_settings(data_dir / "mcpclient.json")
        assert on_disk.replace(allowed_bots=initial.allowed_bots) == initial
        assert set(on_disk.allowed_bots or ()) == {KNOWN} | approved

    anyio.run(scenario)


async def test_an_agent_that_cancels_and_ends_its_session_withdraws_its_request(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with world(tmp_path) as w:
            async with w.agent() as agent, anyio.create_task_group() as tg:
                tg.start_soon(call, agent, "request_bot", {"uid": P2})
                await until(lambda: bool(w.bridge.bot_requests.pending()))
                tg.cancel_scope.cancel()
            await until(lambda: not w.bridge.bot_requests.pending())
            [ended] = (await w.requests())["recent"]
            assert (ended["uid"], ended["outcome"]) == (P2, "withdrawn")
            async with w.admin() as http:
                late = await http.post(f"/admin/bot-requests/{ended['id']}", json={"approve": True})
            assert late.status_code == 409
            assert "already ended (withdrawn)" in late.json()["error"]
            assert w.bridge.settings.allowed_bots == (KNOWN,)
