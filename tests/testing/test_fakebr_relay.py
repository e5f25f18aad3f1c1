"""Two (or three) fake brclients on the fake relay, driven through real
clientrpc clients: PMs, tips with progress and received amounts, contacts,
offline store-and-forward, and events logged while no client is connected."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import anyio
import pytest

from brmcp.clientrpc import RPCError, atoms_to_dcr
from brmcp.testing import Fabric, Faults
from brmcp.testing.fakebr import (
    KIND_PM,
    KIND_TIP_PROGRESS,
    KIND_TIP_RECEIVED,
    FakeBRClient,
    FakeRelay,
    TipFailure,
)
from tests.kit import until
from tests.kit.clientrpc import FAST, fake_network


async def test_pm_and_tip_between_two_fake_clients(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice") as (relay, (bot, alice)),
            bot.client(**FAST) as cb,
            alice.client(**FAST) as ca,
        ):
            pms, tips = cb.pm_stream(), cb.tip_stream()
            progress = ca.tip_progress()
            await ca.wait_connected()
            before = int(time.time() * 1000)
            await ca.send_pm(bot.uid, "hi bot")
            pm = await pms.__anext__()
            assert (pm.uid, pm.nick, pm.message) == (alice.uid, "alice", "hi bot")
            # The relay's time in whole seconds, as the BR server stamps it.
            assert pm.timestamp_ms % 1000 == 0
            assert before // 1000 * 1000 <= pm.timestamp_ms <= int(time.time() * 1000)
            await cb.send_pm(alice.uid, "hi alice")  # and back, over the fabric
            assert relay.fabric.link(bot.uid, alice.uid).pms == 1
            assert alice.pending_events(KIND_PM)[0].message == "hi alice"

            await ca.tip_user(bot.uid, atoms_to_dcr(12_345), 3)  # returns before the tip completes
            tip = await tips.__anext__()
            assert (tip.uid, tip.amount_matoms, tip.atoms) == (alice.uid, 12_345_000, 12_345)
            done = await progress.__anext__()
            assert (done.uid, done.nick, done.amount_matoms) == (bot.uid, "bot", 12_345_000)
            assert (done.completed, done.attempt, done.attempt_err, done.will_retry, done.final) == (
                True,
                1,
                "",
                False,
                True,
            )
            await cb.ack_tip_received(tip.sequence_id)
            await ca.ack_tip_progress(done.sequence_id)
            assert alice.pending_events(KIND_TIP_PROGRESS) == []


async def test_tip_with_a_retried_attempt_then_a_terminal_failure(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)),
            bot.client(**FAST) as cb,
            alice.client(**FAST) as ca,
        ):
            tips = cb.tip_stream()
            progress = ca.tip_progress()
            await ca.wait_connected()
            alice.fail_next_tip(TipFailure(attempts=1, error="invoice request timed out"))
            await ca.tip_user(bot.uid, 0.0001, 3)
            first, second = await progress.__anext__(), await progress.__anext__()
            assert (first.attempt, first.attempt_err, first.will_retry, first.final) == (
                1,
                "invoice request timed out",
                True,
                False,
            )
            assert (second.attempt, second.completed, second.final) == (2, True, True)
            assert (await tips.__anext__()).amount_matoms == 10_000_000

            tips_logged = len(bot.pending_events(KIND_TIP_RECEIVED))
            alice.fail_next_tip(TipFailure(attempts=5, error="no route"))
            await ca.tip_user(bot.uid, 0.0002, 2)
            a1, a2 = await progress.__anext__(), await progress.__anext__()
            assert [(e.attempt, e.will_retry, e.completed) for e in (a1, a2)] == [
                (1, True, False),
                (2, False, False),
            ]
            assert a2.final
            assert a2.attempt_err == "no route"
            # The tip ended with its final attempt, before the payee was asked.
            assert len(bot.pending_events(KIND_TIP_RECEIVED)) == tips_logged, "a failed tip reached the payee"


async def test_only_contacts_can_exchange_pms_and_tips(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice", "carol", contacts=False) as (relay, (bot, alice, carol)),
            alice.client(**FAST) as ca,
        ):
            relay.kx(bot, alice)
            await ca.wait_connected()
            with pytest.raises(RPCError, match=f"^user {carol.uid} not found$"):
                await ca.send_pm(carol.uid, "hello?")
            with pytest.raises(RPCError, match=f"^user {carol.uid} not found$"):
                await ca.tip_user(carol.uid, 0.001, 1)
            with pytest.raises(RPCError, match=r"^user carol not found$"):
                await ca.send_pm("carol", "hello?")
            await ca.send_pm("bot", "by nick")
            assert bot.pending_events(KIND_PM)[-1].message == "by nick"
            assert carol.pending_events(KIND_PM) == []


async def test_offline_user_gets_pms_and_tips_when_back(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with FakeRelay() as relay:
            alice = FakeBRClient(relay, "alice", tmp_path / "alice")
            bob = FakeBRClient(relay, "bob", tmp_path / "bob")
            relay.kx(alice, bob)
            async with alice, alice.client(**FAST) as ca:
                progress = ca.tip_progress()
                await ca.wait_connected()
                sent_at = int(time.time() * 1000)
                await ca.send_pm(bob.uid, "while you were out")  # bob's brclient is not running
                await ca.tip_user(bob.uid, 0.0001, 3)
                assert relay.fabric.stats.pms_stored == 1
                await until(lambda: relay.tips_waiting == 1)  # the tip waits for its payee ...
                assert alice.pending_events(KIND_TIP_PROGRESS) == []  # ... with no outcome yet
                async with bob:  # bob's brclient starts: relay delivers, the tip completes
                    async with bob.client(**FAST) as cb:
                        pms, tips = cb.pm_stream(), cb.tip_stream()
                        pm = await pms.__anext__()
                        assert pm.message == "while you were out"
                        assert (
                            sent_at // 1000 * 1000 <= pm.timestamp_ms < sent_at + 5000
                        )  # the relay's send time (whole s)
                        assert (await tips.__anext__()).amount_matoms == 10_000_000
                    assert (await progress.__anext__()).completed
                    # Events for bob while no clientrpc client is connected are logged
                    # and delivered on the next stream open.
                    await ca.send_pm(bob.uid, "nobody listening")
                    async with bob.client(**FAST) as cb:
                        pms = cb.pm_stream()
                        assert [(await pms.__anext__()).message for _ in range(2)] == [
                            "while you were out",
                            "nobody listening",
                        ]


async def test_fabric_faults_and_limits_apply_to_pms(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            Fabric(seed=1, faults=Faults(latency=0.01), max_pm_bytes=1000) as fabric,
            FakeRelay(fabric) as relay,
            contextlib.AsyncExitStack() as stack,
        ):
            alice = await stack.enter_async_context(FakeBRClient(relay, "alice", tmp_path / "a"))
            bob = await stack.enter_async_context(FakeBRClient(relay, "bob", tmp_path / "b"))
            relay.kx(alice, bob)
            async with alice.client(**FAST) as ca, bob.client(**FAST) as cb:
                pms = cb.pm_stream()
                await ca.wait_connected()
                with pytest.raises(RPCError, match="routed message limit"):
                    await ca.send_pm(bob.uid, "x" * 1001)
                for i in range(5):
                    await ca.send_pm(bob.uid, f"p{i}")
                assert [(await pms.__anext__()).message for _ in range(5)] == [f"p{i}" for i in range(5)]
                assert fabric.link(alice.uid, bob.uid).pms == 5
