"""The paced, batched outbox (WIRE.md §Batches, "Pacing"), in virtual time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from brmcp import wire
from brmcp.transport.outbox import QUEUED_PARTS, Outbox
from brmcp.transport.router import RouterStats

# These tests are about the real PM pacing (tests/conftest.py turns it off elsewhere).
pytestmark = pytest.mark.paced

INTERVAL = 0.1
PEER = "11" * 32
OTHER = "22" * 32


def run_virtual(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})


class Brclient:
    """Records every PM handed over: (virtual time, peer, text)."""

    def __init__(self, fail: Callable[[str], bool] = lambda _text: False) -> None:
        self.pms: list[tuple[float, str, str]] = []
        self.fail = fail

    async def send_pm(self, peer: str, text: str) -> None:
        if self.fail(text):
            raise RuntimeError("brclient refused the PM")
        self.pms.append((anyio.current_time(), peer, text))

    def parts(self) -> list[str]:
        out: list[str] = []
        for _, _, text in self.pms:
            out.extend(wire.split_batch(text) or [text])
        return out


def batch_peer(_peer: str) -> int:
    return wire.MAX_BATCH_BYTES


def parts_of(n: int, tag: str, size: int = 20) -> list[str]:
    payload = (tag * size).encode()[:size]
    return wire.encode(payload, sid="ab12", exp=0, chunk_size=max(1, size // n))[:n]


def test_pms_to_one_peer_leave_one_interval_apart_and_writes_return_then() -> None:
    async def main() -> None:
        brclient, stats = Brclient(), RouterStats()
        outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=stats)
        start = anyio.current_time()
        returned: list[float] = []

        async def write(i: int) -> None:
            await outbox.send(PEER, parts_of(1, str(i)))
            returned.append(anyio.current_time() - start)

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(write, i)
        times = [t - start for t, _, _ in brclient.pms]
        assert times == pytest.approx([i * INTERVAL for i in range(5)])
        assert sorted(returned) == pytest.approx(times)
        assert stats.pms_sent == 5
        assert stats.batches_sent == 0

    run_virtual(main)


def test_peers_are_paced_independently() -> None:
    async def main() -> None:
        brclient = Brclient()
        outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=RouterStats())
        start = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for peer in (PEER, OTHER, PEER, OTHER):
                tg.start_soon(outbox.send, peer, parts_of(1, "x"))
        by_peer = {p: [round(t - start, 3) for t, q, _ in brclient.pms if q == p] for p in (PEER, OTHER)}
        assert by_peer == {PEER: [0.0, INTERVAL], OTHER: [0.0, INTERVAL]}

    run_virtual(main)


def test_parts_queued_behind_the_pacing_share_one_pm_for_a_batch_peer() -> None:
    async def main() -> None:
        brclient, stats = Brclient(), RouterStats()
        outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=stats, limit=batch_peer)
        await outbox.send(PEER, parts_of(1, "first"))
        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(lambda i=i: outbox.send(PEER, parts_of(1, str(i))))
        # The first went at once and alone (an ordinary PM); the 16 that
        # queued behind the pacing travel together one interval later.
        assert len(brclient.pms) == 2
        assert wire.split_batch(brclient.pms[0][2]) is None
        assert len(wire.split_batch(brclient.pms[1][2]) or []) == 16
        assert brclient.pms[1][0] - brclient.pms[0][0] == pytest.approx(INTERVAL)
        assert stats.pms_sent == 2
        assert stats.parts_sent == 17
        assert stats.batches_sent == 1

    run_virtual(main)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(1, 900)), min_size=1, max_size=30),
    st.integers(4096, 9000),
    st.booleans(),
)
def test_parts_leave_in_write_order_and_every_batch_fits(
    messages: list[tuple[int, int]], limit: int, batch: bool
) -> None:
    async def main() -> None:
        brclient = Brclient()
        outbox = Outbox(
            brclient.send_pm, interval=INTERVAL, stats=RouterStats(), limit=lambda _: limit if batch else None
        )
        written: list[str] = []
        async with anyio.create_task_group() as tg:
            for i, (n, size) in enumerate(messages):
                parts = wire.encode(str(i).encode() * size, sid="ab12", exp=0, chunk_size=-(-size // n) or 1)
                written.extend(parts)
                tg.start_soon(lambda p=parts: outbox.send(PEER, p))
                await anyio.lowlevel.checkpoint()  # queued in this order
        assert brclient.parts() == written
        for _, _, text in brclient.pms:
            lines = wire.split_batch(text)
            if lines is not None:
                assert batch
                assert 2 <= len(lines) <= wire.MAX_BATCH_PARTS
                assert len(text) <= limit
        if not batch:
            assert len(brclient.pms) == len(written)

    run_virtual(main)


def test_a_failed_pm_fails_every_message_in_it_and_not_the_others() -> None:
    async def main() -> None:
        brclient = Brclient(fail=lambda text: wire.split_batch(text) is not None)
        outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=RouterStats(), limit=batch_peer)
        outcomes: dict[int, str] = {}

        async def write(i: int) -> None:
            try:
                await outbox.send(PEER, parts_of(1, str(i)))
                outcomes[i] = "sent"
            except RuntimeError:
                outcomes[i] = "failed"

        await write(0)
        async with anyio.create_task_group() as tg:
            for i in range(1, 4):
                tg.start_soon(write, i)
        # The first went alone; the three behind it shared the failed batch.
        assert outcomes == {0: "sent", 1: "failed", 2: "failed", 3: "failed"}
        await outbox.send(PEER, parts_of(1, "z"))
        assert len(brclient.pms) == 2
        assert outbox.waiting(PEER) == 0

    run_virtual(main)


def test_a_cancelled_write_withdraws_what_had_not_left() -> None:
    async def main() -> None:
        brclient = Brclient()
        outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=RouterStats())
        await outbox.send(PEER, parts_of(1, "a"))
        with anyio.move_on_after(INTERVAL / 2):
            await outbox.send(PEER, parts_of(3, "b", size=30))
        assert outbox.waiting(PEER) == 0
        last = parts_of(1, "c")
        await outbox.send(PEER, last)
        assert brclient.parts()[1:] == last

    run_virtual(main)


def test_no_pacing_hands_everything_over_at_once() -> None:
    async def main() -> None:
        brclient = Brclient()
        outbox = Outbox(brclient.send_pm, interval=0, stats=RouterStats())
        start = anyio.current_time()
        for i in range(3):
            await outbox.send(PEER, parts_of(2, str(i)))
        assert [t - start for t, _, _ in brclient.pms] == [0.0] * 6

    run_virtual(main)


class Owner:
    """A task group standing in for the router: it owns the flushers."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self.tg = tg
        self.open = True

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: object) -> bool:
        if not self.open:
            return False
        self.tg.start_soon(fn, *args)
        return True


