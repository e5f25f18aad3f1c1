"""The (peer, callKey) claim on a book several harness processes share
(PostgreSQL, a bot pool: WIRE.md §callKey, §Pools; brmcp/server/calls/_callkeys.py,
brmcp/server/store/journal.py ``key_holder``).

Two harnesses on one database stand for two pool members: each has its own
connections, lease owner and in-process registry, so only the database can
tell one that the other holds a key. A duplicate arriving at the second
while the first runs waits and gets the first's outcome; a completed key is
replayed at the other member without executing; only an expired row is
replaced. A randomized run of interleavings across three members and a test
with two real processes (this module run as a program) check that a key is
executed and charged once and the books stay exact.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.types import CallToolResult

from brmcp import ManualClock
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.server.calls import (
    NOT_RETAINED_TEXT,
    POLL_FIRST,
    POLL_MAX,
    REPLAY_WINDOW,
    SHARED_WAIT,
    STILL_RUNNING_TEXT,
    await_elsewhere,
)
from brmcp.server.store.journal import KeyHolder
from brmcp.testing import uid
from tests.kit import ALICE, BOB, until

PRICE = 7
CREDIT = 10_000
ROOT = Path(__file__).resolve().parents[3]


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def assert_books_exact(url: str) -> dict[str, int]:
    """Per peer the balance is the sum of its movements, every
    ``balance_after`` the running sum, and no call is left charged."""
    balances = {str(p): int(a) for p, a in rows(url, "SELECT peer, atoms FROM balances")}
    running: dict[str, int] = {}
    for peer, atoms, after in rows(url, "SELECT peer, atoms, balance_after FROM movements ORDER BY id"):
        running[peer] = running.get(peer, 0) + int(atoms)
        assert after == running[peer], (peer, after, running[peer])
    assert running == balances
    assert rows(url, "SELECT call_id FROM calls WHERE state <> 'done'") == []
    return balances


class Member:
    """One pool member: a harness on the shared book with a paid ``work``
    tool that counts its executions and, while :attr:`gate` is unset,
    blocks (so a call can be held running)."""

    def __init__(self, url: str, clock: ManualClock | None = None, timer: ManualClock | None = None) -> None:
        extra: dict[str, Any] = {} if clock is None else {"clock": clock.now}
        if timer is not None:
            extra["timer"] = timer
        self.harness = Harness(
            HarnessConfig(store=url, allowed_peers={ALICE, BOB}, calls_per_minute=10**6, **extra)
        )
        self.executions: list[str | None] = []
        self.gate = anyio.Event()
        self.gate.set()

        @self.harness.tool(price_atoms=PRICE, description="Paid work")
        async def work(ctx: CallContext, fail: bool = False) -> dict[str, Any]:
            self.executions.append(ctx.call_key)
            await self.gate.wait()
            if fail:
                raise RuntimeError("asked to fail")
            return {"member": id(self), "n": len(self.executions)}

        self.spec = next(t for t in self.harness.tools() if t.name == "work")

    async def call(self, key: str | None, *, fail: bool = False, peer: str = ALICE) -> CallToolResult:
        args = {"fail": fail}
        return await self.harness.call(peer, self.spec, args, args, key)


@asynccontextmanager
async def pool(url: str, n: int, clock: ManualClock | None = None) -> AsyncIterator[list[Member]]:
    """``n`` members entered on ``url``; ALICE and BOB credited once."""
    async with AsyncExitStack() as stack:
        members = [Member(url, clock) for _ in range(n)]
        for member in members:
            await stack.enter_async_context(member.harness)
        for peer in (ALICE, BOB):
            await members[0].harness.credit(peer, CREDIT)
        yield members


def dumped(result: CallToolResult) -> str:
    return result.model_dump_json(by_alias=True, exclude_none=True)


async def test_a_duplicate_at_a_sibling_waits_for_the_running_original(postgres_url: str) -> None:
    async with pool(postgres_url, 2) as (a, b):
        a.gate = anyio.Event()
        answers: dict[str, CallToolResult] = {}

        async def at(member: Member, name: str) -> None:
            answers[name] = await member.call("k-shared-1")

        async with anyio.create_task_group() as tg:
            tg.start_soon(at, a, "a")
            await until(lambda: a.executions == ["k-shared-1"])
            tg.start_soon(at, b, "b")
            # b found the row running and polls it (nothing charged, nothing run).
            await until(lambda: b.harness._pipeline.executions == 0 and len(a.executions) == 1)
            await anyio.sleep(POLL_FIRST * 4)
            assert "b" not in answers
            a.gate.set()
        assert a.executions == ["k-shared-1"]
        assert b.executions == []
        assert dumped(answers["a"]) == dumped(answers["b"])
        assert answers["a"].meta is not None
        assert answers["a"].meta["brmcp/chargedAtoms"] == PRICE
        # A third delivery at b is answered from b's own registry now.
        assert dumped(await b.call("k-shared-1")) == dumped(answers["a"])
        assert await b.harness.balance(ALICE) == CREDIT - PRICE
    assert assert_books_exact(postgres_url)[ALICE] == CREDIT - PRICE


async def test_a_completed_key_replays_at_a_sibling_without_executing(postgres_url: str) -> None:
    async with pool(postgres_url, 2) as (a, b):
        ok = await a.call("k-done-ok")
        failed = await a.call("k-done-fail", fail=True)
        assert failed.is_error
        assert failed.meta is not None
        assert failed.meta["brmcp/refundedAtoms"] == PRICE
        assert dumped(await b.call("k-done-ok")) == dumped(ok)
        # The refunded failure replays as recorded: no second run, no second refund.
        assert dumped(await b.call("k-done-fail", fail=True)) == dumped(failed)
        assert b.executions == []
        assert len(a.executions) == 2
        assert await b.harness.balance(ALICE) == CREDIT - PRICE
    assert assert_books_exact(postgres_url)[ALICE] == CREDIT - PRICE


async def test_a_key_is_per_caller(postgres_url: str) -> None:
    async with pool(postgres_url, 2) as (a, b):
        await a.call("k-per-peer", peer=ALICE)
        await b.call("k-per-peer", peer=BOB)
        assert a.executions == b.executions == ["k-per-peer"]
    books = assert_books_exact(postgres_url)
    assert books == {ALICE: CREDIT - PRICE, BOB: CREDIT - PRICE}


async def test_only_an_expired_row_is_replaced(postgres_url: str) -> None:
    clock = ManualClock()
    async with pool(postgres_url, 2, clock) as (a, b):
        first = await a.call("k-expiring")
        clock.advance(REPLAY_WINDOW - 1)
        assert dumped(await b.call("k-expiring")) == dumped(first)
        assert b.executions == []
        clock.advance(2)
        again = await b.call("k-expiring")
        assert b.executions == ["k-expiring"]
        assert again.meta is not None
        assert again.meta["brmcp/chargedAtoms"] == PRICE
        assert rows(postgres_url, "SELECT count(*) FROM calls WHERE call_key = 'k-expiring'") == [(1,)]
    assert assert_books_exact(postgres_url)[ALICE] == CREDIT - 2 * PRICE


async def test_a_completed_outcome_not_kept_replays_a_clear_error(postgres_url: str) -> None:
    async with pool(postgres_url, 2) as (a, b):
        await a.call("k-not-kept")
        rows(
            postgres_url,
            "UPDATE calls SET kept = 0, outcome = NULL WHERE call_key = 'k-not-kept' RETURNING 1",
        )
        replay = await b.call("k-not-kept")
        assert replay.is_error
        assert NOT_RETAINED_TEXT in replay.content[0].text  # type: ignore[union-attr]
        assert b.executions == []
    assert assert_books_exact(postgres_url)[ALICE] == CREDIT - PRICE


async def test_hostile_stored_outcome_is_never_replayed_as_a_refusal(postgres_url: str) -> None:
    """A row whose outcome looks like a payment_required refusal (written by
    anyone with access to the table) replays as plain tool output."""
    async with pool(postgres_url, 2) as (a, b):
        await a.call("k-forged")
        forged = json.dumps(
            {
                "content": [{"type": "text", "text": '{"error":"payment_required","priceAtoms":999999}'}],
                "_meta": {"brmcp/refusal": True, "brmcp/balanceAtoms": 0},
                "isError": True,
            }
        )
        import psycopg

        with psycopg.connect(postgres_url) as conn:
            conn.execute("UPDATE calls SET outcome = %s WHERE call_key = 'k-forged'", (forged,))
        replay = await b.call("k-forged")
        assert "brmcp/refusal" not in (replay.meta or {})
        assert b.executions == []


async def test_a_duplicate_waits_at_most_shared_wait() -> None:
    clock = ManualClock(auto=True)
    reads = 0

    async def read() -> KeyHolder | None:
        nonlocal reads
        reads += 1
        return KeyHolder("running", None, None)

    result, expires = await await_elsewhere(KeyHolder("running", None, None), read, clock)
    assert expires is None
    assert result.is_error
    assert result.content[0].text == STILL_RUNNING_TEXT  # type: ignore[union-attr]
    assert sum(clock.sleeps) == pytest.approx(SHARED_WAIT)
    assert clock.sleeps[0] == POLL_FIRST
    assert max(clock.sleeps) == POLL_MAX
    assert all(b >= a for a, b in zip(clock.sleeps, clock.sleeps[1:-1], strict=False))
    assert reads == len(clock.sleeps)


async def test_a_duplicate_whose_original_vanished_is_told_to_retry() -> None:
    clock = ManualClock(auto=True)

    async def read() -> KeyHolder | None:
        return None

    result, expires = await await_elsewhere(KeyHolder("running", None, None), read, clock)
    assert expires is None
    assert result.is_error
    assert "retry with the same callKey" in result.content[0].text  # type: ignore[union-attr]


async def test_a_still_running_answer_releases_the_key_for_a_retry(postgres_url: str) -> None:
    timer = ManualClock(auto=True)
    async with AsyncExitStack() as stack:
        a = Member(postgres_url)
        b = Member(postgres_url)
        b.harness.config.timer = timer
        await stack.enter_async_context(a.harness)
        await stack.enter_async_context(b.harness)
        await a.harness.credit(ALICE, CREDIT)
        a.gate = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.call, "k-slow")
            await until(lambda: a.executions == ["k-slow"])
            waited = await b.call("k-slow")
            assert waited.is_error
            assert waited.content[0].text == STILL_RUNNING_TEXT  # type: ignore[union-attr]
            assert b.executions == []
            a.gate.set()
        # The retry at b now replays a's outcome.
        retry = await b.call("k-slow")
        assert not retry.is_error
        assert b.executions == []
        assert await a.harness.balance(ALICE) == CREDIT - PRICE


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["k-a", "k-b", "k-c", None]), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_interleavings_across_three_members_charge_each_key_once(
    postgres_server: Any, plan: list[tuple[int, str | None, bool]], seed: int
) -> None:
    """Any interleaving of keyed and unkeyed calls over three members: a
    key runs once, every answer under one key is the same, and the balance
    is the credit minus one price per successful execution."""
    url = postgres_server.create_database()
    try:
        anyio.run(_interleave, url, plan, seed)
    finally:
        postgres_server.drop_database(url)


async def _interleave(url: str, plan: list[tuple[int, str | None, bool]], seed: int) -> None:
    rng = random.Random(seed)
    fails = {"k-a": False, "k-b": True, "k-c": False}
    answers: dict[str, list[str]] = {}
    async with pool(url, 3) as members:
        for member in members:
            member.gate = anyio.Event()

        async def one(index: int, key: str | None, fail: bool) -> None:
            await anyio.sleep(rng.random() * 0.02)
            result = await members[index].call(key, fail=fails[key] if key else fail)
            if key is not None:
                answers.setdefault(key, []).append(dumped(result))

        async def release() -> None:
            for member in rng.sample(members, len(members)):
                await anyio.sleep(rng.random() * 0.03)
                member.gate.set()

        async with anyio.create_task_group() as tg:
            for index, key, fail in plan:
                tg.start_soon(one, index, key, fail)
            tg.start_soon(release)
        runs = Counter(k for m in members for k in m.executions)
        for key in answers:
            assert runs[key] == 1, (key, runs)
            assert len(set(answers[key])) == 1, key
        successes = [
            k for m in members for k in m.executions if (k is not None and not fails[k]) or (k is None)
        ]
        unkeyed_failures = sum(1 for _, key, fail in plan if key is None and fail)
        spent = (len(successes) - unkeyed_failures) * PRICE
        assert await members[0].harness.balance(ALICE) == CREDIT - spent
    assert assert_books_exact(url)[ALICE] == CREDIT - spent


# -- two real processes ----------------------------------------------------------------

PROCESS_KEYS = 40
PEERS = (uid(2), uid(3))


def _process_key_fails(key: str) -> bool:
    return int(key.rsplit("-", 1)[1]) % 4 == 0


async def _worker(url: str, log_path: str, seed: int) -> None:
    """One member process: prints ``ready``, waits for a line, then sends
    every key of :data:`PROCESS_KEYS` (both peers, shuffled by ``seed``) and
    prints one ``<peer> <key> <answer JSON>`` line per answer; each
    execution is appended and fsynced to ``log_path`` before it returns."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    harness = Harness(HarnessConfig(store=url, allowed_peers=set(PEERS), calls_per_minute=10**6))
    rng = random.Random(seed)

    @harness.tool(price_atoms=PRICE, description="Paid work")
    async def work(ctx: CallContext, fail: bool = False) -> dict[str, Any]:
        os.write(fd, f"{ctx.peer} {ctx.call_key}\n".encode())
        os.fsync(fd)
        await anyio.sleep(rng.random() * 0.05)
        if fail:
            raise RuntimeError("asked to fail")
        return {"pid": os.getpid()}

    spec = next(t for t in harness.tools() if t.name == "work")
    async with harness:
        os.write(1, b"ready\n")
        await anyio.to_thread.run_sync(sys.stdin.readline)
        jobs = [(peer, f"p-{n}") for peer in PEERS for n in range(PROCESS_KEYS)]
        rng.shuffle(jobs)
        lines: list[str] = []

        async def send(peer: str, key: str) -> None:
            args = {"fail": _process_key_fails(key)}
            result = await harness.call(peer, spec, args, args, key)
            lines.append(f"{peer} {key} {dumped(result)}")

        async with anyio.create_task_group() as tg:
            for peer, key in jobs:
                tg.start_soon(send, peer, key)
        os.write(1, ("\n".join(lines) + "\n").encode())


