"""Tips are never lost from the books (WIRE.md §Payments, "Tips from senders
not allowed"): a tip from a sender not allowed when it arrives is held,
with its atoms, in the transaction that marks it seen; the operator reports
show it; and it is credited exactly once when the sender is allowed (at
start, at the sender's next ``tools/call`` or tip, or when
``release_held_tips`` runs after an allowlist change), whatever is
redelivered, restarted or run concurrently."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brmcp.serve.cli import main as serve_main
from brmcp.server import InsufficientBalance
from brmcp.server.store import SCHEMA_VERSION, open_database
from brmcp.server.store.reports import held_of, held_totals, ledger_stats, open_readonly
from tests.kit.harness import ALICE, BOB, MALLORY, execute, query, served, standard_harness

TIP_REF = "tip:{seq}:{peer}:{matoms}"


def _movements(data_dir: Path, peer: str) -> list[tuple[Any, ...]]:
    return query(
        data_dir,
        "SELECT kind, atoms, tip_seq, ref, balance_after FROM movements WHERE peer = ? ORDER BY id",
        (peer,),
    )


def _stats(data_dir: Path) -> Any:
    conn = open_readonly(data_dir)
    try:
        return ledger_stats(conn)
    finally:
        conn.close()


async def test_a_tip_from_a_sender_not_allowed_is_held_in_the_same_transaction(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with harness:
        assert await harness.record_tip(MALLORY, 7_500, 3) == (True, 0)
        assert await harness.record_tip(MALLORY, 999, 4) == (True, 0)  # under one atom: nothing to hold
        assert await harness.balance(MALLORY) == 0
    assert query(tmp_path, "SELECT sequence_id, credited, state FROM tips ORDER BY n") == [
        (3, 0, "done"),
        (4, 0, "done"),
    ]
    assert query(tmp_path, "SELECT sequence_id, peer, amount_matoms, atoms FROM held_tips") == [
        (3, MALLORY, 7_500, 7)
    ]
    assert _movements(tmp_path, MALLORY) == []
    # A failing transaction leaves neither row (they commit together).
    harness, _ = standard_harness(tmp_path)

    def poison(conn: sqlite3.Connection) -> None:
        conn.execute(
            "CREATE TRIGGER no_hold BEFORE INSERT ON held_tips BEGIN SELECT RAISE(ABORT, 'disk says no'); END"
        )

    execute(tmp_path, poison)
    async with harness:
        with pytest.raises(sqlite3.IntegrityError, match="disk says no"):
            await harness.record_tip(MALLORY, 2_000, 5)
    assert query(tmp_path, "SELECT count(*) FROM tips WHERE sequence_id = 5") == [(0,)]


async def test_allowing_the_sender_credits_each_held_tip_once(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with harness:
        assert await harness.record_tip(MALLORY, 7_500, 3) == (True, 0)
        assert await harness.record_tip(MALLORY, 2_000, 9) == (True, 0)
        before = _stats(tmp_path)
        assert (before.held_tips, before.held_atoms, before.tip_atoms, before.received_atoms) == (2, 9, 0, 9)
        assert before.reconciles
        # Not allowed yet: a release credits nothing.
        assert await harness.release_held_tips() == 0
        harness.set_allowed_peers({ALICE, BOB, MALLORY})
        async with anyio.create_task_group() as tg:  # concurrent releases: still once
            for _ in range(5):
                tg.start_soon(harness.release_held_tips)
                tg.start_soon(harness.release_held_tips, MALLORY)
        assert await harness.release_held_tips() == 0
        assert await harness.balance(MALLORY) == 9
        assert await harness.held_tips() == []
        # Redelivered after the release: nothing more.
        assert await harness.record_tip(MALLORY, 7_500, 3) == (False, 0)
        assert await harness.balance(MALLORY) == 9
    assert _movements(tmp_path, MALLORY) == [
        ("tip", 7, 3, TIP_REF.format(seq=3, peer=MALLORY, matoms=7_500), 7),
        ("tip", 2, 9, TIP_REF.format(seq=9, peer=MALLORY, matoms=2_000), 9),
    ]
    after = _stats(tmp_path)
    assert (after.held_tips, after.held_atoms, after.tip_atoms, after.received_atoms) == (0, 0, 9, 9)
    assert after.reconciles
    assert after.balance_atoms == 9


async def test_held_tips_survive_restarts_and_redelivery_and_credit_at_start(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with harness:
        assert await harness.record_tip(MALLORY, 4_000, 1) == (True, 0)
    # Redelivered after a restart, still not allowed: recognised, held once.
    harness, _ = standard_harness(tmp_path)
    async with harness:
        assert await harness.record_tip(MALLORY, 4_000, 1) == (False, 0)
        assert [(t.sequence_id, t.atoms) for t in await harness.held_tips()] == [(1, 4)]
    # The next start has the sender on its allowlist: credited on entry.
    harness, _ = standard_harness(tmp_path, allowed_peers={MALLORY})
    async with harness:
        assert await harness.balance(MALLORY) == 4
        assert await harness.held_tips() == []
        assert await harness.record_tip(MALLORY, 4_000, 1) == (False, 0)
    harness, _ = standard_harness(tmp_path, allowed_peers={MALLORY})
    async with harness:
        assert await harness.balance(MALLORY) == 4
    assert [m[:3] for m in _movements(tmp_path, MALLORY)] == [("tip", 4, 1)]


async def test_the_sender_s_next_call_credits_its_held_tips_first(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, allowed_peers={ALICE})
    async with served(harness) as srv:
        assert await harness.credit_tip(BOB, 500_000, 11) == 0
        harness.set_allowed_peers({ALICE, BOB})  # a reload that does not release
        assert await harness.balance(BOB) == 0
        async with srv.client(BOB) as s:
            result = await s.call_tool("paid", {})
        assert not result.is_error
        assert runs.n == 1
        assert await harness.balance(BOB) == 0
        assert await harness.held_tips() == []
    assert [m[:2] for m in _movements(tmp_path, BOB)] == [("tip", 500), ("charge", -500)]


class Ledger:
    """An operator's Billing store that applies each ref once."""

    def __init__(self) -> None:
        self.balances: dict[str, int] = {}
        self.refs: list[str] = []

    async def balance(self, peer: str) -> int:
        return self.balances.get(peer, 0)

    async def debit(self, peer: str, atoms: int, *, ref: str) -> None:
        if ref in self.refs:
            return
        if self.balances.get(peer, 0) < atoms:
            raise InsufficientBalance()
        self.refs.append(ref)
        self.balances[peer] = self.balances.get(peer, 0) - atoms

    async def credit(self, peer: str, atoms: int, *, ref: str) -> None:
        if ref in self.refs:
            return
        self.refs.append(ref)
        self.balances[peer] = self.balances.get(peer, 0) + atoms


