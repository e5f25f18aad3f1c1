"""The ``brmcp-serve`` console command.

``brmcp-serve --datadir DIR`` (no command) runs the bot daemon: on the first
run it writes ``brmcp-serve.conf`` and ``brmcp.json`` into DIR, says what to
edit and exits 0; later runs serve until SIGINT/SIGTERM, and SIGHUP reloads
``brmcp.json``. ``brmcp-serve --datadir DIR --upstream CMD ARG...`` (or
``--upstream-url URL``, or an ``upstream`` block in ``brmcp.json``) sells an
existing MCP server instead of the example tools, at the prices of
``DIR/prices.json``: when that file is missing the upstream is started once,
its tools are listed into a new ``prices.json`` (each at 0 atoms) and the
command exits 0; SIGHUP reloads it too (brmcp/gateway). The commands
``balances``, ``statement UID`` and ``stats`` are read-only reports on the
book the ``store`` of ``brmcp.json`` names (:mod:`brmcp.serve.reports`). Logging
follows the ``debug``, ``logfile`` and ``maxlogfiles`` keys of
``brmcp-serve.conf`` (:mod:`brmcp._ops.botlog`); ``--log-level`` replaces
``debug``. The Go reference's single-dash ``-datadir DIR`` (Go's flag
syntax; karamble/brmcp ``cmd/brmcp-serve``) is accepted; another long option
with one dash is refused with a line naming its two-dash form. Errors are
one line on stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shlex
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import anyio

from .._ops.botlog import LEVEL_CHOICES, LogSetupError, bot_logging
from .._ops.console import add_version, quiet_broken_pipe
from .._ops.goflags import GoFlagError, go_style
from ..clientrpc import ClientrpcConfigError, load_bot_config
from ..gateway import (
    CALLER_UID_KEY,
    PASSTHROUGH_ENV,
    PRICES_FILE,
    GatewayError,
    UpstreamConfig,
    UpstreamConfigError,
    list_upstream_tools,
    load_upstream_block,
    parse_env_option,
    parse_header_env,
    prices_template,
)
from ..metrics import metrics_address_problem
from ..server import HarnessError
from .app import ServeApp
from .config import (
    SERVE_CONFIG_FILE,
    ServeConfigError,
    bot_config_path,
    default_datadir,
    init_datadir,
    write_serve_config,
)
from .reports import ReportError, run_report

__all__ = ["main"]

PROG = "brmcp-serve"


#: The usage lines: the daemon (no command), the daemon selling a stdio MCP
#: server (``--upstream`` takes the rest of the line), the reports.
USAGE = """%(prog)s [--datadir DIR] [--log-level LEVEL] [--metrics HOST:PORT] [--upstream-url URL]
                   [--upstream-env NAME[=VALUE]] [--upstream-...]     (no COMMAND: the daemon)
       %(prog)s [options] --upstream CMD [ARG ...]    (--upstream last: the rest is its command)
       %(prog)s [--datadir DIR] [--json] {balances,statement UID,stats}"""

DESCRIPTION = (
    "Without a COMMAND, run the bot daemon: connect to your running brclient and serve MCP tools "
    "over Bison Relay until SIGINT/SIGTERM (SIGHUP reloads brmcp.json and prices.json). It serves "
    "the example tools echo (free) and fortune (10,000 atoms), or, with --upstream/--upstream-url, "
    "sells an MCP server you already have. The first run only writes the config files into "
    "--datadir, says what to edit, and exits. The COMMANDs are read-only reports on the ledger "
    "(the book the store key of brmcp.json names: brmcp.sqlite3 or a PostgreSQL database)."
)

#: Go's flag package reads ``-datadir DIR`` and ``-datadir=DIR``; these are
#: the flags of the Go brmcp-serve (karamble/brmcp ``cmd/brmcp-serve``:
#: ``-datadir``) plus Go's built-in ``-help``.
_GO_FLAGS = ("datadir", "help")


class _UsageError(Exception):
    """A command line to refuse with one line (the message)."""


def _go_style(argv: Sequence[str], long_options: set[str]) -> list[str]:
    """``argv`` with the Go reference's single-dash flags (``-datadir DIR``,
    ``-datadir=DIR``, ``-help``) spelt with two dashes
    (:func:`brmcp._ops.goflags.go_style`). Tokens after ``--upstream`` (the
    upstream's own command line) and after ``--`` are left alone. Raises
    :class:`_UsageError` for another long option given with one dash
    (``-log-level``), naming its two-dash form."""
    try:
        return go_style(argv, _GO_FLAGS, long_options, rest_after=("--upstream", "--"))
    except GoFlagError as exc:
        raise _UsageError(str(exc)) from None


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=USAGE,
        description=DESCRIPTION,
        epilog="-datadir DIR (the Go brmcp-serve's flag) is accepted for --datadir DIR.",
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
    gateway = parser.add_argument_group(
        "selling an existing MCP server",
        "Instead of the example tools, sell the tools of an MCP server you already have, at the prices "
        'of <datadir>/prices.json. Same as an "upstream" block in brmcp.json, which these replace.',
    )
    gateway.add_argument(
        "--upstream-url",
        metavar="URL",
        help="a streamable-HTTP MCP server, e.g. http://127.0.0.1:3001/mcp",
    )
    gateway.add_argument(
        "--upstream-header-env",
        metavar="NAME=VAR",
        action="append",
        default=[],
        help="send HTTP header NAME with the value of environment variable VAR (repeatable)",
    )
    gateway.add_argument(
        "--upstream-headers-file",
        metavar="FILE",
        help="send the HTTP headers of FILE ('Name: value' lines)",
    )
    gateway.add_argument(
        "--upstream-env",
        metavar="NAME[=VALUE]",
        action="append",
        default=[],
        help="stdio upstream: pass environment variable NAME from this environment, or set it to VALUE "
        "(repeatable). Passed already when set: the MCP SDK's minimal set (HOME, PATH, ...) and "
        + ", ".join(PASSTHROUGH_ENV),
    )
    gateway.add_argument(
        "--upstream-send-caller-uid",
        action="store_true",
        help=f"pass each caller's Bison Relay uid to the upstream in _meta[{CALLER_UID_KEY!r}]",
    )
    gateway.add_argument(
        "--upstream",
        metavar="CMD",
        nargs=argparse.REMAINDER,
        help="a stdio MCP server: the command and its arguments (must come last)",
    )
    parser.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        default=None,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (loopback only, e.g. 127.0.0.1:9464)",
    )
    parser.add_argument("--json", action="store_true", help="reports: print JSON")
    # The reports also take --datadir and --json after their name
    # ("brmcp-serve balances --json"); SUPPRESS keeps the value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--datadir", default=argparse.SUPPRESS, help="the data directory (as before the command)"
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON (as before the command)"
    )
    sub = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        title="commands (read-only reports; without one, brmcp-serve runs the daemon)",
    )
    sub.add_parser(
        "balances",
        parents=[common],
        help="every caller's prepaid balance (read-only; safe while the bot runs)",
    )
    statement = sub.add_parser(
        "statement", parents=[common], help="every money movement of one caller (read-only)"
    )
    statement.add_argument("uid", metavar="UID", help="the caller's 64-hex uid")
    sub.add_parser(
        "stats",
        parents=[common],
        help="tips, charges and refunds, per tool, reconciled with the ledger (read-only)",
    )
    long_options = {opt[2:] for opt in parser._option_string_actions if opt.startswith("--")}
    args = list(sys.argv[1:] if argv is None else argv)
    return parser.parse_args(_go_style(args, long_options))


def _upstream_from_args(args: argparse.Namespace, datadir: Path) -> UpstreamConfig | None:
    """The upstream of the command line merged over brmcp.json's block, or
    None (serve the example tools). Raises UpstreamConfigError."""
    command = list(args.upstream or [])
    if args.upstream is not None and not command:
        raise UpstreamConfigError("--upstream needs a command, e.g. --upstream uvx mcp-server-time")
    if command and args.upstream_url:
        raise UpstreamConfigError("give --upstream or --upstream-url, not both")
    path = datadir / SERVE_CONFIG_FILE
    base = load_upstream_block(path) if path.exists() else None
    headers_env = dict(parse_header_env(spec) for spec in args.upstream_header_env)
    env: dict[str, str] = {}
    pass_env: list[str] = []
    for spec in args.upstream_env:
        name, value = parse_env_option(spec)
        if value is None:
            pass_env.append(name)
        else:
            env[name] = value
    options_given = bool(
        headers_env or args.upstream_headers_file or args.upstream_send_caller_uid or args.upstream_env
    )
    if not command and not args.upstream_url:
        if not options_given:
            return base
        if base is None:
            raise UpstreamConfigError("the --upstream-* options need --upstream or --upstream-url")
    if base is None:
        base = UpstreamConfig(command=tuple(command)) if command else UpstreamConfig(url=args.upstream_url)
    elif command:
        base = base.with_command(command)
    elif args.upstream_url:
        base = base.with_url(args.upstream_url)
    if args.upstream_env:
        if not base.command:
            raise UpstreamConfigError(
                "--upstream-env sets the environment of a stdio upstream (--upstream CMD); an HTTP "
                "upstream (--upstream-url) runs on its own"
            )
        base = base.with_env(env, pass_env)
    changes: dict[str, object] = {}
    if headers_env:
        changes["headers_env"] = headers_env
    if args.upstream_headers_file:
        changes["headers_file"] = args.upstream_headers_file
    if args.upstream_send_caller_uid:
        changes["send_caller_uid"] = True
    return dataclasses.replace(base, **changes) if changes else base  # type: ignore[arg-type]


def _first_run_text(
    datadir: Path, created: list[Path], tool_names: Sequence[str] = (), again: str = ""
) -> str:
    """What a first run prints: the files created, then one numbered item
    per file to edit (numbered as printed: only created files have one)."""
    conf, harness_file = bot_config_path(datadir), datadir / SERVE_CONFIG_FILE
    items: list[list[str]] = []
    if conf in created:
        items.append(
            [
                f"{conf} says how to reach your brclient. The defaults expect brclient's files",
                "in ~/.brclient and its clientrpc at wss://127.0.0.1:7676/ws: enable it in",
                "brclient.conf, section [clientrpc], with 'jsonrpclisten = 127.0.0.1:7676', and",
                "adjust brrpcurl, servercertpath, clientcertpath and clientkeypath if yours differ",
                "(rpcuser/rpcpass matter only when brclient sets rpcauthmode).",
            ]
        )
    if harness_file in created:
        items.append(
            [
                f"{harness_file} says who may call the tools: put the Bison Relay uids",
                '(64 hex characters) of your callers in "allowed_uids"; an empty list refuses',
                'everyone. "calls_per_minute" limits each caller (0 means 30).',
            ]
        )
    prices = datadir / PRICES_FILE
    if prices in created:
        if tool_names:
            shown = ", ".join(tool_names[:8]) + (
                f" and {len(tool_names) - 8} more" if len(tool_names) > 8 else ""
            )
            items.append(
                [
                    f"{prices} lists the {len(tool_names)} tool(s) of the upstream MCP server,",
                    f"each at 0 atoms (free): {shown}.",
                    'Set atoms per call, "free" or "hidden" per tool under "tools"; "default" prices',
                    "tools the upstream adds later.",
                ]
            )
        else:
            items.append(
                [
                    f"{prices} sets what each tool of the upstream MCP server costs (it listed none):",
                    'atoms per call, "free" or "hidden", per tool under "tools", "default" for the others.',
                ]
            )
    lines = [f"{PROG}: created {', '.join(str(p) for p in created)}"]
    if items:
        lines += ["", "Before the next run:"]
        for number, (first, *rest) in enumerate(items, 1):
            lines += [f"  {number}. {first}", *(f"     {line}" for line in rest)]
    # The same command line, upstream included: what the user typed, quoted for a shell.
    lines += ["", f"Then start it again: {again or f'{PROG} --datadir {shlex.quote(str(datadir))}'}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 after a clean stop,
    a first run or a report, 1 on an error, 141 when the reader of a
    report's stdout went away)."""
    return quiet_broken_pipe(partial(_main, argv))


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = _parse_args(argv)
    except _UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    datadir = Path(args.datadir).expanduser()
    if args.command is not None:
        try:
            run_report(args.command, datadir, getattr(args, "uid", ""), as_json=args.json)
        except ReportError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.metrics:
        # Before anything is created: a taken port leaves nothing behind.
        problem = metrics_address_problem(args.metrics)
        if problem is not None:
            print(f"{PROG}: {problem}", file=sys.stderr)
            return 1
    try:
        upstream = _upstream_from_args(args, datadir)
    except UpstreamConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    prices_path = datadir / PRICES_FILE
    tool_names: list[str] = []
    if upstream is not None and not prices_path.exists():
        # Before anything is created: an upstream that cannot start leaves nothing behind.
        print(f"{PROG}: starting the upstream once to list its tools for {prices_path}", file=sys.stderr)
        try:
            tools = anyio.run(partial(list_upstream_tools, upstream, base_dir=datadir))
        except GatewayError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        tool_names = [tool.name for tool in tools]
    try:
        created = init_datadir(datadir)
        if upstream is not None and not prices_path.exists():
            write_serve_config(prices_path, prices_template(tool_names))
            created.append(prices_path)
    except (OSError, ClientrpcConfigError) as exc:
        print(f"{PROG}: cannot prepare {datadir}: {exc}", file=sys.stderr)
        return 1
    if created:
        again = shlex.join([PROG, *(sys.argv[1:] if argv is None else argv)]) if upstream is not None else ""
        print(_first_run_text(datadir, created, tool_names, again), flush=True)
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
            app = ServeApp.from_datadir(datadir, bot_config=bot_config, upstream=upstream)
        except ClientrpcConfigError as exc:
            print(f"{PROG}: {exc} (see {conf})", file=sys.stderr)
            return 1
        except (ServeConfigError, HarnessError) as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        if args.metrics:
            try:
                app.enable_metrics(args.metrics)
            except ValueError as exc:
                print(f"{PROG}: --metrics: {exc}", file=sys.stderr)
                return 1
        try:
            anyio.run(partial(app.run, handle_signals=True))
        except KeyboardInterrupt:  # a second Ctrl-C while stopping
            return 0
        except (ServeConfigError, HarnessError) as exc:  # another process holds a lock
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        except BaseException as exc:
            failure = _gateway_error(exc)
            if failure is None:
                raise
            print(f"{PROG}: {failure}", file=sys.stderr)
            return 1
        return 0


def _gateway_error(exc: BaseException) -> GatewayError | None:
    """The GatewayError inside ``exc`` (possibly wrapped in task-group
    exception groups), else None."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _gateway_error(inner)
            if found is not None:
                return found
    return None
