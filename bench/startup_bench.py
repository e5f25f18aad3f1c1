"""Startup benchmark: how long each console command takes to print its
version or help, or to answer a command that only talks to a running daemon,
against a bare interpreter measured in the same run.

Usage: ``python bench/startup_bench.py [--quick] [--runs N] [--only NAME]``

Each command line runs ``--runs`` times (default 7, ``--quick`` 3) as a
subprocess, through the console script installed next to this interpreter
(``brmcp-bridge``, ...) or ``python -m`` when the script is missing; the
baseline is ``python -c pass``, run the same number of times and
interleaved with the commands so that load on the machine weighs on both.
The daemon commands run against an empty temporary data directory, so they
take the path that finds no daemon and says so: the same imports as talking
to one, without its answer time. Printed per command line: the median wall
time, the baseline's, their ratio, and ``MISS`` where the median is over
the target.

Target: every line <= 0.3 s wall on this machine (what a person typing the
command notices; the bulk of a slow start is importing the MCP SDK, the web
server and the daemon, which these commands must not load:
tests/commands/test_startup_imports.py holds that by module set). Figures
are for this machine and run only. The exit status is 0 either way: this is
a report, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Wall seconds a command line may take.
TARGET_SECONDS = 0.3


def _command_lines(datadir: str) -> list[tuple[str, list[str]]]:
    """(console script, arguments) for every line measured."""
    bridge = ["--datadir", datadir]
    lines: list[tuple[str, list[str]]] = []
    for script in ("brmcp", "brmcp-fakebr", "brmcp-serve", "brmcp-bridge", "brmcpdir"):
        lines += [(script, ["--version"]), (script, ["--help"])]
    for command in ("settings", "approvals", "spend", "ui", "receipts", "find --help"):
        lines.append(("brmcp-bridge", [*bridge, *command.split()]))
    for command in ("stats", "balances"):
        lines.append(("brmcp-serve", ["--datadir", datadir, command]))
    return lines


#: ``python -m`` module of each console script (pyproject.toml [project.scripts]).
_MODULES = {
    "brmcp": "brmcp",
    "brmcp-fakebr": "brmcp.testing.fakebr",
    "brmcp-serve": "brmcp.serve",
    "brmcp-bridge": "brmcp.bridge.cli",
    "brmcpdir": "brmcp.directory",
}


def _argv(script: str, args: list[str]) -> list[str]:
    installed = Path(sys.executable).with_name(script)
    if installed.exists():
        return [str(installed), *args]
    return [sys.executable, "-m", _MODULES[script], *args]


def _wall(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 runs per line")
    parser.add_argument("--runs", type=int, default=None, help="runs per line (default 7)")
    parser.add_argument("--only", default=None, help="only the lines of this console script")
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 7)
    datadir = tempfile.mkdtemp(prefix="brmcp-startup-")
    # No browser, no pager, no colour: the lines must not wait on anything.
    env = {**os.environ, "BROWSER": "true", "PAGER": "cat", "NO_COLOR": "1"}
    lines = [line for line in _command_lines(datadir) if args.only in (None, line[0])]
    baseline: list[float] = []
    times: dict[int, list[float]] = {i: [] for i in range(len(lines))}
    try:
        for _ in range(runs):
            for i, (script, rest) in enumerate(lines):
                times[i].append(_wall(_argv(script, rest), env))
                if i % 4 == 0:
                    baseline.append(_wall([sys.executable, "-c", "pass"], env))
    finally:
        shutil.rmtree(datadir, ignore_errors=True)
    base = statistics.median(baseline)
    print(f"startup, median of {runs} runs; baseline python -c pass: {base:.3f} s")
    print(f"target: <= {TARGET_SECONDS} s wall per line")
    print(f"{'command':<44} {'median s':>9} {'base s':>7} {'ratio':>6}")
    misses = 0
    for i, (script, rest) in enumerate(lines):
        median = statistics.median(times[i])
        shown = " ".join([script, *rest]).replace(datadir, "DIR")
        miss = median > TARGET_SECONDS
        misses += miss
        print(f"{shown:<44} {median:>9.3f} {base:>7.3f} {median / base:>6.1f}{'  MISS' if miss else ''}")
    print(f"{len(lines) - misses}/{len(lines)} within {TARGET_SECONDS} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
