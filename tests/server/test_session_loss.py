"""A keyed call's run belongs to the harness, not to the BR session it came
on (BRIDGE.md §Failures, "The bot's session is lost during a paid call").

When that session is lost (its brclient cannot send a PM, or the session is
closed) while the call is charged or running, the run goes on: it is
settled and journaled under its callKey, charged once, and the caller's
retry with the same callKey, on any session, gets that result without a
second charge or a second run. A genuine cancel from the peer
(``notifications/cancelled``) still cancels the run and refunds it, and a
harness that stops still ends its runs: cancelled, refunded, journaled.
"""

from __future__ import annotations

import functools
import json
import logging
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import mcp.types as types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from brmcp import Conn
from brmcp.protocol.payment import BALANCE_ATOMS_KEY, CHARGED_ATOMS_KEY, REFUNDED_ATOMS_KEY
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.server.calls import CURRENT_SESSION, Runs, SessionWatch
from brmcp.testing import Fabric
from tests.kit import ALICE, BOT, until
from tests.kit.harness import Served, query, served

PRICE = 500
FUNDS = 1_000
KEY = "c0ffee00" + "k" * 24

#: Where the bot's session is lost: while the call waits for its debit,
#: while the handler runs, or at the PM carrying its response.
Stage = Literal["charging", "running", "responding"]
#: How: brclient refuses an essential PM of that session (a response), or
#: the session is closed (idle expiry, the router dropping it).
How = Literal["send_failed", "closed"]
#: Every (stage, how) that can happen: at the response it is that response's PM.
_LOSSES: list[tuple[Stage, How]] = [
    ("charging", "send_failed"),
    ("charging", "closed"),
    ("running", "send_failed"),
    ("running", "closed"),
    ("responding", "send_failed"),
]


@dataclass
class _Slow:
    """A paid tool that returns once ``finish`` is set; ``runs`` counts its
    executions, ``entered`` is set when one starts."""

    entered: anyio.Event = field(default_factory=anyio.Event)
    finish: anyio.Event = field(default_factory=anyio.Event)
    runs: int = 0

    async def __call__(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        self.runs += 1
        self.entered.set()
        await self.finish.wait()
        return {"done": self.runs, "text": args.get("text")}


def _harness(data_dir: Path, slow: _Slow) -> Harness:
    harness = Harness(HarnessConfig(data_dir=data_dir, allowed_peers={ALICE}))
    harness.add_tool(
        "slow", slow, description="A slow paid tool", input_schema={"type": "object"}, price_atoms=PRICE
    )
    return harness


@asynccontextmanager
async def _session(srv: Served) -> AsyncIterator[tuple[ClientSession, Conn]]:
    """An initialized session from ALICE to the bot, and its client Conn."""
    conn = srv.clients[ALICE].dial(BOT)
    async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=30) as s:
        await s.initialize()
        yield s, conn


def _params(key: str | None) -> Any:
    return None if key is None else {"brmcp/callKey": key}


def _books(data_dir: Path) -> list[tuple[Any, ...]]:
    return query(data_dir, "SELECT kind, atoms, call_key, balance_after FROM movements ORDER BY id")


def _journal(data_dir: Path) -> list[tuple[Any, ...]]:
    return query(data_dir, "SELECT call_key, atoms, state, outcome FROM calls ORDER BY charged_at")


def _text(result: types.CallToolResult) -> str:
    assert len(result.content) == 1, result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def _lose_mid_call(srv: Served, slow: _Slow, stage: Stage, how: How, key: str | None) -> None:
    """ALICE calls ``slow`` and the bot's session of that call is lost at
    ``stage`` in the way ``how``; the caller's call ends with the session
    (it never gets the answer on it). Returns once the loss happened."""
    async with _session(srv) as (s, client_conn):
        bot_conn = srv.router.session(ALICE, client_conn.sid)
        assert bot_conn is not None
        lock: anyio.Lock | None = None
        if stage == "charging":
            # The debit waits in the ledger: the session is lost before it commits.
            lock = anyio.Lock()
            await lock.acquire()
            original = srv.harness._accounts.charge

            async def charge(**kwargs: Any) -> tuple[bool, int]:
                assert lock is not None
                async with lock:
                    return await original(**kwargs)

            srv.harness._accounts.charge = charge  # type: ignore[method-assign]
        failed: list[BaseException] = []

        async def agent_call() -> None:
            try:
                await s.call_tool("slow", {"text": "x"}, meta=_params(key))
            except MCPError as exc:  # the client's session ended under it
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(agent_call)
            if stage == "charging":
                await until(lambda: lock is not None and lock.statistics().tasks_waiting == 1)
            elif stage == "running":
                await slow.entered.wait()
            if stage == "responding":
                # brclient refuses the PM carrying the response.
                srv.fabric.fail_sends(BOT)
                await slow.entered.wait()
                slow.finish.set()
                await until(lambda: bot_conn.closed)
            elif how == "send_failed":
                # brclient refuses the PM of another answer on the same session.
                srv.fabric.fail_sends(BOT)
                tg.start_soon(_ping_quietly, s)
                await until(lambda: bot_conn.closed)
            else:
                bot_conn.close()
            srv.fabric.restore_sends(BOT)
            if lock is not None:
                lock.release()
            # The caller learns nothing more on this session.
            client_conn.close()
        assert failed


