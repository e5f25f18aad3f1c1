"""A bot restarted with other tools, without telling the bridge.

The bridge keeps one BR session and a tools snapshot per bot. A bot that
restarts (a new brmcp-serve, a gateway with another upstream) forgets that
session and sends no ``notifications/tools/list_changed``. A tool that is not
in the snapshot must then be looked up at the bot before it is refused, and a
tool the bot says it does not know must not stay listed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from brmcp.bridge.links import SNAPSHOT_DIR
from brmcp.server import CallContext, Harness, HarnessConfig
from tests.kit.bridge import BOT, CLIENT, Env, bridge_env, call, joined, until


def _restarted_bot(data_dir: Path) -> Harness:
    """The bot after a restart: ``free`` is gone, ``newer`` (free) and
    ``pricy`` (300 atoms) are new; ``paid`` is still there."""
    harness = Harness(HarnessConfig(data_dir=str(data_dir), allowed_peers={CLIENT}))

    async def newer(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"newer": True}

    async def pricy(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"pricy": True}

    async def paid(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"n": 0}

    harness.add_tool("newer", newer, description="new", input_schema={"type": "object"})
    harness.add_tool(
        "pricy", pricy, description="new, paid", input_schema={"type": "object"}, price_atoms=300
    )
    harness.add_tool(
        "paid", paid, description="A paid tool", input_schema={"type": "object"}, price_atoms=500
    )
    return harness


async def _serve(env: Env, restarted: Harness) -> None:
    router = await restarted.start(env.fabric.sender(BOT))
    env.fabric.attach(BOT, router.handle_pm)


async def test_tool_added_by_a_bot_restart_is_reachable(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env, env.session() as session:
            listed = {t.name for t in (await session.list_tools()).tools}
            assert "free" in listed
            assert "newer" not in listed
            assert (await call(session, "free")).is_error is False
            # The bot restarts with other tools under the same uid (the old
            # harness no longer receives anything).
            async with _restarted_bot(tmp_path / "bot-restarted") as restarted:
                await _serve(env, restarted)
                env.payer.harness = restarted

                result = await call(session, "newer")
                assert not result.is_error
                assert result.structured_content == {"newer": True}
                listed = {t.name for t in (await session.list_tools()).tools}
                assert {"newer", "pricy", "paid"} <= listed
                assert "free" not in listed
                # A paid new tool goes through the payment loop as any other.
                result = await call(session, "pricy")
                assert not result.is_error
                assert result.structured_content == {"pricy": True}
                assert env.payer.calls == [(BOT, 300)]
                assert await restarted.balance(CLIENT) == 0


async def test_tool_removed_by_a_bot_restart_is_unlisted(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env, env.session() as session:
            assert "free" in {t.name for t in (await session.list_tools()).tools}
            async with _restarted_bot(tmp_path / "bot-restarted") as restarted:
                await _serve(env, restarted)

                with pytest.raises(MCPError, match='unknown tool "free"'):
                    await call(session, "free")
                listed = {t.name for t in (await session.list_tools()).tools}
                assert "free" not in listed
                assert "newer" in listed


async def test_unknown_tool_is_still_refused(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env, env.session() as session:
            await session.list_tools()
            link = env.bridge.link(BOT)
            assert link is not None
            before = link.refreshes
            for _ in range(3):
                with pytest.raises(MCPError, match='unknown tool "nope"'):
                    await call(session, "nope")
            # One look-up at the bot for the three (RECHECK_INTERVAL).
            assert link.refreshes == before + 1
            assert env.executions == {}


async def test_remembered_snapshot_after_both_restart(tmp_path: Path) -> None:
    """The bridge restarts with the snapshot it saved, and the bot
    meanwhile restarted with other tools: a call to a new tool is looked up
    at the bot, not refused from the remembered list."""
    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env:
            async with env.session() as session:
                assert "newer" not in {t.name for t in (await session.list_tools()).tools}
                assert not (await call(session, "free")).is_error
            saved = env.data_dir / SNAPSHOT_DIR / f"{BOT}.json"
            await until(saved.exists)
            await env.bridge.close()
            async with _restarted_bot(tmp_path / "bot-restarted") as restarted:
                await _serve(env, restarted)
                bridge = env.new_bridge(listen="127.0.0.1:0")
                env.fabric.attach(CLIENT, bridge.handle_pm)
                await bridge.start()
                try:
                    address = bridge.listen_address
                    assert address is not None
                    url = f"http://{address[0]}:{address[1]}/mcp/{BOT}"
                    async with env.session(url=url) as session:
                        result = await call(session, "newer")
                        assert not result.is_error
                        assert result.structured_content == {"newer": True}
                        listed = {t.name for t in (await session.list_tools()).tools}
                        assert "newer" in listed
                        assert "free" not in listed
                finally:
                    await bridge.close()


async def test_agent_that_only_lists_sees_a_restarted_bots_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that never calls (so no call fails and nothing is doubted)
    still learns the restarted bot's tools: a snapshot older than
    SNAPSHOT_MAX_AGE is served and checked in the background, and the agent
    gets notifications/tools/list_changed when it differed."""
    import brmcp.bridge.links._toolsnap as toolsnap_module  # where the tools snapshot reads them

    monkeypatch.setattr(toolsnap_module, "SNAPSHOT_MAX_AGE", 3600.0)
    monkeypatch.setattr(toolsnap_module, "REFRESH_DELAY", 0.01)
    changes: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            changes.append(message.method)

    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env, env.session(message_handler=on_message) as session:
            listed = {t.name for t in (await session.list_tools()).tools}
            assert "free" in listed
            link = env.bridge.link(BOT)
            assert link is not None
            async with _restarted_bot(tmp_path / "bot-restarted") as restarted:
                await _serve(env, restarted)
                # Young snapshot: served, nothing asked of the bot.
                before = link.refreshes
                assert "free" in {t.name for t in (await session.list_tools()).tools}
                assert link.refreshes == before
                # The snapshot ages past the bound (rather than the test
                # waiting for it to).
                monkeypatch.setattr(toolsnap_module, "SNAPSHOT_MAX_AGE", 0.0)
                # Old snapshot: still served at once, checked behind it.
                assert "free" in {t.name for t in (await session.list_tools()).tools}
                await until(lambda: "notifications/tools/list_changed" in changes)
                listed = {t.name for t in (await session.list_tools()).tools}
                assert "newer" in listed
                assert "free" not in listed


