"""A directory restarted mid-verification continues the run with the same
callKey, so the provider executes and charges the test once
(brmcp/directory/payer/_pipeline.py ``resume``; docs/directory.md §Lifecycle)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

from brmcp import ManualClock
from brmcp.directory.model import STATE_PENDING_REVIEW, STATE_TESTING, RegisterIn
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric
from tests.kit import until

from .stack import BUDGET, DIRECTORY, FEE, PRICE, PROVIDER, START, TipPayer, directory_stack, register_args


def gated_provider(data_dir: Path, gate: anyio.Event, entered: anyio.Event) -> tuple[Harness, list[str]]:
    """A provider whose paid ``fortune`` waits for ``gate`` (set ``entered`` first)."""
    harness = Harness(HarnessConfig(data_dir=data_dir, allow=lambda _peer: True))
    runs: list[str] = []

    @harness.tool(price_atoms=PRICE)
    async def fortune(ctx: CallContext, topic: str = "") -> dict[str, Any]:
        runs.append(ctx.call_key or "")
        entered.set()
        await gate.wait()
        return {"fortune": topic}

    return harness, runs


async def test_restart_while_the_provider_runs_the_test(tmp_path: Path) -> None:
    gate, entered = anyio.Event(), anyio.Event()
    clock = ManualClock(START, auto=True)
    async with AsyncExitStack() as outer:
        fabric = await outer.enter_async_context(Fabric())
        harness, runs = gated_provider(tmp_path / "prov", gate, entered)
        await outer.enter_async_context(harness)
        prov_router = await harness.start(fabric.sender(PROVIDER))
        fabric.attach(PROVIDER, prov_router.handle_pm)
        payer = TipPayer(harnesses={PROVIDER: harness})

        async with directory_stack(tmp_path, fabric=fabric, clock=clock, payer=payer) as st:
            await st.directory.pipeline.register(PROVIDER, RegisterIn.from_json(register_args()))
            await st.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1000, 1)
            await entered.wait()  # paid, charged, executing at the provider
            reg = await st.directory.store.registration(PROVIDER)
            assert reg is not None
            assert reg.state == STATE_TESTING
            key = reg.call_key
        # The directory is gone (a shutdown mid-test); the provider finishes.
        gate.set()
        assert runs == [key]

        async with directory_stack(tmp_path, fabric=fabric, clock=clock, payer=payer) as st:

            async def judged() -> bool:
                return (await st.directory.pipeline.status(PROVIDER)).state == STATE_PENDING_REVIEW

            await until(judged)
            reg = await st.directory.store.registration(PROVIDER)
            assert reg is not None
            assert reg.test_outcome == "ok", reg.test_err
            assert reg.call_key == key
            # Executed once, charged once, paid once.
            assert runs == [key]
            assert payer.sent == [(PROVIDER, PRICE)]
            charges = [e for e in await harness.statement(DIRECTORY) if e.kind == "charge"]
            assert [e.atoms for e in charges] == [-PRICE]
            assert await st.directory.harness.balance(PROVIDER) == BUDGET - PRICE


async def test_restart_with_a_payment_in_flight(tmp_path: Path) -> None:
    """The tip landed but was never confirmed when the directory stopped:
    the resumed call pays nothing more and the provider runs it once."""
    clock = ManualClock(START, auto=True)
    async with AsyncExitStack() as outer:
        fabric = await outer.enter_async_context(Fabric())
        gate, entered = anyio.Event(), anyio.Event()
        gate.set()
        harness, runs = gated_provider(tmp_path / "prov", gate, entered)
        await outer.enter_async_context(harness)
        prov_router = await harness.start(fabric.sender(PROVIDER))
        fabric.attach(PROVIDER, prov_router.handle_pm)
        payer = TipPayer(harnesses={PROVIDER: harness}, fail=["hang"])

        async with directory_stack(tmp_path, fabric=fabric, clock=clock, payer=payer) as st:
            await st.directory.pipeline.register(PROVIDER, RegisterIn.from_json(register_args()))
            await st.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1000, 1)
            await until(lambda: bool(payer.sent))
            [entry] = await st.directory.store.spends()
            assert entry.state == "launched"
        assert runs == []

        async with directory_stack(tmp_path, fabric=fabric, clock=clock, payer=payer) as st:

            async def judged() -> bool:
                return (await st.directory.pipeline.status(PROVIDER)).state == STATE_PENDING_REVIEW

            await until(judged)
            reg = await st.directory.store.registration(PROVIDER)
            assert reg is not None
            assert reg.test_outcome == "ok", reg.test_err
            assert len(runs) == 1
            assert payer.sent == [(PROVIDER, PRICE)]
            assert await st.directory.harness.balance(PROVIDER) == BUDGET - PRICE
