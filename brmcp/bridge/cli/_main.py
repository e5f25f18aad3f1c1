"""The ``brmcp-bridge`` console command: the daemon, and subcommands that
talk to the running daemon through its admin surface (BRIDGE.md "Admin
surface").

::

    brmcp-bridge [--datadir DIR] [--listen 127.0.0.1:8891]     run the daemon
    brmcp-bridge [--datadir DIR] settings [--show-token]       show mcpclient.json in force
    brmcp-bridge [--datadir DIR] settings set KEY=VALUE...     change it, e.g. enabled=true
                                 mode=autopay per_call_cap_atoms=20000 allowed_bots=<uid>,<uid>
    brmcp-bridge [--datadir DIR] approvals [approve ID | deny ID]   payments and agents' add-bot requests
    brmcp-bridge [--datadir DIR] spend                         spend log and rolling 24 h total
    brmcp-bridge [--datadir DIR] config-snippet BOT_UID        .mcp.json and `claude mcp add` lines
    brmcp-bridge [--datadir DIR] ui [--open]                   one-time login link to the approvals page
    brmcp-bridge [--datadir DIR] find QUERY [--max-price N] [--tag T]...   search the directories
    brmcp-bridge [--datadir DIR] add PROVIDER_UID [--via DIR_UID] [--per-call-cap N] [--per-day-cap N]
    brmcp-bridge [--datadir DIR] receipts [--bot UID] [--export FILE]   signed receipts of the bots
    brmcp-bridge [--datadir DIR] rate RECEIPT_ID --stars N [--comment TEXT]   rate a bot at the directories

The daemon logs as the logging keys of ``<DIR>/brmcp-bridge.conf`` say
(:mod:`brmcp._ops.botlog`); ``--log-level`` replaces its ``debug`` key.

The subcommands find the daemon through ``<DIR>/brmcp-bridge.runtime.json``
(a record whose process is gone or was replaced is stale: the daemon is not
running) and authenticate with ``<DIR>/mcpadmin.token``. The admin surface
shares the endpoint's listener, which is bound only while the bridge is
enabled. Without it (the daemon is not running, or the bridge is disabled):

* ``settings`` and ``spend`` read ``mcpclient.json`` and ``mcpspend.json``
  and say so on stderr;
* ``settings set`` edits ``mcpclient.json`` itself (the same validation;
  enabling without a token mints one) and sends a running daemon SIGHUP;
* ``receipts`` reads ``receipts.sqlite3`` and says so (:mod:`._receiptcli`);
* ``approvals``, ``config-snippet``, ``find`` and ``add`` fail: parked
  payments live only in the running daemon's memory, the snippet needs its
  live endpoint, and directories are asked through its brclient
  (:mod:`._findcli`).

Without a daemon on the data directory given, each of them also says that a
daemon running with another data directory needs ``--datadir``. While the
daemon runs and ``mcpclient.json`` fails to load (a hand edit its reload
refused), ``settings`` warns so on stderr and ``settings set`` refuses to
overwrite the file.

The agents' token is shown as ``<hidden>`` unless ``--show-token`` is given.
Every long option may also be given with one dash, as Go's flag package
takes them (``-datadir DIR``, ``-listen=ADDR``; :mod:`brmcp._ops.goflags`).
Errors are one line on stderr, exit status 1.

This module parses the arguments and runs the commands; the daemon itself
runs in :mod:`._daemonrun` (imported only then); how the commands reach the
daemon is :mod:`._adminclient`, and ``settings set`` without it
:mod:`._settingsedit`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

from brmcp._ops.botlog import LEVEL_CHOICES
from brmcp._ops.console import add_version, quiet_broken_pipe
from brmcp._ops.goflags import go_style, long_options
from brmcp.bridge.base import (
    DEFAULT_LISTEN,
    PROG,
    SETTINGS_FILE,
    BridgeError,
    cli_command,
    default_datadir,
    is_uid,
    load_settings,
    setting_names,
    settings_file_problem,
)

from ._adminclient import (
    OTHER_DATADIR_HINT,
    AdminError,
    CLIError,
    Daemon,
    Disabled,
    NotRunning,
    admin,
    locate,
)
from ._settingsedit import edit_file, parse_pairs, set_offline

__all__ = ["CLIError", "default_datadir", "main"]

#: Shown instead of the agents' token unless ``--show-token`` is given.
HIDDEN_TOKEN = "<hidden>"


#: The commands that ask the directories (command → module, help line). Their
#: modules import the directory client and with it the MCP SDK, so each is
#: imported, and its arguments added, only when it is the command given.
_DIRECTORY_COMMANDS: dict[str, tuple[str, str]] = {
    "find": ("._findcli", "search the configured directories for tools (the setting directories)"),
    "add": ("._findcli", "reach a provider found with find: KX through a directory, then allow it"),
    "receipts": ("._receiptcli", "the signed receipts of the bots' results, newest first"),
    "rate": ("._ratecli", "rate a bot at the directories with one of its signed receipts"),
}


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    args = list(sys.argv[1:] if argv is None else argv)
    # Go's flag syntax (-datadir DIR, -listen=ADDR): every long option.
    parser = _parser(None)
    first, _ = parser.parse_known_args(go_style(args, long_options(parser)))
    if first.command in _DIRECTORY_COMMANDS:
        parser = _parser(first.command)
    return parser.parse_args(go_style(args, long_options(parser)))


def _parser(directory_command: str | None) -> argparse.ArgumentParser:
    """The parser; of the :data:`_DIRECTORY_COMMANDS`, only
    ``directory_command`` gets its arguments (the others are names with a
    help line, enough for ``--help`` and to tell which command was given)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Let local MCP agents call Bison Relay bots through your brclient, paying for "
        "tools within your caps. Without a command, run the daemon.",
        epilog="Long options may also be given with one dash, as Go programs take them "
        "(-datadir DIR, -listen=HOST:PORT).",
    )
    add_version(parser, PROG)
    parser.add_argument(
        "--datadir", default=str(default_datadir()), help="the daemon's data directory (default: %(default)s)"
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help="daemon: loopback address of the endpoint (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        choices=LEVEL_CHOICES,
        help="daemon: logging threshold (default: the debug key of brmcp-bridge.conf, else info)",
    )
    parser.add_argument("--json", action="store_true", help="commands: print the daemon's JSON answer")
    parser.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        default=None,
        help="daemon: serve Prometheus metrics at http://HOST:PORT/metrics (loopback only, "
        "e.g. 127.0.0.1:9465)",
    )
    parser.add_argument(
        "--notify-command",
        default=None,
        metavar="COMMAND",
        help="daemon: run COMMAND on each new payment waiting for approval (default: the approvalnotify "
        "key of brmcp-bridge.conf); it gets BRMCP_PAYMENT_ID, BRMCP_BOT, BRMCP_TOOL, BRMCP_ATOMS and "
        "BRMCP_APPROVE_COMMAND in its environment",
    )
    # The commands also take --datadir and --json after their name
    # ("brmcp-bridge spend --json"); SUPPRESS keeps the value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--datadir", default=argparse.SUPPRESS, help="the data directory (as before the command)"
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON (as before the command)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    settings = sub.add_parser(
        "settings", parents=[common], help="show the settings, or 'settings set KEY=VALUE...'"
    )
    settings.add_argument("action", nargs="?", choices=["set"], help="change settings")
    settings.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help=f"keys: {', '.join(setting_names())}")
    settings.add_argument(
        "--show-token", action="store_true", help=f"show the agents' token instead of {HIDDEN_TOKEN}"
    )
    approvals = sub.add_parser(
        "approvals",
        parents=[common],
        help="list payments and add-bot requests waiting for you, or approve/deny one",
    )
    approvals.add_argument("action", nargs="?", choices=["list", "approve", "deny"], default="list")
    approvals.add_argument("id", nargs="?", help="payment id (for approve/deny)")
    sub.add_parser("spend", parents=[common], help="the spend log and the rolling 24-hour total")
    ui = sub.add_parser("ui", parents=[common], help="print a one-time login link to the approvals page")
    ui.add_argument("--open", action="store_true", help="also open the link in the default web browser")
    snippet = sub.add_parser("config-snippet", parents=[common], help="agent configuration for one bot")
    snippet.add_argument("uid", metavar="BOT_UID", help="the bot's 64-hex uid")
    for name, (module, text) in _DIRECTORY_COMMANDS.items():
        if name != directory_command:
            sub.add_parser(name, parents=[common], help=text, add_help=False)
            continue
        command = sub.add_parser(name, parents=[common], help=text)
        importlib.import_module(module, __package__).add_arguments(name, command)
    return parser