def _program(data_dir: Path, executions: dict[str, int], **prices: int) -> Harness:
    """A bot program that declares tool list changes (brmcp-serve selling an
    upstream, in the user's case), so the bridge reaches it in the handshake
    era, with one tool per keyword: its price in atoms (0: free). A tool
    answers ``{"tool": <name>}``."""
    harness = Harness(HarnessConfig(data_dir=str(data_dir), allowed_peers={CLIENT}, tools_list_changed=True))
    for name, price in prices.items():

        async def handler(ctx: CallContext, args: dict[str, Any], name: str = name) -> dict[str, Any]:
            executions[name] = executions.get(name, 0) + 1
            return {"tool": name}

        harness.add_tool(name, handler, description=name, input_schema={"type": "object"}, price_atoms=price)
    return harness


@contextlib.asynccontextmanager
async def _swapped(
    tmp_path: Path, **prices: int
) -> AsyncIterator[tuple[Env, ClientSession, dict[str, int], list[str]]]:
    """An agent session through the bridge to a first program at BOT
    (``echo``, free, in the handshake era) that is then replaced by another
    program on the same identity serving ``prices``; yields the fixture,
    the agent's session, the second program's executions and the
    notifications the agent got."""
    changes: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ServerNotification):
            changes.append(message.method)

    second: dict[str, int] = {}
    async with bridge_env(tmp_path) as env, _program(tmp_path / "first", {}, echo=0) as first:
        await _serve(env, first)
        async with env.session(message_handler=on_message) as session:
            assert {t.name for t in (await session.list_tools()).tools} == {"echo"}
            assert not (await call(session, "echo")).is_error
            link = env.bridge.link(BOT)
            assert link is not None
            assert link.era == "handshake"
            # The first program stops receiving; the second answers at BOT.
            async with _program(tmp_path / "second", second, **prices) as swapped:
                await _serve(env, swapped)
                env.payer.harness = swapped
                yield env, session, second, changes