async def test_an_external_billing_store_is_credited_once_under_the_tip_ref(tmp_path: Path) -> None:
    ledger = Ledger()
    harness, _ = standard_harness(tmp_path, billing=ledger)
    ref = TIP_REF.format(seq=5, peer=MALLORY, matoms=3_000)
    async with harness:
        assert await harness.record_tip(MALLORY, 3_000, 5) == (True, 0)
        assert ledger.refs == []
        # A crash came after the store's credit, before the audit row: the
        # next release repeats the credit under the same ref (a no-op).
        await ledger.credit(MALLORY, 3, ref=ref)
        harness.set_allowed_peers({MALLORY})
        assert await harness.release_held_tips() == 3
        assert await harness.release_held_tips() == 0
    assert ledger.balances == {MALLORY: 3}
    assert ledger.refs == [ref]
    assert _movements(tmp_path, MALLORY) == [("tip", 3, 5, ref, None)]
    # Without a data directory the tip is held in memory, credited the same way.
    memory = Ledger()
    harness, _ = standard_harness(None, billing=memory)
    async with harness:
        assert await harness.record_tip(MALLORY, 3_000, 5) == (True, 0)
        assert [t.atoms for t in await harness.held_tips(MALLORY)] == [3]
        harness.set_allowed_peers({MALLORY})
        assert await harness.credit_tip(MALLORY, 1_000, 6) == 1
        assert await harness.held_tips() == []
    assert memory.balances == {MALLORY: 4}