# -- commands ----------------------------------------------------------------------------


def _offline_note(exc: CLIError, path: Path, missing: str) -> str:
    """Why an answer comes from ``path`` rather than from the daemon
    (``missing``: what is shown when the file does not exist)."""
    if isinstance(exc, NotRunning):
        why = f"the daemon is not running ({exc.detail})"
        other = f" ({OTHER_DATADIR_HINT})"
    else:
        why = "the bridge is disabled, so the daemon's admin surface is off"
        other = ""
    shown = f"read from {path}" if path.exists() else f"{path} does not exist yet ({missing})"
    return f"{PROG}: {why}; {shown}{other}"


def _cmd_settings(datadir: Path, args: argparse.Namespace) -> None:
    if args.action is None:
        if args.pairs:
            raise CLIError("to change settings use: settings set KEY=VALUE...")
        path = datadir / SETTINGS_FILE
        try:
            daemon = locate(datadir)
            result = admin(daemon, "GET", "/admin/settings")
        except (NotRunning, Disabled) as exc:
            try:
                result = load_settings(path).to_dict()
            except BridgeError as error:
                raise CLIError(str(error)) from None
            print(_offline_note(exc, path, "defaults shown"), file=sys.stderr)
        else:
            problem = settings_file_problem(path)
            if problem is not None:
                # The daemon refused to reload it (SIGHUP): what it shows is
                # not what the file says.
                print(
                    f"{PROG}: warning: {problem}; the daemon (pid {daemon.pid}) still runs on the "
                    "settings it loaded before, shown below; fix the file, then send it SIGHUP "
                    f"(kill -HUP {daemon.pid}) or restart it to load it",
                    file=sys.stderr,
                )
    else:
        changes = parse_pairs(args.pairs)
        try:
            daemon = locate(datadir)
        except NotRunning as exc:
            path, saved = edit_file(datadir, changes)
            print(
                f"{PROG}: saved {path}; the daemon is not running ({exc.detail}), so these settings apply "
                f"when it starts: {cli_command(datadir)} ({OTHER_DATADIR_HINT})",
                file=sys.stderr,
            )
            result = saved.to_dict()
        else:
            try:
                result = admin(daemon, "PUT", "/admin/settings", changes)
            except Disabled:
                result = set_offline(daemon, changes)
    if isinstance(result, dict) and result.get("token") and not args.show_token:
        result = {**result, "token": HIDDEN_TOKEN}
    _print_json(result, args.json)