async def _ping_quietly(s: ClientSession) -> None:
    """A ping whose answer brclient refuses: it ends with the session."""
    try:
        await s.send_ping()
    except MCPError:
        pass


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loss=st.sampled_from(_LOSSES), retry_while_running=st.booleans())
def test_a_lost_session_never_cancels_a_keyed_paid_call(
    loss: tuple[Stage, How], retry_while_running: bool
) -> None:
    """Wherever the bot's session is lost, and however: the run finishes,
    is charged once and journaled under its callKey with its result (never
    "call cancelled"), and the retry with the same callKey on a new session
    gets that result, to the atom, without a second charge or run."""

    async def scenario(data_dir: Path) -> None:
        slow = _Slow()
        harness = _harness(data_dir, slow)
        with anyio.fail_after(30):
            async with served(harness) as srv:
                await harness.credit(ALICE, FUNDS)
                await _lose_mid_call(srv, slow, *loss, KEY)
                async with _session(srv) as (s, _):
                    retried: list[types.CallToolResult] = []

                    async def retry() -> None:
                        retried.append(await s.call_tool("slow", {"text": "x"}, meta=_params(KEY)))

                    async with anyio.create_task_group() as tg:
                        if retry_while_running:
                            tg.start_soon(retry)
                            await slow.entered.wait()
                        slow.finish.set()
                        if not retry_while_running:
                            await until(lambda: [row[2] for row in _journal(data_dir)][:1] == ["done"])
                            tg.start_soon(retry)
                    result = retried[0]
                assert not result.is_error, result
                assert json.loads(_text(result)) == {"done": 1, "text": "x"}
                assert result.meta is not None
                assert result.meta[CHARGED_ATOMS_KEY] == PRICE
                assert result.meta[BALANCE_ATOMS_KEY] == FUNDS - PRICE
                assert slow.runs == 1
                assert harness.executions == 1
                assert await harness.balance(ALICE) == FUNDS - PRICE
            assert _books(data_dir) == [
                ("credit", FUNDS, None, FUNDS),
                ("charge", -PRICE, KEY, FUNDS - PRICE),
            ]
            [(key, atoms, state, outcome)] = _journal(data_dir)
            assert (key, atoms, state) == (KEY, PRICE, "done")
            assert json.loads(json.loads(outcome)["content"][0]["text"]) == {"done": 1, "text": "x"}

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(scenario, Path(tmp), backend="asyncio")


