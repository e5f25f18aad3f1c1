"""Several processes, one PostgreSQL book (brmcp/server/store/postgres/):

* four processes of eight concurrent clients each
  (tests/server/store/pg_hammer_worker.py) hammer shared credit refs,
  keyed and unkeyed charges, refunds and shared tips on one database;
  afterwards every shared ref and every tip is credited exactly once (by
  exactly one process), every callKey charged once, every reported
  movement audited, and, once two recoverers have settled the calls left
  charged at the same time, the books are exact to the atom: per peer the
  balance is the sum of its movements, every ``balance_after`` the running
  sum, and the total is credits + tips - charges + refunds;
* three harness processes (tests/server/store/pg_harness_worker.py) making
  paid keyed calls on one database are killed with SIGKILL at seeded
  random points and restarted, round after round: no callKey is ever
  executed twice, no call stays charged after a start-up, every
  interrupted charge is refunded exactly once, and the books stay exact.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp.server import store
from brmcp.server.store.postgres import PostgresExecutor
from brmcp.server.store.url import parse_store_url
from tests.server.store import pg_hammer_worker as hammer

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent / "store"
PROCESSES = 4
OPS = 40


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def check_books(url: str) -> dict[str, int]:
    """Per peer: balance == sum of its movements, and every balance_after
    the running sum in id order. Returns the balances."""
    balances = {str(p): int(a) for p, a in rows(url, "SELECT peer, atoms FROM balances")}
    running: dict[str, int] = {}
    for peer, atoms, after in rows(url, "SELECT peer, atoms, balance_after FROM movements ORDER BY id"):
        running[peer] = running.get(peer, 0) + int(atoms)
        assert after == running[peer], (peer, after, running[peer])
    assert {p: a for p, a in running.items() if a or p in balances} == {
        p: a for p, a in balances.items() if a or p in running
    }
    return balances


def recover_all(url: str, recoverers: int = 2) -> None:
    """Settle every call left charged, from ``recoverers`` executors at once
    (start-ups racing each other)."""
    executors = [PostgresExecutor(parse_store_url(url)) for _ in range(recoverers)]
    try:
        pending = executors[0].run_now(store.interrupted)

        def settle(ex: PostgresExecutor) -> None:
            for call_id, peer, key, _tool, atoms, _state in pending:
                ex.run_now(
                    functools.partial(
                        store.recover_call,
                        call_id=call_id,
                        peer=peer,
                        call_key=key,
                        atoms=atoms,
                        ts=9.0,
                        expires=1e12,
                        outcome_json="{}",
                        local=True,
                        charged=True,
                    )
                )

        threads = [threading.Thread(target=settle, args=(ex,)) for ex in executors]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert executors[0].run_now(store.interrupted) == []
    finally:
        for ex in executors:
            ex.close()


def test_processes_hammering_one_book_keep_it_exact(postgres_url: str) -> None:
    PostgresExecutor(parse_store_url(postgres_url)).close()  # the schema, before the race
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "pg_hammer_worker.py"), postgres_url, str(i), str(OPS), "7"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        reports.append(json.loads(out))
    credits = Counter(k for r in reports for k in r["credits"])
    tips = Counter(seq for r in reports for seq, _ in r["tips"])
    charges = [c for r in reports for c in r["charges"]]
    keyed = Counter((peer, key) for _, peer, key, _ in charges if key is not None)
    # Each shared ref, tip and callKey succeeded for exactly one process.
    assert credits
    assert tips
    assert keyed
    assert max(credits.values()) == 1
    assert max(tips.values()) == 1
    assert max(keyed.values()) == 1
    moves = rows(postgres_url, "SELECT ref, kind, atoms FROM movements")
    refs = Counter(ref for ref, _, _ in moves)
    assert max(refs.values()) == 1
    assert {ref for ref in refs if ref.startswith("s:")} == {f"s:{k}" for k in credits}
    assert {ref for ref in refs if ref.startswith("charge:")} == {f"charge:{c[0]}" for c in charges}
    tip_refs = {ref for ref in refs if ref.startswith("tip:")}
    assert tip_refs == {store.tip_ref(seq, *hammer.tip_of(seq)) for seq in tips}
    assert rows(postgres_url, "SELECT count(*) FROM tips") == [(len(tips),)]
    reported_refunds = {r for rep in reports for r in rep["refunds"]}
    assert reported_refunds <= {ref.removeprefix("refund:") for ref in refs if ref.startswith("refund:")}
    # Two recoverers at once settle the keyed calls still charged, each once.
    recover_all(postgres_url)
    moves = rows(postgres_url, "SELECT ref, kind, atoms FROM movements")
    assert max(Counter(ref for ref, _, _ in moves).values()) == 1
    refunded = {ref.removeprefix("refund:") for ref, _, _ in moves if ref.startswith("refund:")}
    price = {c[0]: c[3] for c in charges}
    assert refunded <= set(price)
    keyed_ids = {c[0] for c in charges if c[2] is not None}
    assert keyed_ids <= refunded  # every keyed call was left charged, so recovery refunded it
    balances = check_books(postgres_url)
    expected = (
        sum(hammer.credit_of(k)[1] for k in credits)
        + sum(credited for r in reports for _, credited in r["tips"])
        - sum(c[3] for c in charges)
        + sum(price[call_id] for call_id in refunded)
    )
    assert sum(balances.values()) == expected
    assert all(v >= 0 for v in balances.values())


ROUNDS = 5
WORKERS = 3
SEED = 20261202


class Worker:
    """A harness worker process and its stdout lines."""

    def __init__(self, url: str, index: int, seed: int, log: Path, stderr: Path) -> None:
        self._stderr = stderr.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "pg_harness_worker.py"), url, str(index), str(seed), str(log)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )

    def expect(self, line: str, timeout: float = 120.0) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        got = b""
        while time.monotonic() < deadline and self.proc.poll() is None:
            got = self.proc.stdout.readline()
            if got.strip() == line.encode():
                return
        raise AssertionError(f"worker never said {line!r} (last {got!r}, exit {self.proc.poll()})")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._stderr.close()


def test_harness_workers_killed_at_random_points_keep_the_books(postgres_url: str, tmp_path: Path) -> None:
    from brmcp.server import Harness, HarnessConfig

    rng = random.Random(SEED)
    logs = [tmp_path / f"executions-{i}.log" for i in range(WORKERS)]
    PostgresExecutor(parse_store_url(postgres_url)).close()
    for round_no in range(ROUNDS):
        workers = [
            Worker(postgres_url, i, SEED + round_no * 10 + i, logs[i], tmp_path / f"stderr-{i}.log")
            for i in range(WORKERS)
        ]
        try:
            for w in workers:
                w.expect("started")  # every start-up reconciled before anyone serves
            assert rows(postgres_url, "SELECT count(*) FROM calls WHERE state <> 'done'") == [(0,)]
            check_books(postgres_url)
            for w in workers:
                w.go()
            for w in workers:
                w.expect("go")
            for w in sorted(workers, key=lambda _: rng.random()):
                time.sleep(rng.uniform(0.05, 0.5))
                w.kill()
        finally:
            for w in workers:
                w.kill()

    # A last start-up settles what the last kills interrupted.
    async def start_and_stop() -> None:
        async with Harness(HarnessConfig(store=postgres_url)):
            pass

    anyio.run(start_and_stop)
    assert rows(postgres_url, "SELECT count(*) FROM calls WHERE state <> 'done'") == [(0,)]
    lines = [line.split() for log in logs if log.exists() for line in log.read_text().splitlines()]
    executions = Counter((peer, key) for peer, key, _ in lines)
    keyed_runs = {k: n for k, n in executions.items() if k[1] != "-"}
    assert keyed_runs, "no paid call ran before the kills"
    assert max(keyed_runs.values()) == 1  # no callKey executed twice, across every kill and restart
    moves = rows(postgres_url, "SELECT ref, kind, atoms, peer, call_key FROM movements")
    assert max(Counter(ref for ref, *_ in moves).values()) == 1
    charged = {ref.removeprefix("charge:"): -atoms for ref, kind, atoms, *_ in moves if kind == "charge"}
    refunds = {
        ref.removeprefix("refund:"): (kind, atoms)
        for ref, kind, atoms, *_ in moves
        if ref.startswith("refund:")
    }
    assert set(refunds) <= set(charged)
    assert all(atoms == charged[call_id] for call_id, (_, atoms) in refunds.items())
    keyed_charges = Counter((peer, key) for _, kind, _, peer, key in moves if kind == "charge" and key)
    assert max(keyed_charges.values()) == 1  # every callKey charged once
    assert any(kind == "recovery_refund" for kind, _ in refunds.values())  # kills did interrupt calls
    unrefunded = len(charged) - len(refunds)
    assert unrefunded <= sum(executions.values())  # a kept charge paid for an execution
    balances = check_books(postgres_url)
    credits = sum(atoms for _, kind, atoms, *_ in moves if kind == "credit")
    assert sum(balances.values()) == credits - sum(charged.values()) + sum(a for _, a in refunds.values())
