"""Peak memory of a server-role Router under a hostile allowed peer, against
its configured bounds (WIRE.md §Inboxes, SECURITY.md).

Usage: ``python bench/memory_bench.py [--big N] [--small N]``

Runs ``python -m brmcp.testing.memattack`` twice in fresh processes (session
readers not yielding, then yielding): complete and incomplete messages of
16 MiB, 4 MiB and 1 MiB plus thousands of small ones across 40+ sids, and
16 MiB messages that decode to ~350 MiB. For each it prints the peak RSS
growth over the process's baseline, the bound (reassembly global bound +
peer inbox bound + the documented constant) and their ratio, PASS when the
peak is within the bound. Linux only. The exit status is 0 either way: this is
a report, not a test (tests/transport/test_memory_bounds.py is the test).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", type=int, default=24, help="rounds of 16/4/1 MiB messages (default 24)")
    parser.add_argument("--small", type=int, default=3000, help="small messages per flood (default 3000)")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    head = f"{'mode':22s} {'messages':>8s} {'PMs':>7s} {'peak MiB':>9s}"
    print(f"{head} {'bound MiB':>9s} {'ratio':>6s} {'s':>6s}")
    for extra in ([], ["--yield"]):
        cmd = [sys.executable, "-m", "brmcp.testing.memattack", "--json", "--big", str(args.big)]
        cmd += ["--small", str(args.small), *extra]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        r = json.loads(done.stdout)
        ratio = r["peak_growth_mib"] / r["bound_mib"]
        verdict = "PASS" if ratio <= 1 else "MISS"
        print(
            f"{r['mode']:22s} {r['messages_sent']:8d} {r['pms_sent']:7d} {r['peak_growth_mib']:9.1f} "
            f"{r['bound_mib']:9.1f} {ratio:6.2f} {r['seconds']:6.1f} {verdict}"
        )
    print(
        f"bound = reassembly {r['assembler_bound_mib']:.0f} MiB + peer inbox "
        f"{r['peer_inbox_bound_mib']:.0f} MiB + constant {r['constant_mib']:.0f} MiB "
        "(one message's text and decode transient, allocator slack)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