def _cmd_approvals(datadir: Path, args: argparse.Namespace) -> None:
    listing = f"{cli_command(datadir)} approvals"
    if args.action == "list" and args.id is not None:
        raise CLIError("usage: approvals [approve ID | deny ID]")
    if args.action != "list" and not args.id:
        raise CLIError(f"approvals {args.action} needs a payment ID; list them with: {listing}")
    try:
        daemon = locate(datadir)
    except NotRunning as exc:
        raise CLIError(
            f"approvals live in the running daemon's memory, and it is not running ({exc.detail}); "
            f"start it with: {cli_command(datadir)} ({OTHER_DATADIR_HINT})"
        ) from None
    bot_request: dict[str, Any] | None = None
    try:
        if args.action == "list":
            result = admin(daemon, "GET", "/admin/approvals")
            result = {**result, "botRequests": _bot_requests(daemon)}
        else:
            path = f"/admin/approvals/{quote(args.id, safe='')}/{args.action}"
            try:
                result = admin(daemon, "POST", path)
            except AdminError as exc:
                if exc.status != 404:
                    raise
                # Not a payment: an agent's add-bot request has an ID of the same kind.
                bot_request = _decide_bot_request(daemon, args.id, args.action == "approve")
                if bot_request is None:
                    raise
                result = bot_request
    except Disabled:
        raise CLIError(
            "approvals live in the running daemon's memory and are reached through its admin surface, "
            "which is off while the bridge is disabled; enable it with: "
            f"{cli_command(datadir)} settings set enabled=true"
        ) from None
    except AdminError as exc:
        if exc.status == 404 and args.action != "list":
            raise CLIError(
                f"unknown payment {printable(args.id)!r}: nothing with that ID waits for approval "
                f"(already decided, timed out, or the daemon restarted); list them with: {listing}"
            ) from None
        raise
    if args.json:
        _print_json(result, True)
        return
    if bot_request is not None:
        print(f"{printable(bot_request.get('outcome'))} add bot {printable(bot_request.get('id', args.id))}")
        return
    if args.action != "list":
        print(f"{'approved' if result.get('approved') else 'denied'} {result.get('id', args.id)}")
        return
    pending = result.get("pending") or []
    requests = result.get("botRequests") or []
    if not pending and not requests:
        print("no payments waiting for approval")
        return
    if pending:
        print(f"{'ID':<34} {'BOT':<18} {'TOOL':<20} {'ATOMS':>12}  CREATED (UTC)")
    for p in pending:
        print(
            f"{printable(p['id']):<34} {printable(p['bot'])[:16]:<18} {printable(p['tool']):<20} "
            f"{_atoms(p['atoms']):>12}  {_when(p['created'])}"
        )
    for r in requests:
        contact = {True: "KX done", False: "no KX yet: approving asks a directory to introduce it"}.get(
            r.get("contact"), "KX unknown"
        )
        print(
            f"{printable(r['id']):<34} add bot {printable(r['uid'])}  requested {_when(r['requestedAt'])} by "
            f"{printable(r.get('agent') or 'an agent')} ({contact})"
        )
        if r.get("reason"):
            print(f"{'':<34} reason: {printable(r['reason'])}")
    if requests:
        print(
            "approving an add-bot request puts only that uid on allowed_bots (no cap changes): "
            f"{listing} approve ID (or: deny ID)"
        )


