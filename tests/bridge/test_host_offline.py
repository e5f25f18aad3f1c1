"""The bridge's own brclient is down (BRIDGE.md "Reconnects (daemon)").

A PM waits for brclient to come back at most ``RECONNECT_WAIT`` (30 s).
Once that wait has run out with brclient still down, a call fails at once
with an error naming the bridge's own brclient and what was paid, instead of
being re-sent until its deadline (600 s) and then blaming the bot. A call
that had paid keeps its callKey, so the agent's retry pays nothing twice.

The timing tests run the fabric in virtual time (trio's ``MockClock``, as in
test_rto.py), with the daemon's real :class:`PatientSender` in front of a
stand-in for its clientrpc client that can be taken down and brought back.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.shared.exceptions import MCPError
from trio.testing import MockClock

import brmcp.testing.fabric as fabric_module
from brmcp import PMSender
from brmcp.bridge import BridgeDaemon
from brmcp.clientrpc import BotConfig, Client, ClientrpcNotConnected, write_bot_config
from brmcp.clientrpc.patient import RECONNECT_WAIT, PatientSender
from brmcp.testing.fakebr import ensure_brclient_certs
from tests.kit import BOT, CLIENT
from tests.kit.bridge import (
    INIT,
    MCP_HEADERS,
    TOKEN,
    Bot,
    Stack,
    TestPayer,
    bridge_stack,
    build_harness,
    call,
    fixture_settings,
    joined,
)

URL = "wss://127.0.0.1:7676/ws"


class Brclient:
    """What :class:`PatientSender` uses of a clientrpc client, in front of
    the fabric's sender: while :attr:`up`, PMs go through; :meth:`down`
    stops the brclient (its last connection attempt failed), :meth:`up_again`
    brings it back (a new connection)."""

    def __init__(self, inner: PMSender) -> None:
        self._inner = inner
        self.url = URL
        self.connections = 1
        self.last_error: str | None = None
        self._up = True
        self._change = anyio.Event()

    @property
    def connected(self) -> bool:
        return self._up

    def down(self) -> None:
        self._up = False
        self.last_error = (
            "clientrpc: cannot connect to brclient at wss://127.0.0.1:7676/ws: connection refused"
        )

    def up_again(self) -> None:
        self._up = True
        self.connections += 1
        self.last_error = None
        self._change.set()
        self._change = anyio.Event()

    async def wait_connected(self) -> None:
        while not self._up:
            await self._change.wait()

    async def send_pm(self, peer: str, text: str) -> None:
        if not self._up:
            raise ClientrpcNotConnected()
        await self._inner.send_pm(peer, text)


def run_virtual(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})


@pytest.fixture
def virtual_fabric(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fabric times its deliveries with anyio's clock (the virtual one)."""
    monkeypatch.setattr(fabric_module, "time", SimpleNamespace(monotonic=anyio.current_time, time=time.time))