def test_a_writer_sending_one_message_after_another_still_fills_batches() -> None:
    async def main() -> None:
        brclient, stats = Brclient(), RouterStats()
        async with anyio.create_task_group() as tg:
            owner = Owner(tg)
            outbox = Outbox(
                brclient.send_pm, interval=INTERVAL, stats=stats, limit=batch_peer, spawn=owner.spawn
            )
            start = anyio.current_time()
            for i in range(100):
                # A notification stream: each write returns once queued.
                await outbox.send(PEER, parts_of(1, str(i)), wait=False)
            assert anyio.current_time() == start
            await outbox.drained()
        assert len(brclient.pms) <= 2
        assert len(brclient.parts()) == 100
        assert stats.batches_sent >= 1

    run_virtual(main)


def test_a_full_queue_makes_the_writer_wait_for_room() -> None:
    async def main() -> None:
        brclient = Brclient()
        async with anyio.create_task_group() as tg:
            owner = Owner(tg)
            # No batches: one part per PM, so the queue fills.
            outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=RouterStats(), spawn=owner.spawn)
            start = anyio.current_time()
            for i in range(QUEUED_PARTS + 10):
                await outbox.send(PEER, parts_of(1, str(i)), wait=False)
                assert outbox.waiting(PEER) <= QUEUED_PARTS
            # The writes past the bound each waited one interval for room
            # (the first PM left at once, so nine or ten intervals in all).
            assert 9 * INTERVAL - 1e-9 <= anyio.current_time() - start <= 10 * INTERVAL + 1e-9
            tg.cancel_scope.cancel()

    run_virtual(main)


def test_a_waiting_write_returns_when_its_pm_left() -> None:
    async def main() -> None:
        brclient = Brclient()
        async with anyio.create_task_group() as tg:
            owner = Owner(tg)
            outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=RouterStats(), spawn=owner.spawn)
            start = anyio.current_time()
            await outbox.send(PEER, parts_of(1, "a"), wait=False)
            await outbox.send(PEER, parts_of(1, "b"), wait=True)
            assert anyio.current_time() - start == pytest.approx(INTERVAL)
            assert len(brclient.pms) == 2

    run_virtual(main)