async def test_a_bot_swapped_behind_a_handshake_session_is_asked_on_a_fresh_one(tmp_path: Path) -> None:
    """The user runs another bot program on the bot's identity. The bridge
    had a handshake-era session with the first program, which the second
    does not know (its SDK refuses a request before initialize). A call to
    a tool the snapshot lacks asks the bot for its list on a fresh session,
    and runs, instead of being refused as unknown without the bot's list."""
    with anyio.fail_after(60):
        async with _swapped(tmp_path, get_current_time=0, convert_time=300) as (
            env,
            session,
            second,
            changes,
        ):
            result = await call(session, "get_current_time")
            assert not result.is_error, joined(result)
            assert result.structured_content == {"tool": "get_current_time"}
            assert second == {"get_current_time": 1}
            # The agents that listed hear that the list changed, with its prices.
            await until(lambda: "notifications/tools/list_changed" in changes)
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert set(tools) == {"get_current_time", "convert_time"}
            assert tools["convert_time"].meta == {"brmcp/priceAtoms": 300}
            assert env.payer.calls == []


async def test_a_priced_tool_the_bot_lists_only_now_is_not_paid_for_unseen(tmp_path: Path) -> None:
    """A call to a tool with a price that the bot lists only since the swap:
    no agent was shown that price, so nothing is sent or paid and the agent
    is told the price and to list again; after it lists, the call pays
    within the listed price."""
    with anyio.fail_after(60):
        async with _swapped(tmp_path, get_current_time=0, convert_time=300) as (
            env,
            session,
            second,
            changes,
        ):
            with pytest.raises(MCPError) as refused:
                await call(session, "convert_time")
            assert refused.value.error.code == types.INVALID_PARAMS
            assert refused.value.error.message == (
                'tool "convert_time" was not in the tool list this bridge served; the bot lists it now '
                "(listed at 300 atoms per call). Nothing was sent to the bot or paid: list the tools "
                "again (tools/list) to see it and its price, then call it"
            )
            assert second == {}
            assert env.payer.calls == []
            await until(lambda: "notifications/tools/list_changed" in changes)
            assert "convert_time" in {t.name for t in (await session.list_tools()).tools}
            result = await call(session, "convert_time")
            assert not result.is_error, joined(result)
            assert second == {"convert_time": 1}
            assert env.payer.calls == [(BOT, 300)]


def _slow_program(data_dir: Path, gate: anyio.Event | None, runs: list[str], price: int) -> Harness:
    """A handshake-era bot with ``slow`` (``price`` atoms) that, with a
    ``gate``, holds each call until the gate is set."""
    harness = Harness(HarnessConfig(data_dir=str(data_dir), allowed_peers={CLIENT}, tools_list_changed=True))

    async def slow(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        runs.append(data_dir.name)
        if gate is not None:
            await gate.wait()
        return {"served by": data_dir.name}

    harness.add_tool("slow", slow, description="slow", input_schema={"type": "object"}, price_atoms=price)
    return harness


async def test_stale_copies_answered_by_a_restarted_bot_do_not_fail_the_call(tmp_path: Path) -> None:
    """Calls in flight when the bot goes offline: the bridge's re-sends wait
    at the relay, all on the old session. The restarted bot answers each
    stale copy with the SDK's before-initialize error. The first sends the
    call to a fresh session; the others, answers for a session the bridge
    already dropped, must not end the call as a bot error."""
    runs: list[str] = []
    with anyio.fail_after(120):
        async with (
            bridge_env(tmp_path) as env,
            _slow_program(tmp_path / "first", anyio.Event(), runs, 0) as first,
        ):
            await _serve(env, first)
            async with env.session() as session:
                await session.list_tools()
                results: list[tuple[bool, str]] = []

                async def one() -> None:
                    result = await call(session, "slow")
                    results.append((bool(result.is_error), joined(result)))

                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(one)
                    await until(lambda: len(runs) == 3)
                    env.fabric.set_offline(BOT)
                    # Re-sends pile up at the relay while the bot is away:
                    # at least two stale copies of each call.
                    await until(lambda: env.fabric.stats.pms_stored >= 6, 60)
                    async with _slow_program(tmp_path / "second", None, runs, 0) as second:
                        await _serve(env, second)
                        env.fabric.set_online(BOT)
                        await until(lambda: len(results) == 3, 60)
            assert results == [(False, '{"served by":"second"}')] * 3, results
