"""PM pacing of the fake brclient, timed as on the real network: the ``PM``
call returns at once, the PMs of one direction arrive in order one
``pm_pacing`` apart (the first after an idle spell at once), directions are
independent, and what the fabric does to a PM happens after the call returned.

The timing tests run in virtual time (trio's ``MockClock``): the fake's PM
method (what both of its transports call) is driven directly on fake
brclients that are registered on the relay but serve no clientrpc (their
server needs asyncio); deliveries are timed by a fabric tap. One test runs
the whole fake over clientrpc on asyncio, with order-only checks.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest
from trio.testing import MockClock

from brmcp.clientrpc import RPCError
from brmcp.clientrpc.types import PM, pm_params
from brmcp.testing import Fabric, Faults
from brmcp.testing.fakebr import KIND_PM, FakeBRClient, FakeRelay, RPCFault
from brmcp.testing.fakebr.params import Pairs
from tests.kit import until
from tests.kit.clientrpc import FAST

PACING = 0.1


def run_virtual(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})


class Arrivals:
    """Every PM the fabric delivers: (virtual time, from, to, text)."""

    def __init__(self, relay: FakeRelay) -> None:
        self.seen: list[tuple[float, str, str, str]] = []
        relay.fabric.add_tap(lambda f, t, text: self.seen.append((anyio.current_time(), f, t, text)))

    def between(self, a: FakeBRClient, b: FakeBRClient) -> list[tuple[float, str]]:
        return [(at, text) for at, f, t, text in self.seen if (f, t) == (a.uid, b.uid)]


def users(relay: FakeRelay, root: Path, *nicks: str, pacing: float = PACING) -> list[FakeBRClient]:
    """Fake brclients on the relay, contacts, on the relay (online), not serving."""
    fakes = [FakeBRClient(relay, nick, root / nick, pm_pacing=pacing) for nick in nicks]
    relay.kx_all(*fakes)
    for fake in fakes:
        relay.set_online(fake.uid)
    return fakes


async def pm(sender: FakeBRClient, to: FakeBRClient, text: str) -> None:
    """``ChatService.PM`` at ``sender``, as its clientrpc server runs it."""
    params = json.loads(json.dumps(pm_params(to.uid, text)), object_pairs_hook=Pairs)  # as the wire parses it
    assert await sender._methods.execute(PM, params, True) == {}


def test_back_to_back_pm_calls_return_at_once_and_arrive_one_pacing_apart(tmp_path: Path) -> None:
    async def main() -> None:
        async with FakeRelay() as relay:
            alice, bob = users(relay, tmp_path, "alice", "bob")
            arrivals = Arrivals(relay)
            start = anyio.current_time()
            for i in range(20):
                await pm(alice, bob, f"p{i}")
            assert anyio.current_time() == start  # every call returned without waiting
            assert relay.pms_queued == 20 - len(arrivals.seen)
            await anyio.sleep(5)
            got = arrivals.between(alice, bob)
            assert [text for _, text in got] == [f"p{i}" for i in range(20)]
            assert [at - start for at, _ in got] == pytest.approx([i * PACING for i in range(20)], abs=1e-6)
            assert [e.message for e in bob.pending_events(KIND_PM)] == [f"p{i}" for i in range(20)]
            # Stamped by the relay when it took each PM: whole seconds.
            assert all(e.timestamp_ms % 1000 == 0 for e in bob.pending_events(KIND_PM))
            assert relay.pms_queued == 0

    run_virtual(main)


def test_concurrent_pm_calls_return_at_once_and_arrive_in_call_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with FakeRelay() as relay:
            alice, bob = users(relay, tmp_path, "alice", "bob")
            arrivals = Arrivals(relay)
            start = anyio.current_time()
            returned: list[tuple[float, str]] = []

            async def one(i: int) -> None:
                await pm(alice, bob, f"c{i}")
                returned.append((anyio.current_time() - start, f"c{i}"))

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(one, i)
            assert [at for at, _ in returned] == [0.0] * 20
            await anyio.sleep(5)
            got = arrivals.between(alice, bob)
            # In the order the calls were taken (the scheduler picks that order).
            assert [text for _, text in got] == [text for _, text in returned]
            assert sorted(text for _, text in got) == sorted(f"c{i}" for i in range(20))
            assert [at - start for at, _ in got] == pytest.approx([i * PACING for i in range(20)], abs=1e-6)

    run_virtual(main)


def test_directions_are_paced_independently_and_an_idle_direction_delivers_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with FakeRelay() as relay:
            alice, bob, carol, dave = users(relay, tmp_path, "alice", "bob", "carol", "dave")
            arrivals = Arrivals(relay)
            start = anyio.current_time()
            for i in range(3):
                for sender in (alice, carol, dave):
                    await pm(sender, bob, f"{sender.nick}{i}")
                await pm(bob, alice, f"back{i}")
            await anyio.sleep(1)
            for sender in (alice, carol, dave):
                got = arrivals.between(sender, bob)
                assert [text for _, text in got] == [f"{sender.nick}{i}" for i in range(3)]
                assert [at - start for at, _ in got] == pytest.approx([0.0, PACING, 2 * PACING], abs=1e-6)
            back = arrivals.between(bob, alice)
            assert [at - start for at, _ in back] == pytest.approx([0.0, PACING, 2 * PACING], abs=1e-6)

            # After an idle spell the next PM goes at once, the one after it one pacing later.
            later = anyio.current_time()
            await pm(alice, bob, "after a pause")
            await anyio.sleep(0.03)
            await pm(alice, bob, "right after")
            await anyio.sleep(1)
            got = arrivals.between(alice, bob)[-2:]
            assert [(at - later, text) for at, text in got] == [
                (pytest.approx(0.0, abs=1e-6), "after a pause"),
                (pytest.approx(PACING, abs=1e-6), "right after"),
            ]

    run_virtual(main)


def test_without_pacing_the_call_delivers_and_raises_the_fabrics_errors(tmp_path: Path) -> None:
    async def main() -> None:
        async with FakeRelay() as relay:
            alice, bob = users(relay, tmp_path, "alice", "bob", pacing=0.0)
            arrivals = Arrivals(relay)
            await pm(alice, bob, "now")
            assert [text for _, text in arrivals.between(alice, bob)] == ["now"]  # within the call
            relay.fabric.fail_sends(alice.uid, 1)
            with pytest.raises(RPCFault, match=r"sends from .* are failing"):
                await pm(alice, bob, "refused")
            await pm(alice, bob, "again")
            assert [e.message for e in bob.pending_events(KIND_PM)] == ["now", "again"]
            assert relay.pms_lost == 0

    run_virtual(main)


def test_paced_pm_failures_come_after_the_call_and_lose_the_pm(tmp_path: Path) -> None:
    """An injected send failure hits the PM when the relay hands it on (after
    the call returned, as on the real network): logged, lost, counted; the
    fabric's drop fault loses one silently. The call's own checks still fail it."""

    async def main() -> None:
        async with Fabric(seed=1, max_pm_bytes=1000) as fabric, FakeRelay(fabric) as relay:
            alice, bob = users(relay, tmp_path, "alice", "bob")
            arrivals = Arrivals(relay)
            fabric.fail_sends(alice.uid, 1)
            await pm(alice, bob, "lost to a link failure")  # accepted
            await pm(alice, bob, "x" * 1001)  # over the fabric's limit: accepted, refused later
            await pm(alice, bob, "delivered")
            with pytest.raises(RPCFault, match="msg is empty"):
                await pm(alice, bob, "")
            await anyio.sleep(1)
            got = arrivals.between(alice, bob)
            assert [text for _, text in got] == ["delivered"]
            # The lost PMs kept their places in the pacing.
            assert got[0][0] == pytest.approx(2 * PACING, abs=1e-6)
            assert relay.pms_lost == 2
            assert fabric.stats.pms_refused == 2
            assert list(relay._pm_times[(alice.uid, bob.uid)]) == []  # no stamp left for the lost PMs

            fabric.faults = Faults(drop_rate=1.0)
            await pm(alice, bob, "dropped by the relay")
            await anyio.sleep(1)
            assert fabric.stats.pms_dropped == 1
            assert relay.pms_lost == 2
            assert [e.message for e in bob.pending_events(KIND_PM)] == ["delivered"]

    run_virtual(main)


def test_queued_pms_outlive_their_sender_and_are_lost_with_the_relay(tmp_path: Path) -> None:
    """A PM whose call returned is the relay's: the sender going off the relay
    (as its brclient stopping does) does not hold or lose it; the relay
    stopping ends every queue."""

    async def main() -> None:
        async with FakeRelay() as relay:
            alice, bob = users(relay, tmp_path, "alice", "bob")
            arrivals = Arrivals(relay)
            for i in range(3):
                await pm(alice, bob, f"q{i}")
            relay.set_offline(alice.uid)
            await anyio.sleep(1)
            assert [text for _, text in arrivals.between(alice, bob)] == ["q0", "q1", "q2"]

        async with FakeRelay() as relay:
            alice, bob = users(relay, tmp_path / "second", "alice", "bob")
            arrivals = Arrivals(relay)
            for i in range(5):
                await pm(alice, bob, f"r{i}")
            await anyio.sleep(PACING * 1.5)
        assert [text for _, text in arrivals.between(alice, bob)] == ["r0", "r1"]
        assert relay.pms_queued == 3

    run_virtual(main)


async def test_over_clientrpc_the_calls_return_before_the_paced_deliveries(tmp_path: Path) -> None:
    """The whole fake, on asyncio in real time: five PM calls all return
    before the second PM arrives (0.5 s pacing), the PMs arrive in order,
    and the ones still queued arrive after the sender's brclient stopped."""
    pacing = 0.5
    with anyio.fail_after(30):
        async with FakeRelay() as relay:
            alice = FakeBRClient(relay, "alice", tmp_path / "alice", pm_pacing=pacing)
            bob = FakeBRClient(relay, "bob", tmp_path / "bob", pm_pacing=pacing)
            relay.kx(alice, bob)
            async with bob:
                async with alice, alice.client(**FAST) as ca:
                    await ca.wait_connected()
                    for i in range(5):
                        await ca.send_pm(bob.uid, f"s{i}")
                    assert len(bob.pending_events(KIND_PM)) <= 1
                    with pytest.raises(RPCError, match=r"^msg is empty$"):
                        await ca.send_pm(bob.uid, "")
                await until(lambda: len(bob.pending_events(KIND_PM)) == 5, limit=10)
                assert [e.message for e in bob.pending_events(KIND_PM)] == [f"s{i}" for i in range(5)]
