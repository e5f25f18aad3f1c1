"""brmcp-serve stops without dropping answers (README §Running the daemons
as services): on SIGINT/SIGTERM, or :meth:`ServeApp.stop`, the bot takes no
new PMs (they stay unacked in brclient for the next start, nothing charged),
answers the requests in flight within the grace, hands every answer to
brclient, then cancels the rest (a paid call cut off is refunded); a second
signal stops at once. The books are read from the ledger file after the app
stopped. Last, the router's accounting of the requests in flight that the
drain waits on."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from mcp.shared.message import SessionMessage
from mcp.types import CallToolResult, JSONRPCResponse

from brmcp import Conn, ManualClock, Router, RouterOptions, wire
from brmcp.serve import ServeApp
from brmcp.serve.app import STOP_GRACE, DrainReport
from brmcp.server import CallContext, store
from brmcp.testing.fakebr import KIND_PM, FakeBRClient
from tests.kit.clientrpc import FAST, fake_network
from tests.kit.serve import Caller, caller_on, prepare_serve_dir, until

PRICE = 1_000
FUNDS = 5_000
KEY = "0123456789abcdef0123456789abcdef"
OTHER_KEY = "fedcba9876543210fedcba9876543210"


@dataclass
class SlowTool:
    """A paid tool whose calls wait for :attr:`release` (``entered`` counts them)."""

    release: anyio.Event = field(default_factory=anyio.Event)
    started: list[str] = field(default_factory=list)
    entered: anyio.Event = field(default_factory=anyio.Event)

    async def handler(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        self.started.append(ctx.call_key or "")
        self.entered.set()
        await self.release.wait()
        return {"done": True}


@dataclass
class Served:
    bot: FakeBRClient
    alice: FakeBRClient
    app: ServeApp
    datadir: Path
    slow: SlowTool
    #: Set once ``app.run`` returned (the harness and its ledger closed).
    done: anyio.Event


@contextlib.asynccontextmanager
async def served(tmp_path: Path, *, handle_signals: bool = False) -> AsyncIterator[Served]:
    """The serve app on a fake brclient ``bot`` with caller ``alice``
    allowed and funded with FUNDS atoms, and the paid tool ``slow``."""
    async with fake_network(tmp_path / "br", "bot", "alice") as (_, (bot, alice)):
        datadir = tmp_path / "serve"
        prepare_serve_dir(datadir, bot, [alice.uid])
        app = ServeApp.from_datadir(datadir, client_options=FAST)
        slow = SlowTool()
        app.harness.add_tool(
            "slow",
            slow.handler,
            description="waits to be released",
            input_schema={"type": "object"},
            price_atoms=PRICE,
        )
        done = anyio.Event()

        async def run() -> None:
            try:
                await app.run(handle_signals=handle_signals)
            finally:
                done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await until(lambda: app.router is not None)
            await app.client.wait_connected()
            await app.harness.credit(alice.uid, FUNDS)
            yield Served(bot, alice, app, datadir, slow, done)
            tg.cancel_scope.cancel()


def books(datadir: Path, peer: str) -> tuple[int, list[tuple[str, int]], int]:
    """``(balance, [(kind, atoms)], calls left charged)`` from the ledger file."""
    conn = store.open_database(datadir)
    try:
        return (
            store.ledger.balance(conn, peer),
            [(e.kind, e.atoms) for e in store.ledger.statement(conn, peer)],
            len(store.journal.interrupted(conn)),
        )
    finally:
        conn.close()


async def call_into(
    caller: Caller, bot_uid: str, key: str, results: list[CallToolResult], opened: anyio.Event
) -> None:
    """Open a session to the bot, call ``slow`` with ``key`` and keep the answer."""
    async with caller.session(bot_uid) as s:
        await s.initialize()
        await s.list_tools()  # the SDK checks results against the listed tools
        opened.set()
        results.append(await s.call_tool("slow", {}, meta={"brmcp/callKey": key}))


async def test_a_paid_call_finishing_as_the_stop_begins_is_answered(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with served(tmp_path) as env, caller_on(env.alice) as alice:
            results: list[CallToolResult] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(call_into, alice, env.bot.uid, KEY, results, anyio.Event())
                await env.slow.entered.wait()
                # The call returns at the very moment the stop begins: its
                # answer is neither written nor handed to brclient yet.
                env.slow.release.set()
                report = await env.app.stop(timer=ManualClock())
            await env.done.wait()
    assert report is not None
    assert (report.answered, report.cut, report.parts_left, report.pms_held) == (1, 0, 0, 0)
    assert report.pms_flushed >= 1
    [result] = results
    assert not result.is_error
    assert result.structured_content == {"done": True}
    assert result.meta is not None
    assert result.meta["brmcp/chargedAtoms"] == PRICE
    assert books(env.datadir, env.alice.uid) == (FUNDS - PRICE, [("credit", FUNDS), ("charge", -PRICE)], 0)


async def test_a_call_running_past_the_grace_is_cancelled_and_refunded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="brmcp.serve")
    clock = ManualClock()
    reports: list[DrainReport | None] = []
    with anyio.fail_after(60):
        async with served(tmp_path) as env, caller_on(env.alice) as alice:
            router = env.app.router
            assert router is not None
            async with anyio.create_task_group() as tg:
                tg.start_soon(call_into, alice, env.bot.uid, KEY, [], anyio.Event())
                await env.slow.entered.wait()

                async def stop() -> None:
                    reports.append(await env.app.stop(timer=clock, grace=7.0))

                tg.start_soon(stop)
                await until(lambda: clock.sleepers == 1)  # the grace runs
                assert router.intake_stopped
                assert router.pending_requests == 1
                clock.advance(6.9)
                assert not reports
                clock.advance(0.1)
                await env.done.wait()
                tg.cancel_scope.cancel()  # the caller: its call gets no answer
    [report] = reports
    assert report is not None
    assert (report.answered, report.cut) == (0, 1)
    # Refunded by the stop itself, to the atom: nothing left for the next start.
    assert books(env.datadir, env.alice.uid) == (
        FUNDS,
        [("credit", FUNDS), ("charge", -PRICE), ("refund", PRICE)],
        0,
    )
    drained = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopping: drained")]
    assert len(drained) == 1
    assert "0 request(s) in flight answered, 1 cut off after the 7 s grace" in drained[0]


@pytest.mark.paced  # counts PMs: the batching depends on the real pacing
async def test_a_call_arriving_during_the_drain_is_not_started_nor_charged(tmp_path: Path) -> None:
    clock = ManualClock()
    late: list[CallToolResult] = []
    with anyio.fail_after(60):
        async with served(tmp_path) as env, caller_on(env.alice) as alice:
            router = env.app.router
            assert router is not None
            first: list[CallToolResult] = []
            reports: list[DrainReport | None] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(call_into, alice, env.bot.uid, KEY, first, anyio.Event())
                await env.slow.entered.wait()
                # The second session is open before the stop; its call comes during it.
                opened = anyio.Event()
                async with anyio.create_task_group() as second:
                    second.start_soon(call_into, alice, env.bot.uid, OTHER_KEY, late, opened)
                    await opened.wait()

                    async def stop() -> None:
                        reports.append(await env.app.stop(timer=clock))

                    tg.start_soon(stop)
                    await until(lambda: router.intake_stopped)
                    held = len(env.bot.logs[KIND_PM].after(0))
                    await until(lambda: router.stats.pms_held >= 1)  # the new call's PM, left unread
                    assert len(env.bot.logs[KIND_PM].after(0)) > held  # and unacked in brclient
                    env.slow.release.set()
                    await env.done.wait()
                    second.cancel_scope.cancel()
            unread = [pm for pm in env.bot.logs[KIND_PM].after(0) if pm.uid == env.alice.uid]
    [report] = reports
    assert report is not None
    assert (report.answered, report.cut) == (1, 0)
    assert report.pms_held >= 1
    assert unread  # brclient replays them to the next start
    [answered] = first
    assert answered.structured_content == {"done": True}
    assert late == []
    assert env.slow.started == [KEY]  # the late call never started
    assert env.app.harness.executions == 1
    # Charged once, for the call in flight only.
    assert books(env.datadir, env.alice.uid) == (FUNDS - PRICE, [("credit", FUNDS), ("charge", -PRICE)], 0)


async def test_sigterm_drains_and_a_second_one_stops_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="brmcp.serve")
    with anyio.fail_after(60):
        async with served(tmp_path, handle_signals=True) as env, caller_on(env.alice) as alice:
            router = env.app.router
            assert router is not None
            async with anyio.create_task_group() as tg:
                tg.start_soon(call_into, alice, env.bot.uid, KEY, [], anyio.Event())
                await env.slow.entered.wait()
                os.kill(os.getpid(), signal.SIGTERM)
                await until(lambda: router.intake_stopped)  # draining, for up to STOP_GRACE
                assert not env.done.is_set()
                os.kill(os.getpid(), signal.SIGTERM)
                await env.done.wait()
                tg.cancel_scope.cancel()
    messages = [r.getMessage() for r in caplog.records]
    assert "SIGTERM: stopping" in messages
    assert (
        f"answering the requests in flight first (for at most {STOP_GRACE:g} s; send SIGTERM again to stop "
        "at once)" in messages
    )
    assert "SIGTERM again: stopping at once" in caplog.text
    assert "stopping: drained" not in caplog.text
    # Cancelled at once, and refunded by this process.
    assert books(env.datadir, env.alice.uid) == (
        FUNDS,
        [("credit", FUNDS), ("charge", -PRICE), ("refund", PRICE)],
        0,
    )


async def test_sigterm_answers_the_call_in_flight_then_stops(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with served(tmp_path, handle_signals=True) as env, caller_on(env.alice) as alice:
            router = env.app.router
            assert router is not None
            results: list[CallToolResult] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(call_into, alice, env.bot.uid, KEY, results, anyio.Event())
                await env.slow.entered.wait()
                os.kill(os.getpid(), signal.SIGTERM)
                await until(lambda: router.intake_stopped)
                env.slow.release.set()
                await env.done.wait()
    [result] = results
    assert result.structured_content == {"done": True}
    assert books(env.datadir, env.alice.uid) == (FUNDS - PRICE, [("credit", FUNDS), ("charge", -PRICE)], 0)


async def test_stop_when_not_running_does_nothing(tmp_path: Path) -> None:
    async with fake_network(tmp_path / "br", "bot", "alice") as (_, (bot, alice)):
        datadir = tmp_path / "serve"
        prepare_serve_dir(datadir, bot, [alice.uid])
        app = ServeApp.from_datadir(datadir, client_options=FAST)
        assert await app.stop() is None
        app.stop_now()
        async with anyio.create_task_group() as tg:
            await tg.start(partial(app.run))
            await app.client.wait_connected()
            report = await app.stop(timer=ManualClock())
        assert report is not None
        assert (report.answered, report.cut, report.pms_flushed, report.parts_left) == (0, 0, 0, 0)
        assert await app.stop() is None  # stopped: nothing to do


# -- the router's accounting of requests in flight -----------------------------------------

PEER = "ab" * 32
SID = "0123456789abcdef"


class Recorded:
    """A PMSender keeping every PM handed to it."""

    def __init__(self) -> None:
        self.pms: list[tuple[str, str]] = []

    async def send_pm(self, peer: str, text: str) -> None:
        self.pms.append((peer, text))


def envelope(message: dict[str, Any]) -> str:
    [part] = wire.encode(json.dumps(message).encode(), sid=SID, exp=int(time.time()) + 600)
    return part


def request(rid: int | str) -> str:
    return envelope({"jsonrpc": "2.0", "id": rid, "method": "tools/list"})


async def test_the_router_counts_requests_until_answered_cancelled_or_closed() -> None:
    sender = Recorded()

    async def accept(conn: Conn) -> None:
        await anyio.sleep_forever()  # reads nothing: the requests wait in the inbox

    async with Router(sender, accept=accept, options=RouterOptions(pm_interval=0)) as router:
        await router.requests_answered()  # none pending: at once
        for rid in (1, 1, "2", 3):  # a reused id is two requests
            router.handle_pm(PEER, request(rid))
        router.handle_pm(PEER, envelope({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        assert router.pending_requests == 4
        conn = router.session(PEER, SID)
        assert conn is not None

        async def answer(rid: int | str) -> None:
            response = JSONRPCResponse(jsonrpc="2.0", id=rid, result={})
            await conn.write_stream.send(SessionMessage(response))

        await answer(1)
        assert (router.pending_requests, router.stats.requests_answered) == (3, 1)
        await answer(2)  # "2" and 2 are one id, as the SDK correlates them
        await answer(99)  # never asked: not counted
        assert (router.pending_requests, router.stats.requests_answered) == (2, 2)
        # The SDK never answers a request its peer cancelled.
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "3"}}
        router.handle_pm(PEER, envelope(cancel))
        assert router.pending_requests == 1
        assert len(sender.pms) == 3
        await router.outbox_drained()
        assert router.outbox_waiting() == 0

        # Intake stopped: a new request is ignored, never pending.
        router.stop_intake()
        assert router.intake_stopped
        ignored = router.stats.pms_ignored
        router.handle_pm(PEER, request(7))
        assert router.stats.pms_ignored == ignored + 1
        assert router.pending_requests == 1

        async with anyio.create_task_group() as tg:
            done = anyio.Event()

            async def wait() -> None:
                await router.requests_answered()
                done.set()

            tg.start_soon(wait)
            await anyio.lowlevel.checkpoint()
            assert not done.is_set()
            conn.close()  # what is left can no longer be answered
            await done.wait()
        assert (router.pending_requests, router.stats.requests_answered) == (0, 2)