def _bot_requests(daemon: Daemon) -> list[Any]:
    """The agents' pending add-bot requests (an older daemon without the
    route has none)."""
    try:
        return list(admin(daemon, "GET", "/admin/bot-requests").get("pending") or [])
    except AdminError as exc:
        if exc.status == 404:
            return []
        raise


def _decide_bot_request(daemon: Daemon, request_id: str, approve: bool) -> dict[str, Any] | None:
    """Decide the add-bot request ``request_id``; None when there is none
    with that ID (the caller reports the unknown ID)."""
    try:
        answer = admin(
            daemon, "POST", f"/admin/bot-requests/{quote(request_id, safe='')}", {"approve": approve}
        )
    except AdminError as exc:
        if exc.status == 404:
            return None
        raise
    return dict(answer)


def _cmd_spend(datadir: Path, args: argparse.Namespace) -> None:
    waiting: list[Any] = []
    try:
        daemon = locate(datadir)
        result = admin(daemon, "GET", "/admin/spend")
        # Payments parked for approval have not moved a single atom, so they
        # are not in the log; say they exist, or the log looks idle.
        waiting = list(admin(daemon, "GET", "/admin/approvals").get("pending") or [])
    except (NotRunning, Disabled) as exc:
        # The spend log's reader comes with the payment room: only offline.
        from brmcp.bridge.pay import SPEND_FILE, SpendLog

        path = datadir / SPEND_FILE
        try:
            result = SpendLog.load(path).summary(int(time.time())).to_dict()
        except BridgeError as error:
            raise CLIError(str(error)) from None
        print(_offline_note(exc, path, "nothing was paid"), file=sys.stderr)
    if args.json:
        _print_json(result, True)
        return
    entries = result.get("entries") or []
    if not entries:
        print("no payments yet")
    else:
        print(f"{'WHEN (UTC)':<20} {'BOT':<18} {'TOOL':<20} {'ATOMS':>12}  STATUS")
        for e in entries:
            status = printable(e.get("status") or "paid")
            if e.get("prepay"):
                status += " (prepayment)"
            if e.get("err"):
                status += f" ({printable(e['err'])})"
            print(
                f"{_when(e['ts']):<20} {printable(e['bot'])[:16]:<18} {printable(e['tool']):<20} "
                f"{_atoms(e['atoms']):>12}  {status}"
            )
    print(f"spent in the last 24 hours: {_atoms(result.get('day_total_atoms', 0))} atoms")
    if waiting:
        atoms = sum(p.get("atoms", 0) for p in waiting if isinstance(p.get("atoms"), int))
        print(
            f"waiting for your approval: {len(waiting)} payment(s), {_atoms(atoms)} atoms in all "
            f"(not paid yet); see them with: {cli_command(datadir)} approvals"
        )


