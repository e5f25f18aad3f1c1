"""brmcp-serve and brmcp-bridge as subprocesses on two real clients (brnet),
with the official MCP SDK client as the agent: tools/list, a free call, paid
calls (one, then several at once), the bot offline and back, a whole brnet
restart under the running daemons, a payee without a wallet, and results of
several MiB. After each: tips paid = credits at the bot = charges + balance,
to the atom, and the bridge's spend log agrees."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types import CallToolResult

from brmcp.testing.brnet import BrNet

from .stack import FORTUNE_ATOMS, agent, real_stack

pytestmark = [pytest.mark.realnet, pytest.mark.slow]


def payload(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result
    assert result.structured_content is not None, result
    return result.structured_content


async def test_list_free_paid_and_concurrent_paid_calls(
    brnet_factory: Callable[..., BrNet], tmp_path: Path
) -> None:
    async with real_stack(brnet_factory, tmp_path) as st:
        with anyio.fail_after(240):
            async with agent(st.url) as s:
                tools = {t.name: t for t in (await s.list_tools()).tools}
                assert set(tools) == {"echo", "fortune"}
                assert tools["fortune"].meta == {"brmcp/priceAtoms": FORTUNE_ATOMS}
                assert payload(await s.call_tool("echo", {"text": "héllo"})) == {"echo": "héllo"}
                books = await st.settled_books()
                books.check()
                assert books.tips_paid == 0

                assert "fortune" in payload(await s.call_tool("fortune", {}))
                books = await st.settled_books()
                books.check()
                assert (books.tips_paid, books.charges, books.balance) == (FORTUNE_ATOMS, FORTUNE_ATOMS, 0)

                results: list[CallToolResult] = []

                async def one() -> None:
                    results.append(await s.call_tool("fortune", {}))

                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(one)
                assert all("fortune" in payload(r) for r in results)
                books = await st.settled_books()
                books.check()
                # Four fortunes charged; every atom tipped was charged or is still owed.
                assert books.charges == 4 * FORTUNE_ATOMS
                assert books.tips_paid >= 4 * FORTUNE_ATOMS


def _connected(net: BrNet, nick: str) -> bool:
    """Whether brnet reports ``nick``'s client as holding a relay session."""
    users = {u["nick"]: u for u in net.status()["users"]}
    return bool(users[nick].get("connected"))


def _stored(directory: Path) -> set[str]:
    """The routed messages the relay holds (file names) in ``directory``."""
    return {p.name for p in directory.iterdir() if p.is_file()} if directory.is_dir() else set()


async def _until(condition: Callable[[], bool], what: str, limit: float = 120.0) -> None:
    """Poll ``condition`` (in a thread: it may do blocking I/O) until true;
    fail naming ``what`` after ``limit`` seconds."""
    with anyio.move_on_after(limit):
        while True:
            if await anyio.to_thread.run_sync(condition):
                return
            await anyio.sleep(0.1)
    raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}")


async def test_bot_offline_and_back(brnet_factory: Callable[..., BrNet], tmp_path: Path) -> None:
    async with real_stack(brnet_factory, tmp_path) as st:
        with anyio.fail_after(240):
            async with agent(st.url) as s:
                assert payload(await s.call_tool("echo", {"text": "before"})) == {"echo": "before"}
                await anyio.to_thread.run_sync(st.net.offline, "bot")
                await _until(lambda: not _connected(st.net, "bot"), "the bot to leave the relay")
                held = st.net.root / "relay" / "routedmessages"
                before = _stored(held)
                got: dict[str, CallToolResult] = {}

                async def call() -> None:
                    got["paid"] = await s.call_tool("fortune", {})

                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    # The relay stores the request for the absent bot (one file per
                    # routed message, removed once its receiver acks it).
                    await _until(lambda: bool(_stored(held) - before), "the relay to hold the request")
                    assert "paid" not in got  # the relay holds the PM while the bot is away
                    await anyio.to_thread.run_sync(st.net.online, "bot")
                assert "fortune" in payload(got["paid"])
                books = await st.settled_books()
                books.check()
                assert books.charges == FORTUNE_ATOMS


async def test_brnet_restart_under_running_daemons(
    brnet_factory: Callable[..., BrNet], tmp_path: Path
) -> None:
    async with real_stack(brnet_factory, tmp_path) as st:
        with anyio.fail_after(300):
            async with agent(st.url) as s:
                assert "fortune" in payload(await s.call_tool("fortune", {}))
            (await st.settled_books()).check()
            await anyio.to_thread.run_sync(st.net.restart)
            # Same uids and clientrpc ports: the daemons reconnect on their own,
            # and the first call after it succeeds.
            async with agent(st.url) as s:
                first = await s.call_tool("echo", {"text": "after"})
                assert payload(first) == {"echo": "after"}
                assert "fortune" in payload(await s.call_tool("fortune", {}))
            books = await st.settled_books()
            books.check()
            assert books.charges == 2 * FORTUNE_ATOMS


async def test_first_call_after_brclient_restart_succeeds(
    brnet_factory: Callable[..., BrNet], tmp_path: Path
) -> None:
    async with real_stack(brnet_factory, tmp_path) as st:
        with anyio.fail_after(240):
            async with agent(st.url) as s:
                assert payload(await s.call_tool("echo", {"text": "one"})) == {"echo": "one"}
                await anyio.to_thread.run_sync(st.net.restart_user, "alice")
                # The bridge's own brclient restarted: the first call succeeds.
                result = await s.call_tool("echo", {"text": "two"})
                assert payload(result) == {"echo": "two"}
            (await st.settled_books()).check()


async def test_payee_without_wallet_fails_the_paid_call_promptly(
    brnet_factory: Callable[..., BrNet], tmp_path: Path
) -> None:
    async with real_stack(brnet_factory, tmp_path, net_options={"nowallet": ("bot",)}) as st:
        async with agent(st.url) as s:
            free = await s.call_tool("echo", {"text": "free still works"})
            assert payload(free) == {"echo": "free still works"}
            # The first TipProgress already says the tip cannot complete: the
            # call fails well before the bridge's 180 s tip wait, and before
            # the bot's 30 s hold of a call paid alongside (WIRE.md §Pay alongside).
            with anyio.fail_after(25):
                result = await s.call_tool("fortune", {})
            assert result.is_error
            text = json.dumps([c.model_dump() for c in result.content])
            assert "tip" in text.lower()
            assert "payment not made" in text
        books = st.books()
        # No atom moved: the bot credited nothing and charged nothing.
        assert (books.tips_paid, books.credited, books.charges, books.balance) == (0, 0, 0, 0)
        assert books.spend_paid == 0
        # brclient retries the tip later, so it may still land: the spend stays
        # pending and counted against the day cap (BRIDGE.md §Failures).
        assert books.spend_pending == 1
        assert books.spend_statuses == ["pending"]


async def test_large_results_of_several_mib(brnet_factory: Callable[..., BrNet], tmp_path: Path) -> None:
    async with real_stack(brnet_factory, tmp_path) as st:
        with anyio.fail_after(300):
            async with agent(st.url, read_timeout=300, max_sse_event_size=16 * 1024 * 1024) as s:
                # 3 MiB of incompressible text each way (the bridge takes request
                # bodies up to 4 MiB): dozens of PMs in both directions.
                text = base64.b64encode(os.urandom(9 * 256 * 1024)).decode()
                assert payload(await s.call_tool("echo", {"text": text})) == {"echo": text}
                assert "fortune" in payload(await s.call_tool("fortune", {}))
            books = await st.settled_books()
            books.check()
            assert books.charges == FORTUNE_ATOMS
