"""The ``brmcp`` command (also ``python -m brmcp``).

Subcommands: ``demo`` runs the end-to-end demo (see :mod:`brmcp.demo`);
``version`` prints ``brmcp <version>``, the same line as ``brmcp --version``.
The operator tools have their own commands: ``brmcp-serve``,
``brmcp-bridge`` and ``brmcp-fakebr``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _version_line() -> str:
    """``brmcp <version>``: what both ``brmcp version`` and ``brmcp --version`` print."""
    from . import __version__

    return f"brmcp {__version__}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brmcp",
        description="MCP over Bison Relay private messages, with per-call tool payments in BR tips.",
    )
    parser.add_argument("--version", action="version", version=_version_line())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run the end-to-end demo on loopback (fake relay, bot, bridge, paying agent)",
        description=(
            "Start a simulated Bison Relay network with two fake brclients, the brmcp-serve bot and the "
            "brmcp-bridge daemon, then act as a stock MCP agent: list tools, call echo, pay for fortune."
        ),
    )
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="leave the network and the bridge up afterwards and print how to connect other agents",
    )
    demo.add_argument(
        "--latency",
        type=float,
        default=0.0,
        metavar="MS",
        help="relay latency per PM in milliseconds, e.g. 1500 to feel a real relay (default 0); with "
        "--network real, added one way to every message a client sends to the relay",
    )
    demo.add_argument(
        "--network",
        choices=("fake", "real"),
        default="fake",
        help="fake: the in-memory relay (default); real: a real bisonrelay relay and clients on loopback "
        "(brnet, built with Go on first use)",
    )
    demo.add_argument("--port", type=int, default=0, help="bridge port on 127.0.0.1 (default: any free port)")
    demo.add_argument(
        "--datadir",
        type=Path,
        help="keep the demo's certificates, configs and databases in this new or empty directory "
        "(default: a temporary directory, removed afterwards)",
    )
    demo.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="limit for any one step (default 60 s plus 20 times the latency)",
    )
    demo.add_argument("-v", "--verbose", action="store_true", help="show library logs on stderr")
    sub.add_parser("version", help="print the brmcp version (as --version does)")
    parser.set_defaults(demo_parser=demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "version":
        print(_version_line())
        return 0
    if args.command == "demo":
        demo_parser: argparse.ArgumentParser = args.demo_parser
        if args.latency < 0:
            demo_parser.error("--latency must be >= 0")
        if not 0 <= args.port <= 65535:
            demo_parser.error("--port must be between 0 and 65535")
        if args.timeout is not None and args.timeout <= 0:
            demo_parser.error("--timeout must be > 0")
        from .demo import DemoOptions, demo_main

        options = DemoOptions(
            latency_ms=args.latency,
            port=args.port,
            datadir=args.datadir,
            keep_running=args.keep_running,
            step_timeout=args.timeout,
            network=args.network,
        )
        return demo_main(options, verbose=args.verbose)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
