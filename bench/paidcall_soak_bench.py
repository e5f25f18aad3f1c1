"""Paid-call soak benchmark: throughput of paid calls through the
bridge under faults, and the books of each run.

Run: ``python bench/paidcall_soak_bench.py`` (10 seeds of 200 calls from 8
agents, a few minutes) or ``--seeds 1 --calls 100`` for a quick look.

Each run is the soak of ``tests/kit/soak.py``: a fabric that drops 5 %,
duplicates 5 % and reorders PMs, the bot offline at random, impatient agents
that time out and retry. Per seed it prints the tally line (calls/s,
attempts, agent timeouts, errors, payments, executions, credit left, PMs
dropped/duplicated, offline periods, bridge re-sends) and PASS when the
books balance to the atom (payments = received results x price + credit
left at the bot, every execution received, none twice, every call
answered); then the mean throughput. A fault-free run of the same size is
the baseline measured in the same process, so the ratio is comparable
across machines. Figures are for this machine and run only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kit.soak import run_soak


async def _main(seeds: list[int], calls: int, agents: int) -> int:
    failures = 0
    rates: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = await run_soak(Path(tmp) / "baseline", seed=0, calls=calls, agents=agents, faults=False)
        print(f"baseline (no faults, no chaos): {base.line()}")
        for seed in seeds:
            tally = await run_soak(Path(tmp) / f"seed-{seed}", seed=seed, calls=calls, agents=agents)
            problems = tally.problems()
            failures += bool(problems)
            rates.append(tally.calls / tally.seconds)
            print(("PASS " if not problems else "FAIL ") + tally.line())
            for problem in problems:
                print(f"     {problem}")
    mean = statistics.mean(rates)
    base_rate = base.calls / base.seconds
    print(
        f"throughput under faults: {mean:.1f} paid calls/s mean over {len(seeds)} seeds;"
        f" fault-free {base_rate:.1f} calls/s; ratio {mean / base_rate:.2f}"
    )
    print(f"{len(seeds) - failures} of {len(seeds)} seeds balanced")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="number of seeds (1..N)")
    parser.add_argument("--first", type=int, default=1, help="first seed")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--agents", type=int, default=8)
    args = parser.parse_args()
    seeds = list(range(args.first, args.first + args.seeds))
    return anyio.run(_main, seeds, args.calls, args.agents)


if __name__ == "__main__":
    raise SystemExit(main())
