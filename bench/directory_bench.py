"""Directory search: the FTS5 index against the linear scan, measured in one run.

Usage: ``python bench/directory_bench.py [--quick] [--seed N]``

For 1k, 10k and 100k synthetic listings (2 to 8 tools each, names and
descriptions drawn from a word list, 1 to 3 tags, fixed and dynamic prices)
it builds the index (brmcp/directory/db/_search.py) in a temporary SQLite file
and times a fixed set of queries three ways: the linear scan the Go
reference does (``search_listings`` over the listings already in memory:
no database read is charged to it), the index in its default catalog order
and the index ranked by relevance. Each figure is p50 / p95 over every
query's repetitions, in milliseconds; ``ratio`` is the scan's p50 over the
index's. Before timing, every query's default answer is checked equal to
the scan's.

Targets: the index >= 10x faster than the scan at 10k (p50), and sub-linear
growth from 10k to 100k (the index's p50 at 100k under 10x its p50 at 10k).
A missed target is marked MISS. ``--quick`` runs 1k and 10k with fewer
repetitions (a smoke run; the growth target then reads n/a).
The exit status is 0 either way: this is a report, not a test.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import brmcp.directory.db as search_index
from brmcp.directory.db import Listing
from brmcp.directory.model import TestSpec
from brmcp.directory.tools import search_listings

SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 10_000)
SPEEDUP_TARGET = 10.0
SPEEDUP_AT = 10_000
NOW = 1_790_000_000

_WORDS = (
    "weather forecast city radar rain snow wind temperature humidity alert storm map route traffic "
    "transit train bus flight airport hotel booking price stock market crypto exchange rate currency "
    "convert translate language text summary summarize document pdf image photo resize crop video audio "
    "speech transcribe voice music playlist search index query database table record user account email "
    "calendar event reminder note todo task project issue ticket code review repository commit branch "
    "build deploy server cluster metric log trace error monitor status health check uptime domain dns "
    "certificate security scan vulnerability password hash encrypt decrypt sign verify key wallet invoice "
    "payment tip balance ledger report chart graph statistic average median random number dice quote "
    "fortune joke poem story recipe food restaurant menu nutrition calorie fitness workout sleep news "
    "headline article feed rss blog post comment review rating score game chess puzzle word dictionary "
    "definition synonym grammar spell lookup geocode address postal distance elevation satellite orbit "
    "planet star moon tide earthquake volcano flood fire air quality pollen pollution energy solar grid"
)
_VERBS = "get list find fetch make run check lookup create update compute render"
_TAGS = (
    "weather maps finance crypto media text dev ops security fun food health news games reference "
    "science travel payments data ai"
)
WORDS, VERBS, TAGS = (tuple(text.split()) for text in (_WORDS, _VERBS, _TAGS))

#: (label, the search's arguments).
QUERIES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("common word", {"query": "weather"}),
    ("substring", {"query": "eath"}),
    ("two words", {"query": "rain alert"}),
    ("tool name", {"query": "get_orbit"}),
    ("two letters", {"query": "sn"}),
    ("no match", {"query": "zzqx"}),
    ("tag only", {"tags": ["weather", "maps"]}),
    ("price ceiling", {"query": "map", "maxPriceAtoms": 500}),
    ("everything", {}),
)


def synth_listings(count: int, seed: int) -> list[Listing]:
    """``count`` listings with uids in random order and realistic catalogs."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        tools = []
        for _ in range(rng.randint(2, 8)):
            name = f"{rng.choice(VERBS)}_{rng.choice(WORDS)}"
            tool: dict[str, Any] = {
                "name": name,
                "description": " ".join(rng.choices(WORDS, k=rng.randint(6, 18))).capitalize() + ".",
                "inputSchema": {"type": "object"},
            }
            if rng.random() < 0.1:
                tool["_meta"] = {"brmcp/pricing": "dynamic"}
            else:
                tool["_meta"] = {"brmcp/priceAtoms": rng.choice((0, 10, 100, 400, 1_000, 5_000))}
            tools.append(tool)
        uid = f"{rng.getrandbits(256):064x}"
        out.append(
            Listing(
                uid=uid,
                description=f"provider {index}",
                tags=tuple(rng.sample(TAGS, rng.randint(1, 3))),
                test=TestSpec(tool=tools[0]["name"], args=None, max_atoms=1_000),
                catalog=json.dumps(tools, separators=(",", ":")),
                catalog_checked_at=NOW - rng.randint(0, 40 * 86_400),
                last_verified_execution=NOW - rng.randint(0, 40 * 86_400),
                test_latency_ms=rng.randint(50, 900),
                approved_at=NOW - 90 * 86_400,
                renewed_at=0,
                expires_at=NOW + 30 * 86_400,
            )
        )
    return out