async def test_the_operator_reports_show_held_tips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    harness, _ = standard_harness(tmp_path)
    async with harness:
        assert await harness.credit_tip(ALICE, 2_000_000, 1) == 2_000
        assert await harness.record_tip(MALLORY, 9_000_000, 2) == (True, 0)

        async def report(*args: str) -> str:
            code = await anyio.to_thread.run_sync(serve_main, ["--datadir", str(tmp_path), *args])
            out = capsys.readouterr()
            assert code == 0, out.err
            return out.out

        stats = json.loads(await report("--json", "stats"))
        assert (stats["tip_atoms"], stats["held_tips"], stats["held_atoms"]) == (2_000, 1, 9_000)
        assert stats["received_atoms"] == 11_000
        assert stats["balance_atoms"] == stats["movement_atoms"] == 2_000
        assert stats["reconciles"] is True
        assert json.loads(await report("--json", "balances")) == {
            "balances": [{"uid": ALICE, "atoms": 2_000}],
            "held_tips": [{"uid": MALLORY, "tips": 1, "atoms": 9_000}],
        }
        statement = json.loads(await report("--json", "statement", MALLORY))
        assert statement["movements"] == []
        assert [(h["tip_seq"], h["amount_matoms"], h["atoms"]) for h in statement["held_tips"]] == [
            (2, 9_000_000, 9_000)
        ]
        text = await report("stats")
        assert "tips held:             1           9,000 atoms (senders not allowed)" in text
        assert "tips received: 11,000 atoms = 2,000 credited + 9,000 held" in text
        assert "1 sender(s), 9,000 atoms waiting for the allowlist" in await report("balances")
        assert "tip (held)" in await report("statement", MALLORY)
        harness.set_allowed_peers({ALICE, BOB, MALLORY})
        assert await harness.release_held_tips() == 9_000
        stats = json.loads(await report("--json", "stats"))
        assert (stats["tip_atoms"], stats["held_atoms"], stats["received_atoms"]) == (11_000, 0, 11_000)
        assert stats["balance_atoms"] == stats["movement_atoms"] == 11_000
    conn = open_readonly(tmp_path)
    assert held_totals(conn) == []
    assert held_of(conn, MALLORY) == []
    conn.close()


def test_a_version_2_ledger_gains_the_held_tips_table(tmp_path: Path) -> None:
    conn = open_database(tmp_path)
    conn.execute("INSERT INTO balances (peer, atoms) VALUES (?, 5)", (ALICE,))
    conn.execute(
        "INSERT INTO movements (ts, peer, kind, atoms, ref) VALUES (1, ?, 'tip', 5, 'tip:x')", (ALICE,)
    )
    conn.execute("DROP TABLE held_tips")
    conn.execute("PRAGMA user_version=2")
    conn.close()
    old = open_readonly(tmp_path)
    assert held_totals(old) == []
    assert (ledger_stats(old).held_atoms, ledger_stats(old).reconciles) == (0, True)
    old.close()
    conn = open_database(tmp_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    assert conn.execute("SELECT count(*) FROM held_tips").fetchone() == (0,)
    assert conn.execute("SELECT atoms FROM balances").fetchall() == [(5,)]
    conn.close()


#: One step of the life of a ledger: a tip (sender, sequence id, matoms),
#: an allowlist change, a release, a restart.
_STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("tip"),
            st.sampled_from([ALICE, MALLORY]),
            st.integers(0, 6),
            st.sampled_from([999, 1_000, 4_321]),
        ),
        st.tuples(st.just("allow"), st.booleans()),
        st.tuples(st.just("release")),
        st.tuples(st.just("restart")),
    ),
    max_size=14,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_STEPS)
def test_every_tip_atom_is_in_a_balance_or_held_exactly_once(steps: list[tuple[Any, ...]]) -> None:
    """For any sequence of tips (redeliveries included), allowlist changes,
    releases and restarts: each distinct tip's atoms are, to the atom,
    either held or credited, never both and never twice; the ledger
    reconciles; and nothing is held for a sender allowed at a release."""

    async def scenario(data_dir: Path) -> None:
        allow_mallory = False
        seen: dict[tuple[str, int, int], int] = {}
        harness, _ = standard_harness(data_dir, allowed_peers={ALICE})
        await harness.__aenter__()
        try:
            for step in steps:
                if step[0] == "tip":
                    _, peer, seq, matoms = step
                    seen.setdefault((peer, seq, matoms), matoms // 1000)
                    await harness.record_tip(peer, matoms, seq)
                elif step[0] == "allow":
                    allow_mallory = step[1]
                    harness.set_allowed_peers({ALICE, MALLORY} if allow_mallory else {ALICE})
                elif step[0] == "release":
                    await harness.release_held_tips()
                    if allow_mallory:
                        assert await harness.held_tips(MALLORY) == []
                else:
                    await harness.__aexit__(None, None, None)
                    peers = {ALICE, MALLORY} if allow_mallory else {ALICE}
                    harness, _ = standard_harness(data_dir, allowed_peers=peers)
                    await harness.__aenter__()
                for peer in (ALICE, MALLORY):
                    received = sum(atoms for (who, _, _), atoms in seen.items() if who == peer)
                    held = sum(t.atoms for t in await harness.held_tips(peer))
                    assert await harness.balance(peer) + held == received
                assert await harness.held_tips(ALICE) == []
        finally:
            await harness.__aexit__(None, None, None)
        stats = _stats(data_dir)
        assert stats.reconciles
        assert stats.received_atoms == sum(seen.values())

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(scenario, Path(tmp), backend="asyncio")
