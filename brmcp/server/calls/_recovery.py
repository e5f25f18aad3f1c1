"""Recovery of interrupted calls, as plans of store operations: a plan is a
generator yielding one operation (its own transaction) at a time, run on the
calling thread at start-up or through the executor while serving; and what a
shared book's recovery needs to judge an owner dead (where this process runs,
whether a pid lives) and to drop its lease afterwards (WIRE.md §Pools)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, TypeVar

from brmcp.server import store
from brmcp.server.store import journal as calls_journal
from brmcp.server.store._conn import Connection
from brmcp.server.store._executor import BatchExecutor

__all__ = [
    "Interrupted",
    "Plan",
    "dead_interrupted",
    "host_identity",
    "lease_drops",
    "pid_alive",
    "recovery",
    "run_plan",
    "run_plan_now",
]

T = TypeVar("T")

#: One interrupted call recovery may settle: (call_id, peer, call_key, tool,
#: atoms, state, lease), the lease ``(owner, beat seen)`` on a shared book, else None.
Interrupted = tuple[str, str, str | None, str, int, str, tuple[str, float | None] | None]


#: Store operations, each its own transaction, yielded one at a time and each
#: sent its result; the generator's return value is the plan's.
Plan = Generator[Callable[[Connection], Any], Any, T]


def run_plan_now(db: BatchExecutor[Any], plan: Plan[T]) -> T:
    """Run ``plan``'s operations on the calling thread (start-up)."""
    result: Any = None
    while True:
        try:
            op = plan.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        result = db.run_now(op)


async def run_plan(db: BatchExecutor[Any], plan: Plan[T]) -> T:
    """Run ``plan``'s operations through the executor (while serving)."""
    result: Any = None
    while True:
        try:
            op = plan.send(result)
        except StopIteration as done:
            value: T = done.value
            return value
        result = await db.run(op)


def dead_interrupted(conn: Connection, *, owner: str | None, host: str | None) -> list[Interrupted]:
    """The interrupted calls recovery may settle now: on SQLite every one
    (lease None), on a shared book those of dead owners, each with
    ``(owner, beat seen)`` for :func:`store.recover_call` to check again.
    A call of a process without leases (owner NULL) is a dead owner's."""
    if owner is None:
        return [(*row, None) for row in store.interrupted(conn)]
    rows = calls_journal.interrupted_owned(conn)
    owners = {row[6] for row in rows if row[6] != owner}
    dead = calls_journal.dead_owners(owners, calls_journal.leases(conn), host=host, alive=pid_alive)
    return [(*row[:6], None if row[6] is None else (row[6], dead[row[6]])) for row in rows if row[6] in dead]


def lease_drops(pending: list[Interrupted]) -> list[functools.partial[None]]:
    """The operations dropping the leases of the dead owners whose calls
    ``pending`` settled (each lease once, only those seen beating)."""
    owners = {lease for *_, lease in pending if lease is not None and lease[1] is not None}
    return [functools.partial(calls_journal.drop_lease, owner=owner, seen=seen) for owner, seen in owners]


def recovery(ts: float, expires: float, outcome_json: str, *, local: bool) -> functools.partial[None]:
    """:func:`store.recover_call` with what every interrupted call settled at
    one start-up shares: the time, the end of its replay window (unix
    seconds) and the interrupted-call outcome (CallToolResult JSON)."""
    return functools.partial(
        store.recover_call, ts=ts, expires=expires, outcome_json=outcome_json, local=local
    )


def host_identity() -> str | None:
    """Where this process runs, precisely enough that a pid means the same
    process to every holder of the same value: the kernel's boot id and the
    pid namespace (containers on one host differ). None when unknown (not
    Linux): leases are then judged by their age alone."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}:{namespace}" if boot else None


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists in this pid namespace (one that is
    not ours to signal exists too). A reused pid reads as alive: its owner
    is then judged dead only when its lease expires."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