def build(path: Path, listings: list[Listing]) -> tuple[sqlite3.Connection, float]:
    """The index of ``listings`` in a fresh SQLite file, built in one
    transaction as ``ensure_index`` does on open; returns it and the seconds."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    start = time.perf_counter()
    conn.execute("BEGIN")
    search_index.create_index(conn)
    search_index.rebuild_index(conn, listings)
    conn.execute("COMMIT")
    return conn, time.perf_counter() - start


def timed(func: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        func()
        out.append((time.perf_counter() - start) * 1_000)
    return out


def p50_p95(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def bench_size(count: int, seed: int, quick: bool, work: Path) -> dict[str, tuple[float, float]]:
    listings = synth_listings(count, seed)
    tools = sum(len(json.loads(item.catalog)) for item in listings)
    conn, seconds = build(work / f"dir{count}.sqlite3", listings)
    print(f"{count:>7,} listings, {tools:>7,} tools: index built in {seconds:6.2f} s")
    scan_repeat = 1 if quick or count >= 100_000 else 3
    index_repeat = 5 if quick else 20
    samples: dict[str, list[float]] = {"scan": [], "catalog": [], "relevance": []}
    for label, args in QUERIES:
        request = search_index.SearchRequest.from_json(args)
        relevance = search_index.SearchRequest.from_json({**args, "rank": "relevance"})
        want = search_listings(listings, request.base).to_json()
        got = search_index.search(conn, request, NOW).to_json()
        if got != want:
            raise SystemExit(f"{count} listings, query {label!r}: the index and the scan disagree")
        samples["scan"] += timed(partial(search_listings, listings, request.base), scan_repeat)
        samples["catalog"] += timed(partial(search_index.search, conn, request, NOW), index_repeat)
        samples["relevance"] += timed(partial(search_index.search, conn, relevance, NOW), index_repeat)
    conn.close()
    return {name: p50_p95(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1k and 10k, fewer repetitions (a smoke run)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the synthetic catalogs (default 7)")
    args = parser.parse_args(argv)
    print(
        f"brmcp directory search benchmark, Python {sys.version.split()[0]}, "
        f"SQLite {sqlite3.sqlite_version}, {'quick' if args.quick else 'full'} run, wall clock, "
        f"{len(QUERIES)} queries"
    )
    results: dict[int, dict[str, tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="brmcp-dirbench-") as tmp:
        for count in QUICK_SIZES if args.quick else SIZES:
            results[count] = bench_size(count, args.seed, args.quick, Path(tmp))
    print()
    print(
        f"{'listings':>9} | {'scan p50/p95 ms':>17} | {'index p50/p95 ms':>17} | {'ratio':>7} | "
        f"{'relevance p50/p95':>17} | target"
    )
    checks: list[bool] = []
    for count, figures in results.items():
        scan, index, rank = figures["scan"], figures["catalog"], figures["relevance"]
        ratio = scan[0] / index[0] if index[0] else float("inf")
        mark = ""
        if count == SPEEDUP_AT:
            ok = ratio >= SPEEDUP_TARGET
            checks.append(ok)
            mark = f">= {SPEEDUP_TARGET:.0f}x {'PASS' if ok else 'MISS'}"
        print(
            f"{count:>9,} | {scan[0]:8.2f}/{scan[1]:8.2f} | {index[0]:8.3f}/{index[1]:8.3f} | "
            f"{ratio:6.1f}x | {rank[0]:8.3f}/{rank[1]:8.3f} | {mark}"
        )
    if 100_000 in results and SPEEDUP_AT in results:
        for name, label in (("catalog", "index"), ("relevance", "relevance")):
            growth = results[100_000][name][0] / results[SPEEDUP_AT][name][0]
            ok = growth < 100_000 / SPEEDUP_AT
            checks.append(ok)
            print(
                f"{label} p50 growth 10k -> 100k: {growth:5.2f}x (sub-linear: < 10x) "
                f"{'PASS' if ok else 'MISS'}"
            )
    else:
        print("growth 10k -> 100k: n/a (quick run)")
    missed = checks.count(False)
    print(f"{len(checks) - missed}/{len(checks)} targets met" + (f", {missed} MISS" if missed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
