"""Group commit over one SQLite connection (brmcp/server/store/_executor.py):
operations queued while a transaction commits share the next one; each
operation is isolated by a savepoint; a transaction that fails fails every
operation in it, never silently."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from anyio import wait_all_tasks_blocked

from brmcp.server.store._executor import GroupCommitExecutor


def open_executor(path: Path) -> GroupCommitExecutor:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (v TEXT NOT NULL UNIQUE)")
    return GroupCommitExecutor(conn)


def rows(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return sorted(v for (v,) in conn.execute("SELECT v FROM t"))
    finally:
        conn.close()


def insert(value: str) -> Callable[[sqlite3.Connection], str]:
    def op(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO t (v) VALUES (?)", (value,))
        return value

    return op


class Blocker:
    """An operation that holds the worker thread until released, so the
    next operations queue up into one batch."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def __call__(self, conn: sqlite3.Connection) -> str:
        assert self.gate.wait(10)
        return "blocker"


async def run_batch(
    ex: GroupCommitExecutor, ops: list[tuple[str, Callable[[sqlite3.Connection], Any]]]
) -> dict[str, Any]:
    """Queue ``ops`` behind a :class:`Blocker` so they share one transaction,
    then release it. Returns each name's result or exception ("blocker"
    included)."""
    blocker = Blocker()
    outcomes: dict[str, Any] = {}

    async def run(name: str, op: Callable[[sqlite3.Connection], Any]) -> None:
        try:
            outcomes[name] = await ex.run(op)
        except Exception as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "blocker", blocker)
        await wait_all_tasks_blocked()
        for name, op in ops:
            tg.start_soon(run, name, op)
        await wait_all_tasks_blocked()
        blocker.gate.set()
    return outcomes


async def test_concurrent_operations_share_transactions(tmp_path: Path) -> None:
    ex = open_executor(tmp_path / "db")
    results: list[str] = []

    async def one(i: int) -> None:
        results.append(await ex.run(insert(f"v{i:03d}")))

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(one, i)
    assert sorted(results) == [f"v{i:03d}" for i in range(200)]
    assert ex.operations == 200
    assert ex.batches < 200  # group commit happened
    ex.close()
    assert len(rows(tmp_path / "db")) == 200


async def test_failing_operation_rolls_back_only_itself(tmp_path: Path) -> None:
    ex = open_executor(tmp_path / "db")

    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t (v) VALUES ('partial')")
        raise ValueError("op failed")

    outcomes = await run_batch(
        ex,
        [
            ("a", insert("a")),
            ("bad", half_then_fail),
            ("dup", insert("a")),  # violates UNIQUE inside the same batch
            ("c", insert("c")),
        ],
    )
    assert outcomes["a"] == "a"
    assert outcomes["c"] == "c"
    assert isinstance(outcomes["bad"], ValueError)
    assert isinstance(outcomes["dup"], sqlite3.IntegrityError)
    assert ex.batches == 2  # the blocker's, then one for the four queued operations
    ex.close()
    assert rows(tmp_path / "db") == ["a", "c"]


async def test_aborted_transaction_fails_every_operation_of_the_batch(tmp_path: Path) -> None:
    """SQLite rolls a whole transaction back on some errors (disk full, I/O
    error); then no operation of the batch is durable and each caller must
    get an error, never a silent success."""
    ex = open_executor(tmp_path / "db")

    def abort(conn: sqlite3.Connection) -> str:
        conn.execute("ROLLBACK")  # what SQLite does by itself on SQLITE_FULL
        return "aborted"

    outcomes = await run_batch(ex, [("a", insert("a")), ("abort", abort), ("c", insert("c"))])
    for name in ("a", "abort", "c"):
        assert isinstance(outcomes[name], sqlite3.Error), (name, outcomes[name])
    # The connection is usable afterwards.
    assert await ex.run(insert("after")) == "after"
    ex.close()
    assert rows(tmp_path / "db") == ["after"]


async def test_cancelled_leader_still_runs_its_batch(tmp_path: Path) -> None:
    """A caller that becomes the batch leader and is cancelled before the
    worker thread starts must not leave the other callers of its batch
    with a result for an operation that never ran."""
    ex = open_executor(tmp_path / "db")
    blocker = Blocker()
    scopes: list[anyio.CancelScope] = []
    outcomes: dict[str, Any] = {}

    async def first_leader() -> None:
        await ex.run(blocker)
        # One scheduling round: the next leader has now taken its batch and
        # is at the checkpoint before its worker thread starts.
        await anyio.lowlevel.checkpoint()
        scopes[0].cancel()

    async def cancellable() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            outcomes["a"] = await ex.run(insert("a"))

    async def shielded() -> None:
        with anyio.CancelScope(shield=True):
            outcomes["b"] = await ex.run(insert("b"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(first_leader)
        await wait_all_tasks_blocked()
        tg.start_soon(cancellable)
        await wait_all_tasks_blocked()
        tg.start_soon(shielded)
        await wait_all_tasks_blocked()
        blocker.gate.set()
    assert outcomes["b"] == "b"
    ex.close()
    # Both operations of the leader's batch ran and committed.
    assert rows(tmp_path / "db") == ["a", "b"]


async def test_cancelled_waiter_withdraws_its_operation(tmp_path: Path) -> None:
    ex = open_executor(tmp_path / "db")
    blocker = Blocker()
    ran: list[str] = []

    async def waiter(scope: anyio.CancelScope) -> None:
        with scope:
            await ex.run(insert("withdrawn"))
        ran.append("cancelled" if scope.cancel_called else "ran")

    scope = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ex.run, blocker)
        await wait_all_tasks_blocked()
        tg.start_soon(waiter, scope)
        await wait_all_tasks_blocked()
        scope.cancel()
        await wait_all_tasks_blocked()
        blocker.gate.set()
    assert ran == ["cancelled"]
    assert await ex.run(insert("later")) == "later"
    ex.close()
    assert rows(tmp_path / "db") == ["later"]


def test_run_now_raises_the_operation_error(tmp_path: Path) -> None:
    ex = open_executor(tmp_path / "db")
    assert ex.run_now(insert("x")) == "x"
    with pytest.raises(sqlite3.IntegrityError):
        ex.run_now(insert("x"))
    ex.close()
    assert rows(tmp_path / "db") == ["x"]
