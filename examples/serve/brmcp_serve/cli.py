"""The ``brmcp-serve`` console command.

``brmcp-serve --datadir DIR``: on the first run it writes ``brmcp-serve.conf``
and ``brmcp.json`` into DIR, says what to edit and exits 0; later runs serve
until SIGINT/SIGTERM, and SIGHUP reloads ``brmcp.json``. Logging follows the
``debug``, ``logfile`` and ``maxlogfiles`` keys of ``brmcp-serve.conf``
(:mod:`brmcp.botlog`); ``--log-level`` replaces ``debug``. Errors are one line
on stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import anyio

from brmcp._console import add_version, quiet_broken_pipe
from brmcp.botlog import LEVEL_CHOICES, LogSetupError, bot_logging
from brmcp.clientrpc import ClientrpcConfigError, load_bot_config
from brmcp.server import HarnessError

from .app import ServeApp
from .config import SERVE_CONFIG_FILE, ServeConfigError, bot_config_path, default_datadir, init_datadir
from .reports import ReportError, run_report

__all__ = ["main"]

PROG = "brmcp-serve"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Serve the example MCP tools echo (free) and fortune (paid) over Bison Relay "
        "through a running brclient.",
    )
    add_version(parser, PROG)
    parser.add_argument(
        "--datadir",
        default=str(default_datadir()),
        help="directory for brmcp-serve.conf, brmcp.json and the ledger (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        choices=LEVEL_CHOICES,
        help="logging threshold (default: the debug key of brmcp-serve.conf, else info)",
    )
    parser.add_argument("--json", action="store_true", help="reports: print JSON")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("balances", help="every caller's prepaid balance (read-only; safe while the bot runs)")
    statement = sub.add_parser("statement", help="every money movement of one caller (read-only)")
    statement.add_argument("uid", metavar="UID", help="the caller's 64-hex uid")
    sub.add_parser(
        "stats", help="tips, charges and refunds, per tool, reconciled with the ledger (read-only)"
    )
    return parser.parse_args(argv)


def _first_run_text(datadir: Path, created: list[Path]) -> str:
    conf, harness_file = bot_config_path(datadir), datadir / SERVE_CONFIG_FILE
    lines = [f"{PROG}: created {', '.join(str(p) for p in created)}", "", "Before the next run:"]
    if conf in created:
        lines += [
            f"  1. {conf} says how to reach your brclient. The defaults expect brclient's files",
            "     in ~/.brclient and its clientrpc at wss://127.0.0.1:7676/ws: enable it in",
            "     brclient.conf, section [clientrpc], with 'jsonrpclisten = 127.0.0.1:7676', and",
            "     adjust brrpcurl, servercertpath, clientcertpath and clientkeypath if yours differ",
            "     (rpcuser/rpcpass matter only when brclient sets rpcauthmode).",
        ]
    if harness_file in created:
        lines += [
            f"  2. {harness_file} says who may call the tools: put the Bison Relay uids",
            '     (64 hex characters) of your callers in "allowed_uids"; an empty list refuses',
            '     everyone. "calls_per_minute" limits each caller (0 means 30).',
        ]
    lines += ["", f"Then start it again: {PROG} --datadir {datadir}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 after a clean stop,
    a first run or a report, 1 on an error, 141 when the reader of a
    report's stdout went away)."""
    return quiet_broken_pipe(partial(_main, argv))


def _main(argv: Sequence[str] | None) -> int:
    args = _parse_args(argv)
    datadir = Path(args.datadir).expanduser()
    if args.command is not None:
        try:
            run_report(args.command, datadir, getattr(args, "uid", ""), as_json=args.json)
        except ReportError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        created = init_datadir(datadir)
    except (OSError, ClientrpcConfigError) as exc:
        print(f"{PROG}: cannot prepare {datadir}: {exc}", file=sys.stderr)
        return 1
    if created:
        print(_first_run_text(datadir, created), flush=True)
        return 0
    conf = bot_config_path(datadir)
    try:
        bot_config = load_bot_config(conf)
    except ClientrpcConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(bot_logging(bot_config, level=args.log_level, source=str(conf)))
        except LogSetupError as exc:
            print(f"{PROG}: {exc} (logfile in {conf})", file=sys.stderr)
            return 1
        try:
            app = ServeApp.from_datadir(datadir, bot_config=bot_config)
        except ClientrpcConfigError as exc:
            print(f"{PROG}: {exc} (see {conf})", file=sys.stderr)
            return 1
        except (ServeConfigError, HarnessError) as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        try:
            anyio.run(partial(app.run, handle_signals=True))
        except KeyboardInterrupt:  # a second Ctrl-C while stopping
            return 0
        return 0