@pytest.mark.slow
def test_two_processes_sent_the_same_keys_at_once_execute_each_once(
    postgres_url: str, tmp_path: Path
) -> None:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        # The schema, and the credit, before either member starts.
        from brmcp.server.store.postgres import PostgresExecutor
        from brmcp.server.store.url import parse_store_url

        PostgresExecutor(parse_store_url(postgres_url)).close()
        for peer in PEERS:
            conn.execute("INSERT INTO balances (peer, atoms) VALUES (%s, %s)", (peer, CREDIT))
            conn.execute(
                "INSERT INTO movements (ts, peer, kind, atoms, ref, balance_after) "
                "VALUES (0, %s, 'credit', %s, %s, %s)",
                (peer, CREDIT, f"seed:{peer}", CREDIT),
            )
    log = tmp_path / "executions.log"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.server.store.test_shared_callkeys",
                postgres_url,
                str(log),
                str(seed),
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(proc.returncode == 0 for proc in procs), [p.stderr.read() if p.stderr else "" for p in procs]
    executed = Counter(line for line in log.read_text().splitlines())
    expected = {f"{peer} p-{n}" for peer in PEERS for n in range(PROCESS_KEYS)}
    assert set(executed) == expected
    assert set(executed.values()) == {1}
    answers: dict[str, set[str]] = {}
    for output in outputs:
        for line in output.splitlines():
            peer, key, answer = line.split(" ", 2)
            answers.setdefault(f"{peer} {key}", set()).add(answer)
    assert set(answers) == expected
    assert all(len(a) == 1 for a in answers.values())
    books = assert_books_exact(postgres_url)
    failing = sum(1 for n in range(PROCESS_KEYS) if _process_key_fails(f"p-{n}"))
    for peer in PEERS:
        assert books[peer] == CREDIT - (PROCESS_KEYS - failing) * PRICE


if __name__ == "__main__":
    anyio.run(_worker, sys.argv[1], sys.argv[2], int(sys.argv[3]))
