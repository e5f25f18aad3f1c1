"""The in-memory BR fabric (brmcp.testing.fabric): ordering, store and
forward, seeded faults, the routed-message size limit and its counters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import pytest
from trio.testing import MockClock

from brmcp.testing import Fabric, Faults, LinkDownError, PMTooLargeError, uid
from brmcp.testing.fabric import MAX_PM_BYTES
from tests.kit import until

A, B, C = uid(10), uid(11), uid(12)


def run_virtual(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` on trio with a clock that jumps to the next timer whenever
    every task waits: a wait of ``t`` seconds costs no real time and has let
    every PM due within ``t`` arrive."""
    anyio.run(main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})


class Inbox:
    """A fabric endpoint that records ``(from_uid, text)`` in arrival order."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str]] = []

    def __call__(self, from_uid: str, text: str) -> None:
        self.got.append((from_uid, text))

    def texts(self, from_uid: str | None = None) -> list[str]:
        return [text for sender, text in self.got if from_uid is None or sender == from_uid]


async def test_uid_is_64_copies_of_one_hex_digit() -> None:
    assert uid(1) == "1" * 64
    assert uid(10) == "a" * 64
    assert uid(0x1F) == "f" * 64


async def test_instant_delivery_counts_each_direction() -> None:
    async with Fabric() as fabric:
        at_a, at_b = Inbox(), Inbox()
        fabric.attach(A, at_a)
        fabric.attach(B, at_b)
        for text in ["one", "two", "three"]:
            await fabric.sender(A).send_pm(B, text)
        await fabric.sender(B).send_pm(A, "reply-é")
        assert at_b.texts() == ["one", "two", "three"]
        assert at_a.got == [(B, "reply-é")]
        assert (fabric.link(A, B).pms, fabric.link(A, B).bytes) == (3, 3 + 3 + 5)
        # Bytes are UTF-8 bytes, not characters.
        assert (fabric.link(B, A).pms, fabric.link(B, A).bytes) == (1, len("reply-é".encode()))
        assert fabric.link(A, C).pms == 0
        assert fabric.stats.pms_sent == fabric.stats.pms_delivered == 4
        assert fabric.stats.bytes_delivered == 11 + 8


async def test_async_endpoint_and_unknown_recipient() -> None:
    async with Fabric() as fabric:
        seen: list[str] = []

        async def deliver(from_uid: str, text: str) -> None:
            await anyio.lowlevel.checkpoint()
            seen.append(text)

        fabric.attach(A, deliver)
        await fabric.sender(B).send_pm(A, "hello")
        await fabric.sender(B).send_pm(C, "nobody home")
        assert seen == ["hello"]
        assert fabric.stats.pms_undeliverable == 1
        assert fabric.link(B, C).pms == 0


async def test_per_link_fifo_with_latency_and_jitter() -> None:
    async with Fabric(seed=11, faults=Faults(latency=0.01, jitter=0.05)) as fabric:
        inbox = Inbox()
        fabric.attach(C, inbox)
        sent = {A: [f"a{i}" for i in range(40)], B: [f"b{i}" for i in range(40)]}

        async def pump(sender_uid: str) -> None:
            for text in sent[sender_uid]:
                await fabric.sender(sender_uid).send_pm(C, text)
                await anyio.sleep(0.001)

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump, A)
            tg.start_soon(pump, B)
        await until(lambda: len(inbox.got) == 80)
        # Each link keeps send order although every PM had its own jitter ...
        assert inbox.texts(A) == sent[A]
        assert inbox.texts(B) == sent[B]
        # ... while the two links interleave.
        senders = [sender for sender, _ in inbox.got]
        assert senders != sorted(senders)


def test_offline_recipient_gets_everything_in_order_when_back() -> None:
    async def main() -> None:
        async with Fabric(faults=Faults(latency=0.05)) as fabric:
            inbox = Inbox()
            fabric.attach(B, inbox)
            sender = fabric.sender(A)
            # m0..m4 are still in flight when B goes offline; m5..m9 are sent while it is offline.
            for i in range(5):
                await sender.send_pm(B, f"m{i}")
            fabric.set_offline(B)
            assert fabric.is_offline(B)
            for i in range(5, 10):
                await sender.send_pm(B, f"m{i}")
            await anyio.sleep(0.15)  # virtual time: three times every PM's latency
            assert inbox.got == []
            assert fabric.stats.pms_stored == 5
            fabric.set_online(B)
            # Sent after coming back: must not overtake the stored PMs.
            await sender.send_pm(B, "m10")
            await until(lambda: len(inbox.got) == 11)
            assert inbox.texts() == [f"m{i}" for i in range(11)]

    run_virtual(main)


def test_offline_with_instant_faults_holds_and_keeps_order() -> None:
    async def main() -> None:
        async with Fabric() as fabric:
            inbox = Inbox()
            fabric.attach(B, inbox)
            fabric.set_offline(B)
            for i in range(3):
                await fabric.sender(A).send_pm(B, f"m{i}")
            await anyio.sleep(0.02)  # virtual time: the link worker has run and waits for B
            assert inbox.got == []
            fabric.set_online(B)
            # The link still has a backlog, so this instant-faults send queues behind it.
            await fabric.sender(A).send_pm(B, "m3")
            await until(lambda: len(inbox.got) == 4)
            assert inbox.texts() == ["m0", "m1", "m2", "m3"]
            # Once drained, instant delivery resumes in the sender's task.
            await fabric.sender(A).send_pm(B, "m4")
            assert inbox.texts()[-1] == "m4"

    run_virtual(main)


async def _run_lossy(seed: int) -> tuple[list[str], tuple[int, int, int]]:
    faults = Faults(drop_rate=0.2, duplicate_rate=0.2)
    async with Fabric(seed=seed, faults=faults) as fabric:
        inbox = Inbox()
        fabric.attach(B, inbox)
        for i in range(200):
            await fabric.sender(A).send_pm(B, f"p{i}")
        stats = fabric.stats
        await until(lambda: stats.pms_delivered == stats.pms_sent - stats.pms_dropped + stats.pms_duplicated)
        return inbox.texts(), (stats.pms_sent, stats.pms_dropped, stats.pms_duplicated)


async def test_drop_and_duplicate_are_seeded_and_reproducible() -> None:
    first, counts = await _run_lossy(seed=42)
    again, counts_again = await _run_lossy(seed=42)
    other, _ = await _run_lossy(seed=43)
    assert (first, counts) == (again, counts_again)
    assert first != other
    sent, dropped, duplicated = counts
    assert sent == 200
    # 20 % each of 200 (duplicates are drawn from the PMs that were not dropped).
    assert 20 <= dropped <= 60
    assert 15 <= duplicated <= 55
    assert len(first) == sent - dropped + duplicated
    # Without reordering a duplicate follows its original directly.
    for i, text in enumerate(first[1:], start=1):
        assert int(text[1:]) >= int(first[i - 1][1:])


async def test_reordering_lets_later_pms_overtake() -> None:
    async with Fabric(seed=5, faults=Faults(reorder_rate=0.3, reorder_delay=0.05)) as fabric:
        inbox = Inbox()
        fabric.attach(B, inbox)
        sent = [f"r{i}" for i in range(50)]
        for text in sent:
            await fabric.sender(A).send_pm(B, text)
        await until(lambda: len(inbox.got) == 50)
        assert sorted(inbox.texts()) == sorted(sent)
        assert inbox.texts() != sent


async def test_routed_message_limit_refuses_oversize_pms() -> None:
    async with Fabric() as fabric:
        inbox = Inbox()
        fabric.attach(B, inbox)
        # BR's max message size less the routed message's framing.
        limit = MAX_PM_BYTES
        assert limit == 1_887_437 - 256
        await fabric.sender(A).send_pm(B, "x" * limit)
        with pytest.raises(PMTooLargeError, match=f"{limit}-byte"):
            await fabric.sender(A).send_pm(B, "x" * (limit + 1))
        # The limit counts UTF-8 bytes: 2 bytes per "é".
        with pytest.raises(PMTooLargeError):
            await fabric.sender(A).send_pm(B, "é" * (limit // 2 + 1))
        assert len(inbox.got) == 1
        assert fabric.stats.pms_refused == 2
        assert fabric.link(A, B).pms == 1


async def test_small_max_pm_bytes() -> None:
    async with Fabric(max_pm_bytes=100) as fabric:
        fabric.attach(B, Inbox())
        await fabric.sender(A).send_pm(B, "y" * 100)
        with pytest.raises(PMTooLargeError):
            await fabric.sender(A).send_pm(B, "y" * 101)


async def test_fail_sends_counts_down_and_restores() -> None:
    async with Fabric() as fabric:
        inbox = Inbox()
        fabric.attach(B, inbox)
        sender = fabric.sender(A)
        fabric.fail_sends(A, count=2)
        for _ in range(2):
            with pytest.raises(LinkDownError):
                await sender.send_pm(B, "lost")
        await sender.send_pm(B, "through")
        fabric.fail_sends(A)
        for _ in range(3):
            with pytest.raises(LinkDownError):
                await sender.send_pm(B, "lost")
        # Other senders are unaffected.
        await fabric.sender(C).send_pm(B, "from c")
        fabric.restore_sends(A)
        await sender.send_pm(B, "again")
        assert inbox.texts() == ["through", "from c", "again"]
        assert fabric.stats.pms_refused == 5


def test_close_stops_delivery_and_closes_routers() -> None:
    async def main() -> None:
        async with Fabric(faults=Faults(latency=0.05)) as fabric:
            inbox = Inbox()
            fabric.attach(B, inbox)
            router = fabric.router(A)
            await fabric.sender(C).send_pm(B, "in flight")
            fabric.close()
            fabric.close()  # idempotent
            assert router.closed
            await fabric.sender(C).send_pm(B, "after close")
            await anyio.sleep(0.1)  # virtual time: twice the in-flight PM's latency
            assert inbox.got == []

    run_virtual(main)
