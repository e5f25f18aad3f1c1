"""Harness benchmark: the cost of paid, keyed, durable calls against free
calls, end to end over the fabric with the official SDK client.

Run: ``python bench/harness_bench.py`` (about a minute) or ``--quick``.

One Harness (built-in SQLite ledger: WAL, synchronous=FULL) serves two
tools doing the same trivial work: ``free`` (price 0, called without a
callKey) and ``paid`` (1 atom, each call with a fresh ``brmcp/callKey``, so
every call is a debit + journal transaction and a completion transaction,
both fsynced). For each concurrency level (callers = SDK sessions of one
peer, each making sequential calls) the two kinds run in alternating short
batches so load on a shared machine hits both alike; the median of the
per-pair ratios paid/free is compared with the 0.5 target.

A ticker task sleeping 1 ms measures event-loop lag (how late it wakes)
during the free and the paid batches: the money path must not block the
loop, so paid lag should look like free lag (p99 compared; the max column
also catches the interpreter's own full garbage collections, whose longest
pause is printed alongside).

The same run also times bare durable commits (WAL, synchronous=FULL) on
the same disk: a paid call at one caller needs two of them in sequence (the
debit + journal before the handler, the completion after it), which bounds
the ratio one caller can reach no matter how cheap everything else is.

Prints PASS/MISS per target. Figures are for this machine and run only.
"""

from __future__ import annotations

import argparse
import gc
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp.types as types
from mcp import ClientSession

from brmcp import RouterOptions
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, uid

BOT = uid(1)
ALICE = uid(2)
RATIO_TARGET = 0.5
#: Max event-loop lag during paid calls must stay within this of the free calls' lag.
LAG_TARGET_MS = 5.0


@dataclass
class Lag:
    """Event-loop lag samples (seconds late), per phase, and the longest
    garbage-collector pause per phase."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    gc_pauses: dict[str, float] = field(default_factory=dict)
    phase: str = "idle"
    _gc_start: float = 0.0

    def on_gc(self, stage: str, info: dict[str, Any]) -> None:
        if stage == "start":
            self._gc_start = time.perf_counter()
        else:
            pause = time.perf_counter() - self._gc_start
            self.gc_pauses[self.phase] = max(self.gc_pauses.get(self.phase, 0.0), pause)

    async def ticker(self) -> None:
        period = 0.001
        while True:
            start = time.perf_counter()
            await anyio.sleep(period)
            late = time.perf_counter() - start - period
            self.samples.setdefault(self.phase, []).append(late)

    def summary(self, phase: str) -> tuple[float, float]:
        """(p99, max) in milliseconds."""
        values = sorted(self.samples.get(phase, [0.0]))
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        return p99 * 1e3, values[-1] * 1e3


def commit_latency(directory: str, samples: int = 300) -> float:
    """Median seconds of one small durable commit (WAL, synchronous=FULL)
    in a scratch database next to the benchmark's."""
    path = os.path.join(directory, "fsync-probe.sqlite3")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER)")
        times = []
        for i in range(samples):
            start = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR REPLACE INTO t (k, v) VALUES (?, ?)", (i % 16, i))
            conn.execute("COMMIT")
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        conn.close()


def build(data_dir: str) -> Harness:
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir,
            allowed_peers={ALICE},
            calls_per_minute=10**9,
            router_options=RouterOptions(max_sessions_per_peer=64),
        )
    )

    @harness.tool(description="free work")
    async def free(ctx: CallContext, i: int) -> dict[str, Any]:
        return {"i": i}

    @harness.tool(price_atoms=1, description="paid work")
    async def paid(ctx: CallContext, i: int) -> dict[str, Any]:
        return {"i": i}

    return harness


class Caller:
    def __init__(self, session: ClientSession, index: int) -> None:
        self.session = session
        self.index = index
        self.n = 0

    async def call(self, tool: str) -> None:
        self.n += 1
        meta: Any = None
        if tool == "paid":
            meta = {"brmcp/callKey": f"bench-{self.index}-{self.n:09d}"}
        params = types.CallToolRequestParams(name=tool, arguments={"i": self.n}, _meta=meta)
        result = await self.session.send_request(types.CallToolRequest(params=params), types.CallToolResult)
        if result.is_error:
            raise RuntimeError(f"{tool} call failed: {result.content}")


async def batch(callers: list[Caller], tool: str, calls_each: int) -> float:
    """Calls per second of ``calls_each`` sequential calls on every caller."""

    async def run(caller: Caller) -> None:
        for _ in range(calls_each):
            await caller.call(tool)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for caller in callers:
            tg.start_soon(run, caller)
    return len(callers) * calls_each / (time.perf_counter() - start)