async def test_the_kept_result_names_brclient_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator reads why the result waits and how it is delivered."""
    slow = _Slow()
    harness = _harness(tmp_path, slow)
    caplog.set_level(logging.INFO, logger="brmcp.server")
    with anyio.fail_after(30):
        async with served(harness) as srv:
            await harness.credit(ALICE, FUNDS)
            await _lose_mid_call(srv, slow, "running", "send_failed", KEY)
            slow.finish.set()
            await until(lambda: _journal(tmp_path)[0][2] == "done")
    wanted = (
        f"result of slow for {ALICE} kept under callKey {KEY[:8]}: brclient unreachable; "
        "a retry with the same callKey gets it"
    )
    assert wanted in caplog.messages


async def test_a_peer_cancel_still_cancels_and_refunds(tmp_path: Path) -> None:
    """notifications/cancelled for the request is a genuine cancel: the run
    stops, the charge is refunded to the atom, and the retry with the same
    callKey replays the refunded "call cancelled" outcome, never running again."""
    slow = _Slow()
    harness = _harness(tmp_path, slow)
    with anyio.fail_after(30):
        async with served(harness) as srv, _session(srv) as (s, _):
            await harness.credit(ALICE, FUNDS)
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(s.call_tool, "slow", {"text": "x"}, meta=_params(KEY)))
                await slow.entered.wait()
                tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled
            await until(lambda: len(_books(tmp_path)) == 3)
            again = await s.call_tool("slow", {"text": "x"}, meta=_params(KEY))
            assert again.is_error
            assert _text(again) == "call cancelled"
            assert again.meta is not None
            assert again.meta[REFUNDED_ATOMS_KEY] == PRICE
            assert slow.runs == 1
    assert _books(tmp_path) == [
        ("credit", FUNDS, None, FUNDS),
        ("charge", -PRICE, KEY, FUNDS - PRICE),
        ("refund", PRICE, KEY, FUNDS),
    ]


async def test_an_unkeyed_paid_call_of_a_lost_session_is_refunded(tmp_path: Path) -> None:
    """Without a callKey no retry can fetch the result: the run is
    cancelled and refunded, so nobody pays for a result they cannot get."""
    slow = _Slow()
    harness = _harness(tmp_path, slow)
    with anyio.fail_after(30):
        async with served(harness) as srv:
            await harness.credit(ALICE, FUNDS)
            await _lose_mid_call(srv, slow, "running", "closed", None)
            await until(lambda: len(_books(tmp_path)) == 3)
            assert await harness.balance(ALICE) == FUNDS
    assert [row[:2] for row in _books(tmp_path)] == [("credit", FUNDS), ("charge", -PRICE), ("refund", PRICE)]


async def test_a_stopping_harness_ends_the_runs_of_lost_sessions(tmp_path: Path) -> None:
    """A run kept going after its session was lost ends when the harness
    stops: cancelled, refunded to the atom and journaled, so the caller's
    retry after the restart gets the refunded outcome and nothing runs twice."""
    slow = _Slow()
    with anyio.fail_after(30):
        async with served(_harness(tmp_path, slow)) as srv:
            await srv.harness.credit(ALICE, FUNDS)
            await _lose_mid_call(srv, slow, "running", "closed", KEY)
            assert slow.runs == 1
        assert _books(tmp_path) == [
            ("credit", FUNDS, None, FUNDS),
            ("charge", -PRICE, KEY, FUNDS - PRICE),
            ("refund", PRICE, KEY, FUNDS),
        ]
        async with served(_harness(tmp_path, slow)) as srv, _session(srv) as (s, _):
            again = await s.call_tool("slow", {"text": "x"}, meta=_params(KEY))
            assert again.is_error
            assert _text(again) == "call cancelled"
            assert slow.runs == 1
            assert await srv.harness.balance(ALICE) == FUNDS


@pytest.mark.parametrize("peer_cancelled", [False, True], ids=["session-lost", "peer-cancel-then-lost"])
async def test_only_a_lost_session_without_a_peer_cancel_keeps_the_run(peer_cancelled: bool) -> None:
    """The rule itself (brmcp/server/calls/_runs.py): a caller cancelled because its
    session closed leaves the run going; when the peer had sent
    notifications/cancelled for that request, the run is cancelled even if
    the session closed too, and the caller waits for it to end."""
    async with Fabric() as fabric, fabric.router(BOT) as router:
        conn = router.dial(ALICE)
        watch = SessionWatch(conn)
        runs = Runs()
        finish = anyio.Event()
        ended: list[str] = []

        async def work() -> types.CallToolResult:
            try:
                await finish.wait()
            except BaseException:
                ended.append("cancelled")
                raise
            ended.append("finished")
            return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])

        async with anyio.create_task_group() as tasks:
            runs.bind(tasks)
            token = CURRENT_SESSION.set(watch)
            try:
                async with anyio.create_task_group() as caller:

                    async def wait_for_it() -> None:
                        await runs.run(
                            work, tool="slow", peer=ALICE, call_key=KEY, request_id=7, settled=lambda: None
                        )

                    caller.start_soon(wait_for_it)
                    await anyio.wait_all_tasks_blocked()
                    if peer_cancelled:
                        note = types.JSONRPCNotification(
                            jsonrpc="2.0", method="notifications/cancelled", params={"requestId": "7"}
                        )
                        watch._inbound(SessionMessage(note))
                    conn.close()
                    caller.cancel_scope.cancel()
            finally:
                CURRENT_SESSION.reset(token)
            if peer_cancelled:
                # Cancelled and joined before the caller's cancellation went on.
                assert ended == ["cancelled"]
                assert runs.kept == 0
            else:
                assert ended == []
                assert runs.kept == 1
                finish.set()
                await until(lambda: ended == ["finished"])