def _cmd_config_snippet(datadir: Path, args: argparse.Namespace) -> None:
    uid = args.uid.strip()
    if not is_uid(uid):
        raise CLIError(f"bot uid {uid!r} is not 64 hex characters")
    daemon = locate(datadir)
    result = admin(daemon, "GET", f"/admin/config-snippet/{uid.lower()}")
    if args.json:
        _print_json(result, True)
        return
    print("# .mcp.json (Claude Code, Cursor and other agents):")
    print(json.dumps(result["mcp_json"], indent=2))
    print()
    print("# Claude Code:")
    print(result["claude_command"])
    if not result.get("allowed", True):
        print(
            f"{PROG}: note: {uid.lower()} is not on allowed_bots yet; add it with: "
            f"{cli_command(daemon.datadir)} settings set allowed_bots=<uid>,...",
            file=sys.stderr,
        )


def _cmd_ui(datadir: Path, args: argparse.Namespace) -> None:
    try:
        daemon = locate(datadir)
    except NotRunning as exc:
        raise CLIError(
            f"the approvals page is served by the running daemon, and it is not running ({exc.detail}); "
            f"start it with: {cli_command(datadir)} ({OTHER_DATADIR_HINT})"
        ) from None
    try:
        result = admin(daemon, "POST", "/admin/ui-login", {})
    except Disabled:
        raise CLIError(
            "the approvals page shares the endpoint's listener, which is off while the bridge is "
            f"disabled; enable it with: {cli_command(datadir)} settings set enabled=true"
        ) from None
    url = str(result.get("url", ""))
    if args.json:
        _print_json(result, True)
    else:
        print(url)
        print(
            f"{PROG}: open this link in a browser on this machine; it works once, within "
            f"{int(result.get('expires_in', 300))} seconds",
            file=sys.stderr,
        )
    if args.open:
        import webbrowser

        webbrowser.open(url)


def printable(value: Any) -> str:
    """``value`` for a terminal table: control and format characters (from a
    bot's tool name or brclient's error text) escaped, so they cannot move
    the cursor or rewrite what the user decides from."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _atoms(value: Any) -> str:
    """An amount of atoms with thousands separators (``10,000``), as the
    approvals page and the hints print it; anything else as it is."""
    if isinstance(value, bool) or not isinstance(value, int):
        return printable(value)
    return f"{value:,}"


def _when(ts: Any) -> str:
    """A Unix time as ``YYYY-MM-DD HH:MM:SS`` in UTC (the tables say so)."""
    try:
        return datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return str(ts)


def _print_json(value: Any, compact: bool) -> None:
    print(json.dumps(value) if compact else json.dumps(value, indent=2))


_COMMANDS = {
    "settings": _cmd_settings,
    "approvals": _cmd_approvals,
    "spend": _cmd_spend,
    "config-snippet": _cmd_config_snippet,
    "ui": _cmd_ui,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 ok, 1 error, 141 when
    the reader of stdout went away)."""
    return quiet_broken_pipe(partial(_main, argv))


def _main(argv: Sequence[str] | None) -> int:
    args = _parse_args(argv)
    datadir = Path(args.datadir).expanduser()
    if args.command is None:
        # The daemon brings the SDK and the whole bridge: only when it runs.
        from ._daemonrun import run_daemon

        return run_daemon(args, datadir)
    if args.command in _DIRECTORY_COMMANDS:
        module = importlib.import_module(_DIRECTORY_COMMANDS[args.command][0], __package__)
        command = getattr(module, f"cmd_{args.command}")
    else:
        command = _COMMANDS[args.command]
    try:
        command(datadir, args)
    except CLIError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    return 0
