"""Store benchmark: paid calls per second on the harness's book, SQLite
against PostgreSQL shared by several harness processes.

Usage: ``python bench/store_bench.py [--quick] [--seconds S] [--callers N]``

Each configuration runs real Harness processes (this script re-run with
``--worker``), each serving one paid tool (1 atom) to its own peers and
making keyed paid calls from ``--callers`` concurrent callers (default 8)
straight through ``Harness.call``: the callKey claim, the debit and journal
transaction, the handler and the completion transaction, with no transport
in the way (bench/harness_bench.py measures the path over the fabric).
Every tenth call repeats the caller's previous callKey, which must be
answered from the journal without a second charge. Configurations:

* ``sqlite``: one process, ``<tmp>/brmcp.sqlite3`` (the embedded
  baseline: one writer at a time, group-committed);
* ``postgresql xN``: N = 1, 2, 4 processes on one fresh database of a
  private PostgreSQL server this script starts on a Unix socket in a
  temporary directory (:mod:`brmcp.testing.pgserver`; ``fsync=off``, so the
  figure is the book's concurrency, not the disk's).

The processes start calling together (each holds on stdin until all are
ready) and call for ``--seconds`` (default 10, ``--quick`` 3); a figure is
the sum of the processes' calls over their window. After each run the book
is read back and checked: the credits equal the balances plus the net
charges (every atom accounted for), each (peer, callKey) is charged exactly
once, and the keys charged are exactly those the callers used. It prints
``books exact`` or ``MISS`` with what differs.

Target: PostgreSQL at 4 processes >= 2x PostgreSQL at 1 process (the book
scales near-linearly with processes); SQLite is printed as the baseline,
without a target. Figures are for this machine and run only. The ``cores``
column says what bounds them: one harness process and its server backend
answer each other in turn, so x1 keeps about one core busy, and on a
2-core machine x4 cannot pass about 2 cores' worth, i.e. about 2x x1 at
best, less whatever else runs on the machine; ``retried`` counts the
transactions the book rolled back (0 when processes serve different
callers: the paid-call path conflicts only on the same balance or
callKey, brmcp/server/store/postgres/paidcalls.py). When
PostgreSQL is not available the reason is printed and SQLite alone is
measured. The exit status is 0 either way: this is a report, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import uid
from brmcp.testing.pgserver import PostgresServer, ServerUnavailable, start_server

PRICE = 1
CREDIT = 10**12
#: Peers per process (each caller uses one of them, round robin).
PEERS_PER_PROCESS = 4
#: PostgreSQL at 4 processes over PostgreSQL at 1 process.
SCALE_TARGET = 2.0
#: Every REPEAT_EVERY-th call repeats the previous callKey.
REPEAT_EVERY = 10
WARMUP_CALLS = 20


def _peers(index: int) -> list[str]:
    return [uid(100 + index * PEERS_PER_PROCESS + n) for n in range(PEERS_PER_PROCESS)]


def _emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


# -- the worker process ------------------------------------------------------------------------


async def _worker(store: str, data_dir: str, index: int, seconds: float, callers: int) -> None:
    peers = _peers(index)
    config = HarnessConfig(
        store=store,
        data_dir=data_dir or None,
        allowed_peers=set(peers),
        calls_per_minute=10**9,
    )
    harness = Harness(config)

    @harness.tool(price_atoms=PRICE, description="paid work")
    async def work(ctx: CallContext, i: int) -> dict[str, Any]:
        return {"i": i}

    spec = next(t for t in harness.tools() if t.name == "work")
    keys: set[tuple[str, str]] = set()
    async with harness:
        for peer in peers:
            await harness.credit(peer, CREDIT)

        async def one(peer: str, key: str, i: int) -> None:
            args = {"i": i}
            with anyio.CancelScope(shield=True):
                result = await harness.call(peer, spec, args, args, key)
            if result.is_error:
                raise RuntimeError(f"paid call {key} failed: {result.content}")
            keys.add((peer, key))

        for n in range(WARMUP_CALLS):
            await one(peers[n % len(peers)], f"p{index}-warm-{n}", n)
        _emit("ready")
        await anyio.to_thread.run_sync(sys.stdin.readline)
        counts = [0] * callers
        cpu_start = time.process_time()
        start = time.perf_counter()
        deadline = start + seconds

        async def caller(c: int) -> None:
            peer = peers[c % len(peers)]
            n = 0
            previous = ""
            while time.perf_counter() < deadline:
                n += 1
                key = previous if previous and n % REPEAT_EVERY == 0 else f"p{index}-c{c}-{n}"
                await one(peer, key, n)
                previous = key
                counts[c] += 1

        async with anyio.create_task_group() as tg:
            for c in range(callers):
                tg.start_soon(caller, c)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        executor = harness._accounts.executor  # internal counter, for the report only
        retries = int(getattr(executor, "retries", 0))
        _emit(
            json.dumps(
                {
                    "calls": sum(counts),
                    "elapsed": elapsed,
                    "keys": sorted(f"{peer} {key}" for peer, key in keys),
                    "credited": CREDIT * len(peers),
                    "retries": retries,
                    "cpu": cpu,
                }
            )
        )
        # The connection stays open until the parent has read the server's
        # CPU figures (a backend's ticks vanish with it).
        await anyio.to_thread.run_sync(sys.stdin.readline)


# -- the parent: runs, books, table ------------------------------------------------------------


@dataclass
class Run:
    """One configuration's run: calls/s, the books' verdict, conflicts retried."""

    rate: float
    books: str
    retries: int
    calls: int = 0
    details: list[str] = field(default_factory=list)
    #: Cores the harness processes and the PostgreSQL server kept busy.
    harness_cores: float = 0.0
    server_cores: float = 0.0


def _server_ticks(server: PostgresServer | None) -> dict[int, int]:
    """CPU clock ticks (user + system) used so far by each of the private
    server's processes (the postmaster and its backends), by pid; empty
    when unknown."""
    if server is None:
        return {}
    try:
        master = int((server.socket_dir / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # fields[1] is the parent pid, fields[11] and fields[12] utime and stime.
        if int(entry) == master or int(fields[1]) == master:
            ticks[int(entry)] = int(fields[11]) + int(fields[12])
    return ticks


def _book_rows(store: str, data_dir: str) -> tuple[list[tuple[str, str, int, str]], list[tuple[str, int]]]:
    """``(movements as (peer, kind, atoms, call_key or ""), balances as
    (peer, atoms))`` read back from the store after the processes exited."""
    movements_sql = "SELECT peer, kind, atoms, coalesce(call_key, '') FROM movements"
    balances_sql = "SELECT peer, atoms FROM balances"
    if store == "sqlite:":
        conn = sqlite3.connect(os.path.join(data_dir, "brmcp.sqlite3"))
        try:
            movements = conn.execute(movements_sql).fetchall()
            balances = conn.execute(balances_sql).fetchall()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(store) as pg:
            movements = pg.execute(movements_sql).fetchall()
            balances = pg.execute(balances_sql).fetchall()
    return movements, balances


def check_books(store: str, data_dir: str, results: list[dict[str, Any]]) -> list[str]:
    """What differs between the book and what the processes did (empty when
    the books are exact): credits = balances + net charges, one charge per
    (peer, callKey), and the charged keys are exactly the keys used."""
    movements, balances = _book_rows(store, data_dir)
    problems: list[str] = []
    credits = sum(atoms for _, kind, atoms, _ in movements if kind in ("credit", "tip"))
    charges = -sum(atoms for _, kind, atoms, _ in movements if kind not in ("credit", "tip"))
    held = sum(atoms for _, atoms in balances)
    if credits != held + charges:
        problems.append(f"credits {credits} != balances {held} + net charges {charges}")
    expected_credit = sum(int(r["credited"]) for r in results)
    if credits != expected_credit:
        problems.append(f"credits {credits} != {expected_credit} credited")
    charged: dict[str, int] = {}
    for peer, kind, _, key in movements:
        if kind == "charge":
            charged[f"{peer} {key}"] = charged.get(f"{peer} {key}", 0) + 1
    twice = [key for key, n in charged.items() if n != 1]
    if twice:
        problems.append(f"{len(twice)} callKeys charged more than once (e.g. {twice[0]})")
    used = {key for r in results for key in r["keys"]}
    if set(charged) != used:
        problems.append(
            f"{len(used - set(charged))} keys used but not charged, "
            f"{len(set(charged) - used)} charged but not used"
        )
    if charges != PRICE * len(used):
        problems.append(f"net charges {charges} != {PRICE} x {len(used)} keys")
    return problems


def run_config(
    store: str, processes: int, seconds: float, callers: int, server: PostgresServer | None = None
) -> Run:
    """Start ``processes`` workers on ``store``, let them call together for
    ``seconds``, collect their figures and check the book."""
    with tempfile.TemporaryDirectory(prefix="brmcp-store-bench-") as data_dir:
        argv = [sys.executable, __file__, "--worker", store, data_dir if store == "sqlite:" else ""]
        workers: list[subprocess.Popen[str]] = []
        try:
            # One at a time: a harness's start-up reconciles the shared book
            # (refunds calls a dead process left), so no sibling may have a
            # call in flight while another starts.
            for i in range(processes):
                worker = subprocess.Popen(
                    [*argv, str(i), str(seconds), str(callers)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                workers.append(worker)
                assert worker.stdout is not None
                line = worker.stdout.readline().strip()
                if line != "ready":
                    raise RuntimeError(f"a worker did not start (said {line!r}; exit {worker.poll()})")
            ticks = _server_ticks(server)
            wall = time.perf_counter()
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
            results = []
            for worker in workers:
                assert worker.stdout is not None
                results.append(json.loads(worker.stdout.readline()))
            after = _server_ticks(server)
            wall = time.perf_counter() - wall
            used = sum(max(0, n - ticks.get(pid, 0)) for pid, n in after.items())
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write("done\n")
                worker.stdin.flush()
                worker.wait(timeout=60)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        problems = check_books(store, data_dir, results)
    rate = sum(r["calls"] / r["elapsed"] for r in results)
    return Run(
        rate=rate,
        books="books exact" if not problems else "MISS: " + "; ".join(problems),
        retries=sum(int(r["retries"]) for r in results),
        calls=sum(int(r["calls"]) for r in results),
        details=problems,
        harness_cores=sum(float(r["cpu"]) for r in results) / seconds,
        server_cores=used / os.sysconf("SC_CLK_TCK") / wall,
    )


def measure(server: PostgresServer | None, rounds: int, seconds: float, callers: int) -> dict[str, Run]:
    """Every configuration ``rounds`` times, interleaved; the median rate of
    each (the books of every round must be exact)."""
    configs: list[tuple[str, int]] = [("sqlite", 1)]
    if server is not None:
        configs += [("postgresql", 1), ("postgresql", 2), ("postgresql", 4)]
    runs: dict[str, list[Run]] = {}
    for _ in range(rounds):
        for backend, processes in configs:
            name = "sqlite" if backend == "sqlite" else f"postgresql x{processes}"
            if server is None or backend == "sqlite":
                runs.setdefault(name, []).append(run_config("sqlite:", processes, seconds, callers))
                continue
            url = server.create_database("bench")
            try:
                runs.setdefault(name, []).append(run_config(url, processes, seconds, callers, server))
            finally:
                server.drop_database(url)
    out: dict[str, Run] = {}
    for name, items in runs.items():
        bad = [run.books for run in items if run.details]
        out[name] = Run(
            rate=statistics.median(run.rate for run in items),
            books=bad[0] if bad else "books exact",
            retries=sum(run.retries for run in items),
            calls=sum(run.calls for run in items),
            details=[d for run in items for d in run.details],
            harness_cores=statistics.median(run.harness_cores for run in items),
            server_cores=statistics.median(run.server_cores for run in items),
        )
    return out


def report(results: dict[str, Run], callers: int) -> None:
    header = f"{'store':<16} {'processes':>9} {'paid calls/s':>13} {'calls':>8} {'retried':>8} {'cores':>9}"
    print(f"{header}  books")
    for name, run in results.items():
        processes = name.rsplit("x", 1)[1] if "x" in name else "1"
        cores = (
            f"{run.harness_cores:.1f}"
            if name == "sqlite"
            else f"{run.harness_cores:.1f}+{run.server_cores:.1f}"
        )
        row = f"{name:<16} {processes:>9} {run.rate:>13.0f} {run.calls:>8} {run.retries:>8} {cores:>9}"
        print(f"{row}  {run.books}")
    print()
    print(f"{callers} callers per process; sqlite is the embedded baseline (no target).")
    print("retried: transactions rolled back on a serialization conflict and run again.")
    print("cores: CPU seconds per second of the harness processes (+ the PostgreSQL server).")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end")
    if "postgresql x1" in results and "postgresql x4" in results:
        scale = results["postgresql x4"].rate / results["postgresql x1"].rate
        verdict = "PASS" if scale >= SCALE_TARGET else "MISS"
        print(f"postgresql x4 / x1: {scale:.2f}x  target >= {SCALE_TARGET:.1f}x {verdict}")
    exact = all(not run.details for run in results.values())
    print(f"books: {'PASS' if exact else 'MISS'} (credits = balances + charges, every callKey charged once)")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one 3-second round (~30 s in all)")
    parser.add_argument("--seconds", type=float, default=None, help="calling time per run (default 10)")
    parser.add_argument("--callers", type=int, default=8, help="concurrent callers per process")
    parser.add_argument("--worker", nargs=5, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        store, data_dir, index, seconds, callers = args.worker
        anyio.run(_worker, store, data_dir, int(index), float(seconds), int(callers))
        return 0
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    rounds = 1 if args.quick else 3
    print(f"{rounds} round(s) of {seconds:g} s per configuration; paid tool {PRICE} atom, keyed calls")
    try:
        with start_server(max_connections=50) as server:
            print(f"postgresql: private server on {Path(server.socket_dir)} (Unix socket, fsync=off)")
            print()
            results = measure(server, rounds, seconds, args.callers)
    except ServerUnavailable as exc:
        print(f"postgresql: not measured: {exc}")
        print()
        results = measure(None, rounds, seconds, args.callers)
    report(results, args.callers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
