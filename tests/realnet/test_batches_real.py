"""Batches and pacing on a real relay (WIRE.md §Batches): the largest batch
of incompressible text crosses, and concurrent agents on one bot identity
cost at most about two PMs per call."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp import wire
from brmcp.testing.brnet import BrNet, BrNetUser
from tests.kit import until
from tests.kit.clientrpc import FAST
from tests.realnet.stack import agent, real_stack

pytestmark = pytest.mark.realnet


async def test_the_largest_batch_of_random_text_crosses_a_real_relay(
    brnet_factory: Callable[..., BrNet],
) -> None:
    net = await anyio.to_thread.run_sync(lambda: brnet_factory(users=("bot", "alice")))
    bot, alice = net.user("bot"), net.user("alice")
    # Random bytes: their base64 is the least compressible PM text.
    chunk = (wire.MAX_BATCH_BYTES - 256) // 4 * 3
    payload = os.urandom(chunk)
    parts = wire.encode(payload, sid="ab12", exp=0, chunk_size=chunk // 2 + 1)
    text = wire.encode_batch(parts)
    single = wire.encode(os.urandom(chunk), sid="ab12", exp=0, chunk_size=chunk)
    assert len(parts) == 2
    assert len(text) <= wire.MAX_BATCH_BYTES
    assert len(single) == 1
    assert len(single[0]) <= wire.MAX_BATCH_BYTES
    received: list[str] = []
    async with bot.client(**FAST) as cb, alice.client(**FAST) as ca:
        await cb.wait_connected()
        await ca.wait_connected()
        sub = cb.pm_stream()
        await sub.wait_open()

        async def drain() -> None:
            async for pm in sub:
                received.append(pm.message)

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            await ca.send_pm(bot.uid, text)
            await ca.send_pm(bot.uid, single[0])
            await until(lambda: len(received) == 2, limit=60)
            tg.cancel_scope.cancel()
    assert received[0] == text
    assert received[1] == single[0]
    lines = wire.split_batch(received[0])
    assert lines == parts
    assembler = wire.Assembler()
    out = [assembler.add(alice.uid, p, time.time()) for p in (wire.parse(x) for x in lines) if p is not None]
    assert out[-1] == payload


class PMCount:
    """PMs the listed users receive, each counted on its own PM stream."""

    def __init__(self) -> None:
        self.count = 0

    async def run(self, users: list[BrNetUser], *, task_status: Any) -> None:
        async with contextlib.AsyncExitStack() as stack:
            subs = []
            for user in users:
                client = await stack.enter_async_context(user.client(**FAST))
                await client.wait_connected()
                sub = client.pm_stream()
                await sub.wait_open()
                subs.append(sub)
            async with anyio.create_task_group() as tg:
                for sub in subs:
                    tg.start_soon(self._drain, sub)
                task_status.started()

    async def _drain(self, sub: Any) -> None:
        async for _ in sub:
            self.count += 1


async def test_sixteen_concurrent_agents_cost_at_most_two_pms_a_call(
    brnet_factory: Callable[..., BrNet], tmp_path: Path
) -> None:
    agents, calls_each = 16, 3
    async with real_stack(brnet_factory, tmp_path, calls_per_minute=100_000) as stack:
        counter = PMCount()
        async with anyio.create_task_group() as tg:
            await tg.start(counter.run, [stack.bot, stack.caller])
            answers: list[str] = []

            async def one(n: int) -> None:
                async with agent(stack.url) as session:
                    for i in range(calls_each):
                        result = await session.call_tool("echo", {"text": f"{n}-{i}"})
                        assert not result.is_error, result
                        answers.append(f"{n}-{i}")

            # Warm up (the bridge's first contact), then count from a quiet moment.
            async with agent(stack.url) as session:
                assert not (await session.call_tool("echo", {"text": "warm"})).is_error
            await anyio.sleep(1.0)
            before = counter.count
            began = time.monotonic()
            with anyio.fail_after(120):
                async with anyio.create_task_group() as calls:
                    for n in range(agents):
                        calls.start_soon(one, n)
            seconds = time.monotonic() - began
            await anyio.sleep(1.0)
            pms = counter.count - before
            tg.cancel_scope.cancel()
    total = agents * calls_each
    assert sorted(answers) == sorted(f"{n}-{i}" for n in range(agents) for i in range(calls_each))
    # Each agent's initialize and tools/list are answered by the bridge
    # (0 PMs); every call is one request and one response at most.
    assert pms <= 2.1 * total, (pms, seconds)