async def measure(levels: list[int], pairs: int, calls_each: int, data_dir: str) -> dict[int, bool]:
    harness = build(data_dir)
    lag = Lag()
    gc.callbacks.append(lag.on_gc)
    verdicts: dict[int, bool] = {}
    free_call_s: dict[int, float] = {}
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric())
        await stack.enter_async_context(harness)
        router = await harness.start(fabric.sender(BOT))
        fabric.attach(BOT, router.handle_pm)
        client = await stack.enter_async_context(fabric.router(ALICE))
        await harness.credit(ALICE, 10**15)
        callers: list[Caller] = []
        for index in range(max(levels)):
            conn = client.dial(BOT)
            session = await stack.enter_async_context(
                ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=60)
            )
            await session.initialize()
            callers.append(Caller(session, index))
        async with anyio.create_task_group() as tg:
            tg.start_soon(lag.ticker)
            # Warm up both paths (imports, caches, the SQLite page cache).
            await batch(callers[:1], "free", 50)
            await batch(callers[:1], "paid", 50)
            print(f"{'callers':>7} {'free calls/s':>13} {'paid calls/s':>13} {'paid/free':>10}  target")
            for level in levels:
                active = callers[:level]
                ratios, free_rates, paid_rates = [], [], []
                for pair in range(pairs):
                    order = ("free", "paid") if pair % 2 == 0 else ("paid", "free")
                    rates: dict[str, float] = {}
                    for tool in order:
                        lag.phase = f"{tool}-{level}"
                        rates[tool] = await batch(active, tool, calls_each)
                        lag.phase = "idle"
                    ratios.append(rates["paid"] / rates["free"])
                    free_rates.append(rates["free"])
                    paid_rates.append(rates["paid"])
                ratio = statistics.median(ratios)
                verdict = "PASS" if ratio >= RATIO_TARGET else "MISS"
                verdicts[level] = ratio >= RATIO_TARGET
                free_call_s[level] = level / statistics.median(free_rates)
                print(
                    f"{level:>7} {statistics.median(free_rates):>13.0f} "
                    f"{statistics.median(paid_rates):>13.0f} {ratio:>9.2f}x  >= {RATIO_TARGET}x {verdict}"
                )
            tg.cancel_scope.cancel()
        print()
        print("event-loop lag while calls run (1 ms ticker; how late it woke):")
        print(f"{'callers':>7} {'free p99/max ms':>17} {'paid p99/max ms':>17}  {'gc free/paid':>13}  target")
        for level in levels:
            free_p99, free_max = lag.summary(f"free-{level}")
            paid_p99, paid_max = lag.summary(f"paid-{level}")
            good = paid_p99 <= free_p99 + LAG_TARGET_MS
            verdicts[-level] = good
            free_gc = lag.gc_pauses.get(f"free-{level}", 0.0) * 1e3
            paid_gc = lag.gc_pauses.get(f"paid-{level}", 0.0) * 1e3
            verdict = "PASS" if good else "MISS"
            print(
                f"{level:>7} {free_p99:>8.2f}/{free_max:<8.2f} {paid_p99:>8.2f}/{paid_max:<8.2f}  "
                f"{free_gc:>6.1f}/{paid_gc:<6.1f}  paid p99 <= free p99 + {LAG_TARGET_MS:.0f} ms {verdict}"
            )
        executor = harness._accounts.executor  # internal counters, for the report only
        if executor is not None and executor.batches:
            print()
            print(
                f"group commit: {executor.operations} store operations in {executor.batches} "
                f"transactions ({executor.operations / executor.batches:.2f} per transaction)"
            )
    gc.callbacks.remove(lag.on_gc)
    commit = await anyio.to_thread.run_sync(commit_latency, data_dir)
    if 1 in free_call_s:
        free = free_call_s[1]
        print()
        print(
            f"durable commit on this disk: {commit * 1e3:.2f} ms (median). At 1 caller a free call takes "
            f"{free * 1e3:.2f} ms; two sequential commits alone cap paid/free at "
            f"{free / (free + 2 * commit):.2f}x"
        )
    return verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter batches (~15 s)")
    parser.add_argument("--dir", default=None, help="where to put the database (default: a temp dir)")
    args = parser.parse_args()
    pairs, calls_each = (3, 40) if args.quick else (7, 120)
    levels = [1, 4, 16]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="brmcp-bench-") as data_dir:
        print(f"database: {os.path.join(data_dir, 'brmcp.sqlite3')} (WAL, synchronous=FULL)")
        print(f"{pairs} alternating free/paid batch pairs per level; {calls_each} calls in a row per caller")
        print()
        verdicts = anyio.run(measure, levels, pairs, calls_each, data_dir)
    print()
    missed = [f"{abs(k)} callers ({'lag' if k < 0 else 'ratio'})" for k, good in verdicts.items() if not good]
    print("overall:", "PASS" if not missed else "MISS: " + ", ".join(missed))
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
