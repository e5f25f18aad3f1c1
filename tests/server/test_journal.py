"""The durable ledger and paid-call journal across restarts (WIRE.md
§callKey, across restarts; the Go reference's ``server/journal_test.go``,
``ledger_test.go``, ``replay_test.go``). A restart is a new Harness on the
same data_dir."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp.server import CallContext, Harness, HarnessConfig, HarnessError
from tests.kit.harness import (
    ALICE,
    BOB,
    Counter,
    call,
    db_path,
    err_text,
    execute,
    names,
    ok_text,
    payment_required_json,
    query,
    served,
    standard_harness,
    text_of,
)

INTERRUPTED = "call interrupted by a server restart; the charge was refunded"
NOT_RETAINED = "duplicate call: outcome not retained across a restart"


def fake_interrupted_call(data_dir: Path, *, call_id: str, peer: str, key: str | None, atoms: int) -> None:
    """What a crash between the debit and completion leaves behind: the
    debit, its audit row and a 'charged' journal row, in one transaction."""

    def script(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE balances SET atoms = atoms - ? WHERE peer = ?", (atoms, peer))
        (after,) = conn.execute("SELECT atoms FROM balances WHERE peer = ?", (peer,)).fetchone()
        conn.execute(
            "INSERT INTO movements (ts, peer, kind, atoms, call_key, ref, balance_after) "
            "VALUES (?, ?, 'charge', ?, ?, ?, ?)",
            (time.time(), peer, -atoms, key, f"charge:{call_id}", after),
        )
        conn.execute(
            "INSERT INTO calls (call_id, peer, call_key, tool, atoms, state, charged_at) "
            "VALUES (?, ?, ?, 'paid', ?, 'charged', ?)",
            (call_id, peer, key, atoms, time.time()),
        )

    execute(data_dir, script)


async def fund(data_dir: Path, peer: str, atoms: int) -> None:
    harness, _ = standard_harness(data_dir)
    async with harness:
        await harness.credit(peer, atoms)


async def test_interrupted_charge_refunded_on_restart_exactly_once(tmp_path: Path) -> None:
    await fund(tmp_path, ALICE, 1300)
    fake_interrupted_call(tmp_path, call_id="c1", peer=ALICE, key="restart-key-0001", atoms=500)
    fake_interrupted_call(tmp_path, call_id="c2", peer=ALICE, key=None, atoms=300)
    assert query(tmp_path, "SELECT atoms FROM balances WHERE peer = ?", (ALICE,)) == [(500,)]

    for start in range(3):
        harness, runs = standard_harness(tmp_path)
        async with harness:
            assert await harness.balance(ALICE) == 1300, f"start {start}"
            refunds = [e for e in await harness.statement(ALICE) if e.kind == "recovery_refund"]
            assert sorted((e.atoms, e.call_key) for e in refunds) == [(300, None), (500, "restart-key-0001")]
        assert runs.n == 0
        assert query(tmp_path, "SELECT count(*) FROM calls WHERE state != 'done'") == [(0,)]
    # The unkeyed row is gone; the keyed one is bound to the interrupted outcome.
    rows = query(tmp_path, "SELECT call_id, state, kept FROM calls")
    assert rows == [("c1", "done", 1)]


async def test_interrupted_keyed_call_retry_is_answered_not_executed(tmp_path: Path) -> None:
    """Go re-executes a retried interrupted call; we answer it."""
    await fund(tmp_path, ALICE, 1000)
    fake_interrupted_call(tmp_path, call_id="c1", peer=ALICE, key="restart-key-0001", atoms=500)
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        for _ in range(2):
            assert err_text(await call(s, "paid", key="restart-key-0001")) == INTERRUPTED
        assert runs.n == 0
        assert await harness.balance(ALICE) == 1000
        # Other keys work normally.
        assert json.loads(ok_text(await call(s, "paid", key="restart-key-0002"))) == {"n": 1}
        assert await harness.balance(ALICE) == 500


async def test_shutdown_during_a_paid_call_refunds_it(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    started = anyio.Event()

    @harness.tool(price_atoms=200)
    async def stuck(ctx: CallContext) -> dict[str, Any]:
        started.set()
        await anyio.sleep_forever()
        return {}

    with anyio.fail_after(10):
        async with served(harness) as srv:
            await harness.credit(ALICE, 500)
            async with anyio.create_task_group() as tg:

                async def caller() -> None:
                    async with srv.client(ALICE) as s:
                        await call(s, "stuck", key="stuck-key-0001")

                tg.start_soon(caller)
                await started.wait()
                assert await harness.balance(ALICE) == 300
                tg.cancel_scope.cancel()
    kinds = [k for (k,) in query(tmp_path, "SELECT kind FROM movements ORDER BY id")]
    assert kinds == ["credit", "charge", "refund"]
    assert query(tmp_path, "SELECT atoms FROM balances") == [(500,)]
    assert query(tmp_path, "SELECT state FROM calls") == [("done",)]


async def test_outcome_cap_keeps_small_outcomes_only(tmp_path: Path) -> None:
    def make() -> tuple[Harness, Counter]:
        harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
        runs = Counter()

        @harness.tool(price_atoms=10)
        async def sized(ctx: CallContext, n: int) -> str:
            runs(ctx)
            return "x" * n

        return harness, runs

    harness, runs = make()
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 100)
        big = ok_text(await call(s, "sized", {"n": 70_000}, key="big-outcome-1"))
        small = ok_text(await call(s, "sized", {"n": 60_000}, key="small-outcome"))
        # In this process both are replayed from memory.
        assert ok_text(await call(s, "sized", {"n": 70_000}, key="big-outcome-1")) == big
        assert runs.n == 2
    rows = dict(query(tmp_path, "SELECT call_key, kept FROM calls"))
    assert rows == {"big-outcome-1": 0, "small-outcome": 1}
    assert query(tmp_path, "SELECT outcome IS NULL FROM calls WHERE call_key = 'big-outcome-1'") == [(1,)]

    harness, runs = make()
    async with served(harness) as srv, srv.client(ALICE) as s:
        result = await call(s, "sized", {"n": 70_000}, key="big-outcome-1")
        assert err_text(result) == NOT_RETAINED
        assert result.structured_content is None
        assert ok_text(await call(s, "sized", {"n": 60_000}, key="small-outcome")) == small
        assert runs.n == 0
        assert await harness.balance(ALICE) == 80


async def test_ledger_lifecycle_through_the_harness(tmp_path: Path) -> None:
    def make() -> Harness:
        harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))

        def amount(ctx: CallContext, args: dict[str, Any]) -> int:
            return int(args["atoms"])

        @harness.tool(price=amount)
        async def spend(ctx: CallContext, atoms: int) -> dict[str, Any]:
            return {"spent": ctx.charged_atoms}

        return harness

    harness = make()
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 100)
        assert json.loads(ok_text(await call(s, "spend", {"atoms": 40}))) == {"spent": 40}
        # An over-debit fails and changes nothing.
        assert err_text(await call(s, "spend", {"atoms": 61})) == payment_required_json("spend", 61, 60)
        assert await harness.balance(ALICE) == 60
        await harness.credit(ALICE, 25)
        with pytest.raises(ValueError, match="positive"):
            await harness.credit(ALICE, 0)
        with pytest.raises(ValueError, match="positive"):
            await harness.credit(ALICE, -5)
        assert await harness.balance(BOB) == 0  # unknown peers have 0
    async with make() as reopened:
        assert await reopened.balance(ALICE) == 85
        assert [(e.kind, e.atoms) for e in await reopened.statement(ALICE)] == [
            ("credit", 100),
            ("charge", -40),
            ("credit", 25),
        ]


async def test_paid_call_replay_across_restart(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 600)
        first = await call(s, "paid", key="restart-key-0001")
        assert json.loads(ok_text(first)) == {"n": 1}
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        again = await call(s, "paid", key="restart-key-0001")
        assert text_of(again) == text_of(first)
        assert again.structured_content == first.structured_content
        assert not again.is_error
        assert runs.n == 0
        assert await harness.balance(ALICE) == 100
        assert [e.kind for e in await harness.statement(ALICE)] == ["credit", "charge"]


async def test_replay_window_expires_then_the_key_runs_again(tmp_path: Path) -> None:
    now = [1_000_000.0]
    harness, runs = standard_harness(tmp_path, clock=lambda: now[0])
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 1500)
        first = ok_text(await call(s, "paid", key="expiring-key-1"))
        now[0] += 29 * 60
        assert ok_text(await call(s, "paid", key="expiring-key-1")) == first
        now[0] += 2 * 60
        # Past 30 minutes: a fresh call (WIRE.md §callKey), and the old journal row is swept.
        assert ok_text(await call(s, "paid", key="expiring-key-1")) != first
        assert runs.n == 2
        assert await harness.balance(ALICE) == 500
        assert query(tmp_path, "SELECT count(*) FROM calls") == [(1,)]
        now[0] += 31 * 60
        assert not (await call(s, "paid", key="another-key-01")).is_error
        # The periodic sweep (piggybacked on a charge) removed the expired row.
        assert query(tmp_path, "SELECT call_key FROM calls") == [("another-key-01",)]


async def test_statement_rows_match_balances(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 1000)
        assert await harness.credit_tip(ALICE, 250_999, 77) == 250
        assert not (await call(s, "paid", key="audit-key-0001")).is_error
        assert (await call(s, "failing")).is_error
        assert (await call(s, "paid", key="audit-key-0001")).structured_content is not None
        await harness.credit(BOB, 3)
    fake_interrupted_call(tmp_path, call_id="lost", peer=ALICE, key="audit-key-0002", atoms=500)
    harness, _ = standard_harness(tmp_path)
    async with harness:
        statement = await harness.statement(ALICE)
        balance = await harness.balance(ALICE)
        assert [(e.kind, e.atoms) for e in statement] == [
            ("credit", 1000),
            ("tip", 250),
            ("charge", -500),
            ("charge", -500),
            ("refund", 500),
            ("charge", -500),
            ("recovery_refund", 500),
        ]
        assert statement[1].tip_seq == 77
        assert [e.call_key for e in statement if e.kind == "charge"] == [
            "audit-key-0001",
            None,
            "audit-key-0002",
        ]
        running = 0
        for entry in statement:
            running += entry.atoms
            assert entry.balance_after == running
        assert running == balance == 750
        assert all(e.ts > 0 for e in statement)
        assert [(e.kind, e.atoms) for e in await harness.statement(BOB)] == [("credit", 3)]


async def test_database_file_layout(tmp_path: Path) -> None:
    data_dir = tmp_path / "state" / "bot"
    harness, _ = standard_harness(data_dir)
    async with harness:
        assert harness.database_path == str(db_path(data_dir))
        await harness.credit(ALICE, 1)
    assert names(data_dir) == ["brmcp.sqlite3"]
    assert data_dir.stat().st_mode & 0o777 == 0o700
    assert db_path(data_dir).stat().st_mode & 0o777 == 0o600
    assert query(data_dir, "PRAGMA journal_mode") == [("wal",)]


CORRUPTIONS = ["garbage", "truncated-half", "truncated-empty", "foreign-sqlite", "newer-schema"]


@pytest.mark.anyio  # explicit: conftest adds the marker too late for parametrized tests
@pytest.mark.parametrize("kind", CORRUPTIONS)
async def test_corrupt_database_stops_startup_untouched(tmp_path: Path, kind: str) -> None:
    path = db_path(tmp_path)
    if kind in ("truncated-half", "truncated-empty", "newer-schema"):
        await fund(tmp_path, ALICE, 5000)
        harness, _ = standard_harness(tmp_path)
        async with harness:
            for seq in range(300):
                await harness.credit_tip(ALICE, 1000, seq)
        if kind == "newer-schema":
            conn = sqlite3.connect(path)
            conn.execute("PRAGMA user_version = 99")
            conn.close()
        else:
            size = path.stat().st_size
            with path.open("r+b") as f:
                f.truncate(size // 2 if kind == "truncated-half" else 0)
    elif kind == "garbage":
        path.write_bytes(bytes(range(256)) * 40)
    else:
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
        conn.commit()
        conn.close()
    before = path.read_bytes()
    others = names(tmp_path)
    with pytest.raises(HarnessError) as info:
        Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    message = str(info.value)
    assert str(path) in message
    expected = {
        "garbage": "is corrupt or unreadable: file is not a database",
        "truncated-half": "is corrupt",
        "truncated-empty": "is empty (truncated?)",
        "foreign-sqlite": "is not a brmcp database",
        "newer-schema": "has schema version 99, newer than this brmcp supports",
    }[kind]
    assert expected in message
    assert path.read_bytes() == before
    assert names(tmp_path) == others


async def test_unusable_data_dir_is_a_harness_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(HarnessError, match="cannot create data directory"):
        Harness(HarnessConfig(data_dir=blocker / "sub"))
