"""The bot's brclient goes away while a paid call runs (BRIDGE.md
§Failures, "brclient goes away during a paid call").

The agent's call carries a progress token, so the tool's progress
notifications are written while brclient cannot take them. They are best
effort: dropped, the bot's session kept, the run not cancelled. When
brclient comes back the agent gets the tool's result, charged exactly once:
the wallet tipped the price once, the bot's ledger charged it once, and
nothing was refunded or run twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult, TextContent

from brmcp.server import CallContext
from brmcp.testing import Fabric
from tests.kit import BOT, CLIENT, until
from tests.kit.slowbot import SlowBotWorld, agent_session, slow_bot_world

#: The slow tool's price in atoms (what the measured case charged).
PRICE = 2_500


@dataclass
class _Slow:
    """A paid tool that reports progress whenever ``report`` is set and
    returns once ``finish`` is set; ``runs`` counts its executions."""

    report: anyio.Event
    finish: anyio.Event
    runs: int = 0
    reported: int = 0

    async def __call__(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        self.runs += 1
        await ctx.request.session.report_progress(1, 3)
        await self.report.wait()
        # Written while brclient is down: this notification's PM fails.
        await ctx.request.session.report_progress(2, 3)
        self.reported += 1
        await self.finish.wait()
        return {"done": self.runs, "text": args.get("text")}


def _request(text: str) -> CallToolRequest:
    params = CallToolRequestParams.model_validate(
        {"name": "slow", "arguments": {"text": text}, "_meta": {"progressToken": "agent-progress-1"}}
    )
    return CallToolRequest(params=params)


def _brclient_away(fabric: Fabric) -> None:
    """The bot's brclient stops: its PMs fail, PMs to it wait at the relay."""
    fabric.fail_sends(BOT)
    fabric.set_offline(BOT)


def _brclient_back(fabric: Fabric) -> None:
    fabric.restore_sends(BOT)
    fabric.set_online(BOT)


async def _books(world: SlowBotWorld) -> None:
    """Charged exactly once, to the atom: one tip of the price from the
    wallet, credited once and charged once at the bot, nothing refunded."""
    assert world.payer.calls == [(BOT, PRICE)]
    statement = await world.harness.statement(CLIENT)
    kinds = [(entry.kind, entry.atoms) for entry in statement]
    assert kinds == [("credit", PRICE), ("charge", -PRICE)], kinds
    assert [entry.balance_after for entry in statement] == [PRICE, 0]
    assert await world.harness.balance(CLIENT) == 0


def _done(result: CallToolResult) -> str:
    assert not result.is_error, result
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    return "\n".join(texts)


@pytest.mark.parametrize("finish_while_away", [False, True], ids=["back-before-done", "done-while-away"])
async def test_a_paid_call_with_progress_survives_the_bots_brclient_going_away(
    tmp_path: Path, finish_while_away: bool
) -> None:
    slow = _Slow(report=anyio.Event(), finish=anyio.Event())
    async with slow_bot_world(tmp_path, slow, price=PRICE) as world, agent_session(world.url) as agent:
        router = world.harness.router
        assert router is not None
        outcome: list[CallToolResult] = []

        async def agent_call() -> None:
            outcome.append(await agent.send_request(_request("x"), CallToolResult))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(agent_call)
                await until(lambda: slow.runs == 1)
                _brclient_away(world.fabric)
                slow.report.set()
                # brclient refused the progress PM.
                await until(lambda: world.fabric.stats.pms_refused == 1)
                if finish_while_away:
                    # The result is journaled under the callKey while its
                    # response cannot leave; the bridge's re-sent copy, once
                    # brclient is back, replays it.
                    slow.finish.set()
                    await until(lambda: world.fabric.stats.pms_refused == 2)
                    _brclient_back(world.fabric)
                else:
                    _brclient_back(world.fabric)
                    slow.finish.set()
        assert _done(outcome[0]).startswith('{"done":1,"text":"x"}')
        assert slow.runs == slow.reported == 1
        # The refused progress notification was dropped, not the session.
        assert router.stats.notifications_dropped == 1
        assert router.stats.send_failures == (1 if finish_while_away else 0)
        await _books(world)
