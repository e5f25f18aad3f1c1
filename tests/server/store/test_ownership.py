"""Journal ownership on a book several harness processes share (PostgreSQL,
a bot pool: WIRE.md §Pools; brmcp/server/store/journal.py, _accounts.py).

A process starting refunds only the interrupted calls of dead owners: a
live sibling's call in flight is left to it; a process killed with SIGKILL
is dead at once for a sibling on the same boot and pid namespace (its pid
is gone) and, seen from another host, only once its lease has had no beat
for ``LEASE_EXPIRY`` seconds by the database's clock. Each interrupted call
is refunded exactly once, also when several processes start together or a
process judged dead completes its call late. On SQLite nothing changes.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp import ManualClock
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.server.calls import Accounts, outcome_json_for_error
from brmcp.server.store.journal import HEARTBEAT_INTERVAL, LEASE_EXPIRY, Lease, dead_owners
from brmcp.server.store.postgres import PostgresExecutor
from brmcp.server.store.url import parse_store_url
from tests.kit import ALICE, until
from tests.server.store.test_shared_callkeys import (
    CREDIT,
    PRICE,
    ROOT,
    Member,
    assert_books_exact,
    rows,
)


def refunds(url: str) -> list[tuple[Any, ...]]:
    return rows(url, "SELECT peer, atoms, ref FROM movements WHERE kind = 'recovery_refund' ORDER BY id")


def execute(url: str, *statements: str) -> None:
    """Run ``statements`` in one committed transaction."""
    import psycopg

    with psycopg.connect(url) as conn:
        for statement in statements:
            conn.execute(statement)


def lease_owners(url: str) -> set[str]:
    return {str(r[0]) for r in rows(url, "SELECT owner FROM leases")}


# -- which owners are dead (no database) --------------------------------------------------


def lease(owner: str, age: float, host: str | None = "here", pid: int | None = 10) -> Lease:
    return Lease(owner, 1000.0 - age, age, host, pid)


def test_dead_owners_by_lease_age_host_and_pid() -> None:
    known = [
        lease("young-elsewhere", 1.0, host="there", pid=11),
        lease("old-elsewhere", LEASE_EXPIRY, host="there"),
        lease("young-here-gone", 1.0, pid=12),
        lease("young-here-alive", 1.0, pid=13),
        lease("young-unknown-host", 1.0, host=None, pid=12),
    ]
    owners: set[str | None] = {None, "no-lease", *(lease.owner for lease in known)}
    dead = dead_owners(owners, known, host="here", alive=lambda pid: pid != 12)
    assert dead == {
        None: None,
        "no-lease": None,
        "old-elsewhere": 1000.0 - LEASE_EXPIRY,
        "young-here-gone": 999.0,
    }


def test_an_unknown_own_host_judges_by_age_alone() -> None:
    known = [lease("a", 1.0, pid=12), lease("b", LEASE_EXPIRY + 1, pid=13)]
    assert dead_owners({"a", "b"}, known, host=None, alive=lambda pid: False) == {
        "b": 1000.0 - LEASE_EXPIRY - 1
    }


def test_the_lease_constants_tolerate_missed_beats() -> None:
    assert LEASE_EXPIRY >= 3 * HEARTBEAT_INTERVAL


def test_sqlite_has_no_owner_and_no_beat(tmp_path: Path) -> None:
    accounts = Accounts(tmp_path, None, ManualClock().now)
    try:
        assert not accounts.shared
        assert accounts.owner is None
        assert anyio.run(accounts.heartbeat, 60.0, outcome_json_for_error) == 0
    finally:
        accounts.close()


# -- one database -------------------------------------------------------------------------


async def test_a_live_siblings_call_is_not_refunded_when_another_process_starts(postgres_url: str) -> None:
    a = Member(postgres_url, timer=ManualClock())
    async with a.harness:
        await a.harness.credit(ALICE, CREDIT)
        a.gate = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.call, "k-live")
            await until(lambda: a.executions == ["k-live"])
            # A sibling starts (its construction reconciles the book).
            b = Member(postgres_url, timer=ManualClock())
            async with b.harness:
                assert rows(postgres_url, "SELECT state FROM calls WHERE call_key = 'k-live'") == [
                    ("charged",)
                ]
                assert refunds(postgres_url) == []
                assert await b.harness.balance(ALICE) == CREDIT - PRICE
                # and its own beat recovers nothing of a live sibling's either
                assert await b.harness._accounts.heartbeat(60.0, outcome_json_for_error) == 0
            a.gate.set()
    assert refunds(postgres_url) == []
    assert assert_books_exact(postgres_url)[ALICE] == CREDIT - PRICE


async def test_a_clean_exit_drops_the_lease(postgres_url: str) -> None:
    a = Member(postgres_url, timer=ManualClock())
    owner = a.harness._accounts.owner
    assert owner is not None
    async with a.harness:
        assert owner in lease_owners(postgres_url)
    assert owner not in lease_owners(postgres_url)


async def test_a_process_judged_dead_that_completes_late_is_not_refunded_twice(postgres_url: str) -> None:
    """A live process whose lease looks dead (a stall past the expiry, seen
    from another host) has its call refunded by a sibling; its own late
    completion, a failure that would refund, changes nothing."""
    a = Member(postgres_url, timer=ManualClock())
    async with a.harness:
        await a.harness.credit(ALICE, CREDIT)
        a.gate = anyio.Event()
        answer: list[Any] = []

        async def run() -> None:
            answer.append(await a.call("k-stalled", fail=True))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await until(lambda: a.executions == ["k-stalled"])
            rows(
                postgres_url,
                f"UPDATE leases SET host = 'elsewhere', beat = beat - {LEASE_EXPIRY + 1} RETURNING 1",
            )
            b = Member(postgres_url, timer=ManualClock())
            async with b.harness:
                assert len(refunds(postgres_url)) == 1
                assert await b.harness.balance(ALICE) == CREDIT
                a.gate.set()
                await until(lambda: bool(answer))
                # The duplicate at b replays the recovery's answer.
                replay = await b.call("k-stalled", fail=True)
                assert replay.is_error
                assert b.executions == []
    assert len(refunds(postgres_url)) == 1
    assert rows(postgres_url, "SELECT count(*) FROM movements WHERE kind = 'refund'") == [(0,)]
    assert assert_books_exact(postgres_url)[ALICE] == CREDIT


async def test_a_running_member_recovers_a_dead_siblings_call_on_its_beat(postgres_url: str) -> None:
    a = Member(postgres_url, timer=ManualClock())
    b = Member(postgres_url, timer=ManualClock())
    async with a.harness, b.harness:
        await a.harness.credit(ALICE, CREDIT)
        a.gate = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.call, "k-orphan")
            await until(lambda: a.executions == ["k-orphan"])
            owner = a.harness._accounts.owner
            rows(
                postgres_url,
                f"UPDATE leases SET host = 'elsewhere', beat = beat - {LEASE_EXPIRY + 1} "
                f"WHERE owner = '{owner}' RETURNING 1",
            )
            assert await b.harness._accounts.heartbeat(60.0, outcome_json_for_error) == 1
            assert await b.harness._accounts.heartbeat(60.0, outcome_json_for_error) == 0
            # The dead owner's lease is forgotten once none of its calls is in flight.
            assert owner not in lease_owners(postgres_url)
            a.gate.set()
    assert len(refunds(postgres_url)) == 1
    assert assert_books_exact(postgres_url)[ALICE] == CREDIT


async def test_a_database_from_before_pools_gains_ownership_and_its_calls_are_recovered(
    postgres_url: str,
) -> None:
    PostgresExecutor(parse_store_url(postgres_url)).close()
    execute(
        postgres_url,
        "DROP TABLE leases",
        "ALTER TABLE calls DROP COLUMN owner",
        f"INSERT INTO balances (peer, atoms) VALUES ('{ALICE}', 0)",
        "INSERT INTO calls (call_id, peer, call_key, tool, atoms, state, charged_at) "
        f"VALUES ('old-call', '{ALICE}', 'k-old', 'work', 5, 'charged', 1)",
    )
    member = Member(postgres_url, timer=ManualClock())
    async with member.harness:
        assert rows(postgres_url, "SELECT state FROM calls WHERE call_id = 'old-call'") == [("done",)]
        assert refunds(postgres_url) == [(ALICE, 5, "refund:old-call")]
        assert member.harness._accounts.owner in lease_owners(postgres_url)


# -- processes ----------------------------------------------------------------------------


def _start_worker(url: str, stderr: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.server.store.test_ownership", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr.open("w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "running", stderr.read_text()
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


async def _worker(url: str) -> None:
    """A member that charges one call under ``k-killed`` and keeps it
    running, prints ``running`` once it is, and waits to be killed."""
    harness = Harness(HarnessConfig(store=url, allowed_peers={ALICE}, calls_per_minute=10**6))
    running = anyio.Event()

    @harness.tool(price_atoms=PRICE, description="Work that never ends")
    async def work(ctx: CallContext) -> dict[str, Any]:
        running.set()
        await anyio.sleep_forever()
        return {}

    spec = next(t for t in harness.tools() if t.name == "work")
    async with harness, anyio.create_task_group() as tg:
        tg.start_soon(harness.call, ALICE, spec, {}, {}, "k-killed")
        await running.wait()
        os.write(1, b"running\n")
        await anyio.sleep_forever()


async def _credit(url: str) -> None:
    member = Member(url, timer=ManualClock())
    async with member.harness:
        await member.harness.credit(ALICE, CREDIT)


@pytest.mark.slow
def test_a_killed_worker_is_refunded_exactly_once_by_siblings_starting_together(
    postgres_url: str, tmp_path: Path
) -> None:
    anyio.run(_credit, postgres_url)
    proc = _start_worker(postgres_url, tmp_path / "worker.err")
    try:
        # Alive: a sibling starting now leaves its call alone.
        member = Member(postgres_url, timer=ManualClock())
        member.harness._accounts.close()
        assert refunds(postgres_url) == []
        assert rows(postgres_url, "SELECT state FROM calls WHERE call_key = 'k-killed'") == [("charged",)]
    finally:
        _kill(proc)
    # Dead (its pid is gone on this host): three siblings start at once.
    started: list[Member] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            started.append(Member(postgres_url, timer=ManualClock()))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert len(started) == 3

    async def replay() -> None:
        async with started[0].harness:
            answer = await started[0].call("k-killed")
            assert answer.is_error
            assert "interrupted" in answer.content[0].text  # type: ignore[union-attr]
            assert started[0].executions == []

    try:
        anyio.run(replay)
    finally:
        for member in started[1:]:
            member.harness._accounts.close()
    assert refunds(postgres_url) == [(ALICE, PRICE, refunds(postgres_url)[0][2])]
    assert assert_books_exact(postgres_url)[ALICE] == CREDIT


@pytest.mark.slow
def test_a_killed_worker_on_another_host_is_dead_only_after_the_lease_expiry(
    postgres_url: str, tmp_path: Path
) -> None:
    anyio.run(_credit, postgres_url)
    proc = _start_worker(postgres_url, tmp_path / "worker.err")
    _kill(proc)
    # Seen as another machine's process: its pid means nothing here.
    rows(postgres_url, "UPDATE leases SET host = 'another-machine' RETURNING 1")
    accounts = Accounts(None, None, ManualClock().now, postgres_url)
    try:
        accounts.reconcile(60.0, outcome_json_for_error)
        assert refunds(postgres_url) == []
        rows(
            postgres_url,
            f"UPDATE leases SET beat = beat - {LEASE_EXPIRY} WHERE host = 'another-machine' RETURNING 1",
        )
        assert anyio.run(functools.partial(accounts.heartbeat, 60.0, outcome_json_for_error)) == 1
    finally:
        accounts.close()
    assert len(refunds(postgres_url)) == 1
    assert assert_books_exact(postgres_url)[ALICE] == CREDIT


if __name__ == "__main__":
    anyio.run(_worker, sys.argv[1])
