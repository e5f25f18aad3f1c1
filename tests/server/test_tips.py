"""The tip journal: each received tip credits once, in the same transaction
that records it (SECURITY.md §5; WIRE.md §Payments; the Go reference's
``server/tipjournal_test.go`` TestTipJournal)."""

from __future__ import annotations

from pathlib import Path

import anyio

from tests.kit.harness import ALICE, BOB, MALLORY, query, standard_harness


async def test_tip_credits_once_and_redelivery_credits_nothing(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with harness:
        assert await harness.record_tip(ALICE, 5000, 1) == (True, 5)
        assert await harness.record_tip(ALICE, 5000, 1) == (False, 0)
        assert await harness.credit_tip(ALICE, 5000, 1) == 0
        assert await harness.balance(ALICE) == 5
    # Redelivered after a restart: still nothing.
    harness, _ = standard_harness(tmp_path)
    async with harness:
        assert await harness.record_tip(ALICE, 5000, 1) == (False, 0)
        assert await harness.balance(ALICE) == 5
        entries = await harness.statement(ALICE)
        assert [(e.kind, e.atoms, e.tip_seq, e.balance_after) for e in entries] == [("tip", 5, 1, 5)]


async def test_milliatoms_are_floored(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with harness:
        assert await harness.credit_tip(ALICE, 1999, 1) == 1
        assert await harness.credit_tip(ALICE, 999, 2) == 0
        assert await harness.credit_tip(ALICE, 1000, 3) == 1
        assert await harness.credit_tip(ALICE, 123_456_789, 4) == 123_456
        assert await harness.balance(ALICE) == 123_458
        # A sub-atom tip is still remembered: redelivery is a no-op either way.
        assert await harness.record_tip(ALICE, 999, 2) == (False, 0)


async def test_zero_and_negative_amounts_change_nothing(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with harness:
        assert await harness.credit_tip(ALICE, 0, 1) == 0
        assert await harness.credit_tip(ALICE, -5000, 2) == 0
        assert await harness.balance(ALICE) == 0
        assert await harness.statement(ALICE) == []


async def test_tips_from_non_allowed_senders_are_not_credited(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with harness:
        # Journaled (so a redelivery is recognised) and held, not credited.
        assert await harness.record_tip(MALLORY, 9000, 1) == (True, 0)
        assert await harness.record_tip(MALLORY, 9000, 1) == (False, 0)
        assert await harness.balance(MALLORY) == 0
        assert await harness.statement(MALLORY) == []
        assert [(t.sequence_id, t.atoms) for t in await harness.held_tips(MALLORY)] == [(1, 9)]
        # Allowed later: a redelivery credits nothing itself; the held tip is
        # credited once (at the sender's next tip here), then never again.
        harness.set_allowed_peers({ALICE, BOB, MALLORY})
        assert await harness.credit_tip(MALLORY, 9000, 1) == 0
        assert await harness.credit_tip(MALLORY, 9000, 2) == 9
        assert await harness.credit_tip(MALLORY, 9000, 1) == 0
        assert await harness.release_held_tips() == 0
        assert await harness.balance(MALLORY) == 18
        assert await harness.held_tips() == []
        moves = [(e.kind, e.atoms, e.tip_seq, e.balance_after) for e in await harness.statement(MALLORY)]
        assert moves == [("tip", 9, 1, 9), ("tip", 9, 2, 18)]


async def test_tip_and_its_record_are_one_transaction(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with harness:
        await harness.credit_tip(ALICE, 4000, 42)
    rows = query(tmp_path, "SELECT sequence_id, peer, amount_matoms, atoms, credited, state FROM tips")
    assert rows == [(42, ALICE, 4000, 4, 4, "done")]
    movements = query(tmp_path, "SELECT kind, atoms, tip_seq, ref FROM movements")
    assert movements == [("tip", 4, 42, f"tip:42:{ALICE}:4000")]


async def test_concurrent_redeliveries_credit_once(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    credited: list[int] = []
    async with harness:

        async def deliver(seq: int) -> None:
            credited.append(await harness.credit_tip(ALICE, 2000, seq))

        async with anyio.create_task_group() as tg:
            for _ in range(20):
                for seq in range(5):
                    tg.start_soon(deliver, seq)
        assert sorted(credited) == [0] * 95 + [2] * 5
        assert await harness.balance(ALICE) == 10


async def test_seen_set_keeps_the_newest_ten_thousand(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with harness:
        assert await harness.credit_tip(ALICE, 1000, 7) == 1
        assert await harness.record_tip(MALLORY, 1000, 8) == (True, 0)

        async def burst(first: int, count: int) -> None:
            async with anyio.create_task_group() as tg:
                for seq in range(first, first + count):
                    tg.start_soon(harness.credit_tip, BOB, 1000, seq)

        # 10,000 newer tips, delivered concurrently (group commit batches them).
        for first in range(100_000, 110_000, 500):
            await burst(first, 500)
        assert await harness.balance(BOB) == 10_000
        # The newest are still recognised.
        assert await harness.credit_tip(BOB, 1000, 109_999) == 0
        assert await harness.credit_tip(BOB, 1000, 100_000) == 0
    assert query(tmp_path, "SELECT count(*), min(sequence_id) FROM tips") == [(10_000, 100_000)]
    harness, _ = standard_harness(tmp_path)
    async with harness:
        # Tips 7 and 8 fell out of the bound. The held one (its sender is not
        # allowed) is recognised by its held row, the credited one by its
        # audit row, so even a very old redelivery never counts twice.
        assert await harness.record_tip(MALLORY, 1000, 8) == (False, 0)
        assert [(t.sequence_id, t.atoms) for t in await harness.held_tips(MALLORY)] == [(8, 1)]
        assert await harness.record_tip(ALICE, 1000, 7) == (False, 0)
        assert await harness.balance(ALICE) == 1
        assert await harness.credit_tip(BOB, 1000, 100_001) == 0
    assert query(tmp_path, "SELECT count(*) FROM tips") == [(10_000,)]
