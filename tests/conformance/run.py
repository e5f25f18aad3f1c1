"""Run the MCP conformance suite against the bridge and print the results.

    python -m tests.conformance.run [--gateway] [--scenario NAME] [--keep DIR] [--verbose]

Starts the stack of ``stack.py`` (fabric, harness bot with the fixture
tools, bridge, bearer proxy), runs the pinned suite in server mode, prints
one line per scenario and the comparison with ``baseline.yml``. With
``--gateway`` the bot is a brmcp gateway in front of server-everything
(``gateway_stack.py``) and the baseline is ``gateway_baseline.yml``. Exits 0
when the results match the baseline, 1 on a new failure or a stale baseline
entry, 2 when the node tools are missing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio

from .gateway_stack import everything_argv, gateway_conformance_stack
from .nodetools import node_tools_for
from .stack import CLIENT, conformance_stack
from .suite import BASELINE, SPEC_VERSION, SUITE, run_suite

GATEWAY_BASELINE = Path(__file__).with_name("gateway_baseline.yml")


async def _main(args: argparse.Namespace) -> int:
    tools = node_tools_for("conformance")
    if isinstance(tools, str):
        print(tools, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="brmcp-conformance-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        baseline = BASELINE
        if args.gateway:
            argv = everything_argv(tools)
            if argv is None:
                print("server-everything is not installed: run .ci/node-tools", file=sys.stderr)
                return 2
            chain = gateway_conformance_stack(workdir, argv)
            baseline = GATEWAY_BASELINE
        else:
            chain = conformance_stack(workdir)
        async with chain as stack:
            print(f"node {tools.node_version}; suite {SUITE}, spec {SPEC_VERSION}; endpoint {stack.url}")
            started = time.monotonic()
            report = await run_suite(
                tools, stack.url, workdir / "results", scenario=args.scenario, baseline_path=baseline
            )
            elapsed = time.monotonic() - started
            spent = sum(atoms for _, atoms in stack.payer.payments)
            balance = await stack.harness.balance(CLIENT)
        if args.verbose:
            print(report.output)
        print(report.table())
        print(
            f"suite exit code {report.exit_code}; {elapsed:.1f} s; "
            f"payments {len(stack.payer.payments)} ({spent} atoms); bot balance left {balance} atoms"
        )
    return 1 if report.new_failures or report.stale or report.missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--gateway", action="store_true", help="the bot is a brmcp gateway in front of server-everything"
    )
    parser.add_argument("--scenario", help="run one scenario instead of the whole server suite")
    parser.add_argument("--keep", metavar="DIR", help="keep data and results under DIR")
    parser.add_argument("--verbose", action="store_true", help="print the suite's own output too")
    args = parser.parse_args(argv)
    return anyio.run(_main, args)


if __name__ == "__main__":
    sys.exit(main())
