"""Stopping the bridge with agent calls in flight (BRIDGE.md §Failures; the
daemon's SIGINT/SIGTERM): a payment parked for approval is withdrawn,
nothing paid; a payment in flight completes; and every agent call in
flight is answered with an error saying the bridge is stopping and what was
paid for it, before the HTTP sessions end, instead of hanging."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from brmcp.bridge import Bridge, ManualClock, Settings
from brmcp.bridge.daemon import resolve_listen
from brmcp.bridge.pay import STOPPING
from brmcp.testing import Fabric
from tests.bridge.test_daemon import TOKEN, bridge_settings, prepare_bridge_dir
from tests.kit import BOT
from tests.kit.bridge import START, TestPayer, build_harness, call, fabric_bridge, fixture_settings, until
from tests.kit.bridge import TOKEN as TOKEN_FIXTURE
from tests.kit.serve import serve_network

NOTHING_PAID = f"{STOPPING}; nothing was paid for this call"


async def _call_in_background(
    tg: anyio.abc.TaskGroup, session: ClientSession, tool: str, errors: list[MCPError]
) -> None:
    async def run() -> None:
        try:
            await call(session, tool)
        except MCPError as exc:
            errors.append(exc)

    tg.start_soon(run)


@dataclass
class Hosted:
    """A bridge run by a host task, as the daemon runs it: :meth:`stop`
    makes that task leave ``async with bridge`` (so :meth:`Bridge.close`
    runs there), and waits until it has."""

    bridge: Bridge
    payer: TestPayer
    executions: dict[str, int]
    url: str
    close: anyio.Event
    closed: anyio.Event

    async def stop(self) -> None:
        self.close.set()
        await self.closed.wait()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[ClientSession]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN_FIXTURE}"}, timeout=30) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@asynccontextmanager
async def hosted(tmp_path: Path, settings: Settings) -> AsyncIterator[Hosted]:
    payer = TestPayer()
    executions: dict[str, int] = {}
    harness = build_harness(tmp_path / "bot", executions)
    payer.harness = harness
    data_dir = tmp_path / "bridge"
    data_dir.mkdir()
    (data_dir / "mcpclient.json").write_text(settings.to_json())
    async with Fabric() as fabric, harness:
        fabric.attach(BOT, (await harness.start(fabric.sender(BOT))).handle_pm)
        async with anyio.create_task_group() as tg:
            bridge = fabric_bridge(fabric, data_dir, payer, clock=ManualClock(START))
            close, closed = anyio.Event(), anyio.Event()

            async def host(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
                try:
                    async with bridge:
                        task_status.started()
                        await close.wait()
                finally:
                    closed.set()

            await tg.start(host)
            address = bridge.listen_address
            assert address is not None
            yield Hosted(
                bridge, payer, executions, f"http://{address[0]}:{address[1]}/mcp/{BOT}", close, closed
            )
            close.set()


async def test_a_stop_withdraws_a_parked_payment_and_answers_its_agent(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with hosted(tmp_path, fixture_settings(mode="approval")) as env:
            errors: list[MCPError] = []
            async with env.session() as session, anyio.create_task_group() as tg:
                await _call_in_background(tg, session, "paid", errors)
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                (parked,) = env.bridge.pending_payments()
                await env.stop()
                await until(lambda: bool(errors))
            (error,) = errors
            assert error.error.message == NOTHING_PAID
            ended = env.bridge._settler.approvals.ended(parked.id)
            assert ended is not None
            assert ended.outcome == "withdrawn"
            assert env.payer.calls == []
            assert env.bridge.spend_log().entries == ()
            assert env.executions == {}


async def test_a_stop_lets_a_payment_in_flight_complete_and_says_it_was_paid(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with hosted(tmp_path, fixture_settings()) as env:
            release = anyio.Event()

            async def slow_tip(payee: str, atoms: int) -> None:
                await release.wait()
                await env.payer.credit(payee, atoms)

            env.payer.behaviour = slow_tip
            errors: list[MCPError] = []
            async with env.session() as session, anyio.create_task_group() as tg:
                # A dynamic price: paid after the bot's refusal, not alongside.
                await _call_in_background(tg, session, "dyn", errors)
                await env.payer.entered.wait()
                env.close.set()
                await until(lambda: env.bridge.closed)
                release.set()
                await env.closed.wait()
                await until(lambda: bool(errors))
            (error,) = errors
            assert error.error.message == (
                f"{STOPPING}; paid 7 atoms for this call (1 payment(s)); credit the bot did not use stays"
                " there for later calls"
            )
            assert [(e.atoms, e.status) for e in env.bridge.spend_log().entries] == [(7, "paid")]
            assert env.executions == {}  # not run for an agent that gets no result


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_ctrl_c_on_the_daemon_answers_the_agent_whose_payment_waits(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """``brmcp-bridge`` stopped (Ctrl-C, or SIGTERM) while an agent's
    payment waits for approval: the agent is told at once that the bridge
    is stopping and nothing was paid, the daemon exits 0 and paid nothing."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with anyio.fail_after(120):
        async with serve_network(tmp_path) as net:
            bot, alice = net.bot, net.alice
            datadir = tmp_path / "bridge"
            prepare_bridge_dir(datadir, alice, bridge_settings(bot.uid, mode="approval"))
            listen = resolve_listen("127.0.0.1:0")
            cmd = [sys.executable, "-m", "brmcp.bridge", "--datadir", str(datadir), "--listen", listen]
            async with await anyio.open_process(cmd, env=env, stderr=subprocess.PIPE) as proc:
                log = bytearray()
                try:
                    assert proc.stderr is not None
                    while b"settings in force" not in log:
                        log.extend(await proc.stderr.receive())
                    errors: list[MCPError] = []
                    async with (
                        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
                        streamable_http_client(f"http://{listen}/mcp/{bot.uid}", http_client=http) as streams,
                        ClientSession(*streams) as session,
                        anyio.create_task_group() as tg,
                    ):
                        await session.initialize()
                        await _call_in_background(tg, session, "fortune", errors)
                        while b"waits for approval" not in log:
                            log.extend(await proc.stderr.receive())
                        proc.send_signal(signum)
                        await until(lambda: bool(errors), 30)
                    (error,) = errors
                    assert error.error.message == NOTHING_PAID
                    assert await proc.wait() == 0
                finally:
                    if proc.returncode is None:
                        proc.kill()
                assert proc.stderr is not None
                with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
                    while True:
                        log.extend(await proc.stderr.receive())
                text = log.decode(errors="replace")
                assert "gave up" not in text
                assert "withdrawn" in text
            tips = [p for m, p in alice.requests if m == "PaymentsService.TipUser"]
            assert tips == []
            assert (
                not (datadir / "mcpspend.json").exists()
                or "fortune" not in (datadir / "mcpspend.json").read_text()
            )
            assert await net.app.harness.balance(alice.uid) == 0
