"""A bot selling one slow paid tool behind a bridge, and an MCP agent on
the bridge's endpoint: the stack of the tests where brclient goes away in
the middle of a paid call (tests/e2e/test_paid_brclient_away.py,
tests/e2e/test_paid_response_lost.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from brmcp.bridge import ManualClock
from brmcp.server import CallContext, Harness
from brmcp.testing import Fabric
from tests.kit import BOT
from tests.kit.bridge import NAME, START, TOKEN, TestPayer, bridge_stack, build_harness, fixture_settings
from tests.kit.harness import query

__all__ = ["SlowBotWorld", "agent_session", "journal", "slow_bot_world"]


@dataclass
class SlowBotWorld:
    """The relay, the bot's harness, the wallet and the agent endpoint's URL."""

    fabric: Fabric
    harness: Harness
    payer: TestPayer
    url: str


@asynccontextmanager
async def slow_bot_world(
    tmp_path: Path, tool: Callable[[CallContext, dict[str, Any]], Awaitable[Any]], *, price: int
) -> AsyncIterator[SlowBotWorld]:
    """The bot (data under ``tmp_path/bot``) selling ``tool`` as ``slow``
    at ``price`` atoms, and a bridge (autopay, the kit's settings) in front."""
    payer = TestPayer()
    harness = build_harness(tmp_path / "bot", {})
    harness.add_tool(
        "slow", tool, description="A slow paid tool", input_schema={"type": "object"}, price_atoms=price
    )
    payer.harness = harness
    clock = ManualClock(START, auto=True)
    async with bridge_stack(
        tmp_path, payer, bot=harness, settings=fixture_settings(), name=NAME, clock=clock
    ) as built:
        address = built.bridge.listen_address
        assert address is not None
        yield SlowBotWorld(built.fabric, harness, payer, f"http://{address[0]}:{address[1]}/mcp/{BOT}")


def journal(tmp_path: Path) -> list[tuple[Any, ...]]:
    """The bot's journal: each paid call's state and atoms."""
    return query(tmp_path / "bot", "SELECT state, atoms FROM calls")


@asynccontextmanager
async def agent_session(url: str) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session on the bridge endpoint ``url``."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session