def test_a_failed_pm_reports_to_writers_that_did_not_wait() -> None:
    async def main() -> None:
        brclient = Brclient(fail=lambda text: "YmJi" in text)  # the part of "bbb"
        errors: list[Exception] = []
        async with anyio.create_task_group() as tg:
            owner = Owner(tg)
            outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=RouterStats(), spawn=owner.spawn)
            await outbox.send(PEER, parts_of(1, "a", size=3), wait=False, on_error=errors.append)
            await outbox.send(PEER, parts_of(1, "b", size=3), wait=False, on_error=errors.append)
            await outbox.send(PEER, parts_of(1, "c", size=3), wait=False, on_error=errors.append)
            await outbox.drained()
        assert [str(e) for e in errors] == ["brclient refused the PM"]
        assert len(brclient.pms) == 2

    run_virtual(main)


def test_an_owner_that_stops_fails_what_is_still_queued() -> None:
    async def main() -> None:
        brclient = Brclient()
        errors: list[Exception] = []
        async with anyio.create_task_group() as tg:
            owner = Owner(tg)
            outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=RouterStats(), spawn=owner.spawn)
            for i in range(5):
                await outbox.send(PEER, parts_of(1, str(i)), wait=False, on_error=errors.append)
            await anyio.sleep(INTERVAL * 1.5)
            owner.open = False
            tg.cancel_scope.cancel()
        assert len(brclient.pms) == 2
        assert len(errors) == 3
        assert outbox.waiting(PEER) == 0

    run_virtual(main)


class SlowBrclient(Brclient):
    """A brclient whose ``PM`` call takes ``delay`` (virtual) seconds."""

    def __init__(self, delay: float, fail: Callable[[str], bool] = lambda _text: False) -> None:
        super().__init__(fail)
        self.delay = delay

    async def send_pm(self, peer: str, text: str) -> None:
        await anyio.sleep(self.delay)
        await super().send_pm(peer, text)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=8))
def test_unpaced_writes_leave_in_write_order_while_a_lone_part_is_in_flight(sizes: list[int]) -> None:
    """Unpaced, a lone part with nothing queued goes out directly; writes
    arriving while it is in flight queue behind it and every part leaves
    once, in write order."""

    async def main() -> None:
        brclient, stats = SlowBrclient(0.01), RouterStats()
        outbox = Outbox(brclient.send_pm, interval=0, stats=stats)
        messages = [parts_of(n, str(i), size=6 * n) for i, n in enumerate(sizes)]
        seen_waiting: list[int] = []
        async with anyio.create_task_group() as tg:
            for parts in messages:
                tg.start_soon(outbox.send, PEER, parts)
                await anyio.lowlevel.checkpoint()
                seen_waiting.append(outbox.waiting(PEER))
        assert brclient.parts() == [p for parts in messages for p in parts]
        assert stats.pms_sent == stats.parts_sent == sum(sizes)
        assert seen_waiting[0] == sizes[0]  # the part in flight counts as waiting
        assert outbox.waiting(PEER) == 0

    run_virtual(main)


def test_an_unpaced_lone_part_that_fails_reports_and_raises() -> None:
    async def main() -> None:
        brclient = SlowBrclient(0.01, fail=lambda text: True)
        stats = RouterStats()
        outbox = Outbox(brclient.send_pm, interval=0, stats=stats)
        errors: list[Exception] = []
        with pytest.raises(RuntimeError, match="brclient refused"):
            await outbox.send(PEER, parts_of(1, "a"), on_error=errors.append)
        assert [str(e) for e in errors] == ["brclient refused the PM"]
        assert stats.pms_sent == 0
        assert outbox.waiting(PEER) == 0
        # The lane is free again: the next write goes out.
        brclient.fail = lambda text: False
        await outbox.send(PEER, parts_of(1, "b"))
        assert stats.pms_sent == 1

    run_virtual(main)


def test_a_cancelled_unpaced_lone_part_leaves_nothing_behind() -> None:
    async def main() -> None:
        brclient, stats = SlowBrclient(1.0), RouterStats()
        outbox = Outbox(brclient.send_pm, interval=0, stats=stats)
        with anyio.move_on_after(0.5):
            await outbox.send(PEER, parts_of(1, "a"))
        assert outbox.waiting(PEER) == 0
        second = parts_of(1, "b")
        await outbox.send(PEER, second)
        assert brclient.parts() == second
        assert stats.pms_sent == 1

    run_virtual(main)
