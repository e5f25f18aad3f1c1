"""The bot's session is lost during a paid call (BRIDGE.md §Failures, "The
bot's session is lost during a paid call").

The bot's brclient goes away while a paid tool runs and, meanwhile, the bot
cannot send the answer to another call on the same session, which ends
that session. The paid run is the bot's, not the session's: it finishes,
is charged once and journaled under its callKey, and once brclient is back
the bridge's re-sent copy (same callKey) gets that result. The agent gets
the tool's result, charged exactly once, to the atom: one tip, one charge,
one run, no refund.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from mcp.types import CallToolResult, TextContent

from brmcp.server import CallContext
from tests.kit import BOT, CLIENT, until
from tests.kit.slowbot import agent_session, journal, slow_bot_world

#: The slow tool's price in atoms.
PRICE = 2_500


@dataclass
class _Slow:
    """A paid tool that returns once ``finish`` is set; ``runs`` counts its
    executions, ``entered`` is set when one starts."""

    entered: anyio.Event
    finish: anyio.Event
    runs: int = 0

    async def __call__(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        self.runs += 1
        self.entered.set()
        await self.finish.wait()
        return {"done": self.runs, "text": args.get("text")}


async def test_a_paid_call_whose_bot_session_is_lost_is_answered_once_charged_once(tmp_path: Path) -> None:
    slow = _Slow(entered=anyio.Event(), finish=anyio.Event())
    async with (
        slow_bot_world(tmp_path, slow, price=PRICE) as world,
        agent_session(world.url) as agent,
        agent_session(world.url) as other,
    ):
        router = world.harness.router
        assert router is not None
        outcome: list[CallToolResult] = []

        async def agent_call() -> None:
            outcome.append(await agent.call_tool("slow", {"text": "x"}))

        async def other_call() -> None:
            await other.call_tool("free", {})

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(agent_call)
                await slow.entered.wait()
                # brclient goes away: the answer to the other call cannot
                # leave, which ends the bot's session of both calls.
                world.fabric.fail_sends(BOT)
                failures = router.stats.send_failures
                tg.start_soon(other_call)
                await until(lambda: router.stats.send_failures > failures)
                world.fabric.set_offline(BOT)
                slow.finish.set()
                # Settled and journaled while brclient is still away.
                await until(lambda: journal(tmp_path) == [("done", PRICE)])
                world.fabric.restore_sends(BOT)
                world.fabric.set_online(BOT)
        result = outcome[0]
        assert not result.is_error, result
        texts = [block.text for block in result.content if isinstance(block, TextContent)]
        assert texts[0].startswith('{"done":1,"text":"x"}')
        assert slow.runs == 1
        assert world.payer.calls == [(BOT, PRICE)]
        statement = await world.harness.statement(CLIENT)
        assert [(e.kind, e.atoms, e.balance_after) for e in statement] == [
            ("credit", PRICE, PRICE),
            ("charge", -PRICE, 0),
        ]
        assert await world.harness.balance(CLIENT) == 0
        assert journal(tmp_path) == [("done", PRICE)]