def handshake_bot() -> Server[Any]:
    """A plain SDK bot (handshake era, as the Go reference) with one free tool."""
    import mcp.types as types
    from mcp.server import ServerRequestContext

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="free", input_schema={"type": "object"})])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])

    return Server("plain", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


def _bot(kind: str, tmp_path: Path) -> Bot:
    if kind == "harness":
        return build_harness(tmp_path / "bot", {})
    server = handshake_bot()

    async def accept(conn: Any) -> None:
        await server.run(conn.read_stream, conn.write_stream, server.create_initialization_options())

    return accept


def _assert_names_the_brclient(message: str) -> None:
    assert message.startswith(f"the bridge's brclient at {URL} is not connected (waited 30s for it"), message
    assert "its last connection attempt: clientrpc: cannot connect" in message
    assert "is brclient running, with its clientrpc enabled?" in message
    # Not the bot's fault: no hint that blames it.
    assert "is it online" not in message
    assert "allowed_uids" not in message
    assert "no reply from bot" not in message


@contextlib.asynccontextmanager
async def _bridge_behind_brclient(
    tmp_path: Path, bot: Bot, payer: TestPayer, *, wait: float = RECONNECT_WAIT, listen: str | None = None
) -> AsyncIterator[tuple[Stack, Brclient]]:
    """The fixture's bridge on the fabric, its PMs sent by the daemon's
    :class:`PatientSender` through a :class:`Brclient` that the test takes
    down and brings back."""
    fabric = fabric_module.Fabric()
    client = Brclient(fabric.sender(CLIENT))
    async with bridge_stack(
        tmp_path,
        payer,
        bot=bot,
        fabric=fabric,
        settings=fixture_settings(),
        sender=PatientSender(cast(Client, client), wait=wait),
        listen=listen,
    ) as built:
        yield built, client


@pytest.mark.usefixtures("virtual_fabric")
@pytest.mark.parametrize("kind", ["harness", "handshake"])
def test_a_call_while_brclient_is_down_fails_after_the_reconnect_wait_naming_it(
    tmp_path: Path, kind: str
) -> None:
    """A free call, no client timeout: the agent is told after the 30 s
    reconnect wait, not after the 600 s deadline, and it is told that the
    bridge's own brclient is down and nothing was paid."""

    async def main() -> None:
        async with _bridge_behind_brclient(tmp_path, _bot(kind, tmp_path), TestPayer()) as (built, client):
            proxy = built.bridge._proxy(BOT)
            assert not (await proxy.call("free", {})).is_error
            client.down()
            start = anyio.current_time()
            with pytest.raises(MCPError) as info:
                await proxy.call("free", {})
            took = anyio.current_time() - start
            assert RECONNECT_WAIT <= took < RECONNECT_WAIT + 5, took
            message = info.value.error.message
            _assert_names_the_brclient(message)
            assert message.endswith("; nothing was paid for this call"), message
            # The next call does not wait again: brclient is known to be down.
            start = anyio.current_time()
            with pytest.raises(MCPError) as again:
                await proxy.call("free", {})
            assert anyio.current_time() - start < 5
            _assert_names_the_brclient(again.value.error.message)
            # Back up: calls go through again.
            client.up_again()
            assert not (await proxy.call("free", {})).is_error

    run_virtual(main)


@pytest.mark.usefixtures("virtual_fabric")
def test_brclient_back_within_the_reconnect_wait_costs_only_the_wait(tmp_path: Path) -> None:
    async def main() -> None:
        bot = build_harness(tmp_path / "bot", {})
        async with _bridge_behind_brclient(tmp_path, bot, TestPayer()) as (built, client):
            proxy = built.bridge._proxy(BOT)
            assert not (await proxy.call("free", {})).is_error
            client.down()
            async with anyio.create_task_group() as tg:

                async def back_later() -> None:
                    await anyio.sleep(10)
                    client.up_again()

                tg.start_soon(back_later)
                start = anyio.current_time()
                result = await proxy.call("free", {})
                assert not result.is_error
                assert 10 <= anyio.current_time() - start < 15

    run_virtual(main)


async def test_a_paid_call_cut_off_by_brclient_says_what_was_paid_and_its_retry_pays_nothing_twice(
    tmp_path: Path,
) -> None:
    """The payment went through, then brclient went down before the call
    could be sent again: the agent is told at once (after the reconnect
    wait) what was paid, and its retry of the same call reuses the callKey
    and the payment: the bot runs it on the credit, nothing more is paid."""
    payer = TestPayer()
    executions: dict[str, int] = {}
    harness = build_harness(tmp_path / "bot", executions)
    payer.harness = harness
    with anyio.fail_after(60):
        async with (
            _bridge_behind_brclient(tmp_path, harness, payer, wait=0.5, listen="127.0.0.1:0") as stacked,
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
        ):
            built, client = stacked

            async def pay_then_brclient_stops(payee: str, atoms: int) -> None:
                await payer.credit(payee, atoms)
                client.down()

            address = built.bridge.listen_address
            assert address is not None
            url = f"http://{address[0]}:{address[1]}/mcp/{BOT}"
            async with (
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                await session.list_tools()
                # A dynamic price: no payment alongside; the bot refuses, the
                # bridge pays, and the reissue finds brclient gone.
                payer.behaviour = pay_then_brclient_stops
                started = anyio.current_time()
                with pytest.raises(MCPError) as info:
                    await call(session, "dyn")
                assert anyio.current_time() - started < 20  # not the 600 s deadline
                message = info.value.error.message
                assert message.startswith(f"the bridge's brclient at {URL} is not connected"), message
                assert message.endswith(
                    "; paid 7 atoms for this call (1 payment(s)); credit the bot did not use stays there"
                    " for later calls"
                ), message
                assert executions == {}
                assert payer.calls == [(BOT, 7)]
                client.up_again()
                payer.behaviour = None
                retried = await call(session, "dyn")
                assert not retried.is_error, joined(retried)
                assert executions == {"dyn": 1}
                assert payer.calls == [(BOT, 7)]  # the retry paid nothing more
                assert await harness.balance(CLIENT) == 0
                spend = built.bridge.spend_log()
                assert [(e.tool, e.atoms, e.status) for e in spend.entries] == [("dyn", 7, "paid")]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_patient_sender_names_a_brclient_that_is_not_there(tmp_path: Path) -> None:
    """A real clientrpc client with no brclient at its URL: a PM waits out
    the reconnect wait, then fails naming the URL; from then on the sender
    says it is offline, with the last connection attempt."""
    certs = ensure_brclient_certs(tmp_path / "brclient")
    url = f"wss://127.0.0.1:{_free_port()}/ws"
    client = Client(
        url,
        server_cert=certs.server_cert,
        client_cert=certs.client_cert,
        client_key=certs.client_key,
        backoff_initial=0.05,
        backoff_max=0.1,
    )
    with anyio.fail_after(30):
        async with client:
            sender = PatientSender(client, wait=0.3, hint="look at the log")
            assert sender.offline_reason() is None  # no PM has waited yet
            with pytest.raises(
                ClientrpcNotConnected, match=rf"^brclient at {url} not connected \(waited 300ms"
            ):
                await sender.send_pm(BOT, "hello")
            reason = sender.offline_reason()
            assert reason is not None
            assert reason.startswith(f"the bridge's brclient at {url} is not connected (waited 300ms for it")
            assert "its last connection attempt: " in reason
            assert reason.endswith("; look at the log")


async def test_the_daemon_s_hint_names_its_command_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon with its brclient down: an agent's first request gets a
    503 naming the brclient, the daemon's command line and its log file,
    not the unanswered-bot hint."""
    monkeypatch.setenv("BRMCP_LOCK_DIR", str(tmp_path / "locks"))
    certs = ensure_brclient_certs(tmp_path / "brclient")
    url = f"wss://127.0.0.1:{_free_port()}/ws"
    datadir = tmp_path / "bridge"
    datadir.mkdir()
    cfg = BotConfig.defaults(datadir, "brmcp-bridge")
    cfg.brrpcurl = url
    cfg.servercertpath = str(certs.server_cert)
    cfg.clientcertpath = str(certs.client_cert)
    cfg.clientkeypath = str(certs.client_key)
    write_bot_config(datadir / "brmcp-bridge.conf", cfg)
    (datadir / "mcpclient.json").write_text(fixture_settings().to_json())
    daemon = BridgeDaemon.from_datadir(
        datadir, listen="127.0.0.1:0", client_options={"backoff_initial": 0.05, "backoff_max": 0.1}
    )
    sender = daemon.bridge.config.sender
    assert isinstance(sender, PatientSender)
    sender._wait = 0.3  # the reconnect wait, shortened
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
                answer = await http.post(
                    f"{daemon.base_url}/mcp/{BOT}", headers=MCP_HEADERS, content=json.dumps(INIT)
                )
            assert answer.status_code == 503, answer.text
            message = answer.json()["error"]["message"]
            assert message.startswith(f"the bridge's brclient at {url} is not connected"), message
            assert f"The log of brmcp-bridge --datadir {datadir} says why it cannot connect" in message
            assert f"(also in {os.path.join(datadir, 'logs', 'brmcp-bridge.log')})" in message
            assert "is it online" not in message
            tg.cancel_scope.cancel()
