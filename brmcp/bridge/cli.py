"""The ``brmcp-bridge`` console command: the daemon, and subcommands that
talk to the running daemon through its admin surface (BRIDGE.md "Admin
surface").

::

    brmcp-bridge [--datadir DIR] [--listen 127.0.0.1:8891]     run the daemon
    brmcp-bridge [--datadir DIR] settings                      show mcpclient.json in force
    brmcp-bridge [--datadir DIR] settings set KEY=VALUE...     change it, e.g. enabled=true
                                 mode=autopay per_call_cap_atoms=20000 allowed_bots=<uid>,<uid>
    brmcp-bridge [--datadir DIR] approvals [approve ID | deny ID]
    brmcp-bridge [--datadir DIR] spend                         spend log and rolling 24 h total
    brmcp-bridge [--datadir DIR] config-snippet BOT_UID        .mcp.json and `claude mcp add` lines

The subcommands find the daemon through ``<DIR>/brmcp-bridge.runtime.json``
and authenticate with ``<DIR>/mcpadmin.token``. The admin surface shares the
endpoint's listener, which is bound only while the bridge is enabled; so
``settings set`` on a disabled bridge edits ``mcpclient.json`` itself (with
the same validation, minting a token when enabling without one) and sends
the daemon SIGHUP to reload it. Errors are one line on stderr, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio

from ..clientrpc import ClientrpcConfigError
from .bridge import ADMIN_TOKEN_FILE, DEFAULT_LISTEN
from .daemon import BOT_CONFIG_NAME, RUNTIME_FILE, BridgeDaemon, _pid_alive, read_runtime
from .errors import BridgeError, SettingsError
from .settings import SETTINGS_FILE, is_uid, load_settings, mint_token, save_settings, setting_names
from .settings import settings_from_json as _settings_from_json

__all__ = ["CLIError", "default_datadir", "main"]

PROG = "brmcp-bridge"
#: Seconds a subcommand waits for the daemon's answer.
REQUEST_TIMEOUT = 15.0
#: Seconds ``settings set`` waits for a reloaded daemon to open its endpoint.
RELOAD_WAIT = 10.0

_BOOLS = {
    "true": True,
    "false": False,
    "1": True,
    "0": False,
    "yes": True,
    "no": False,
    "on": True,
    "off": False,
}
_INT_SETTINGS = ("per_call_cap_atoms", "per_day_cap_atoms", "approval_timeout_secs", "tip_wait_secs")


class CLIError(Exception):
    """A one-line error for the user."""


class _Disabled(CLIError):
    """The admin surface is off because the bridge is disabled."""


def default_datadir() -> Path:
    """``~/.brmcp-bridge`` (Linux/BSD), ``~/Library/Application Support/Brmcp-bridge``
    (macOS), ``%LOCALAPPDATA%\\Brmcp-bridge`` (Windows)."""
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Brmcp-bridge"
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        return (Path(local) if local else home / "AppData" / "Local") / "Brmcp-bridge"
    return home / ".brmcp-bridge"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Let local MCP agents call Bison Relay bots through your brclient, paying for "
        "tools within your caps. Without a command, run the daemon.",
    )
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
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="daemon: logging threshold (default: %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="commands: print the daemon's JSON answer")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    settings = sub.add_parser("settings", help="show the settings, or 'settings set KEY=VALUE...'")
    settings.add_argument("action", nargs="?", choices=["set"], help="change settings")
    settings.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help=f"keys: {', '.join(setting_names())}")
    approvals = sub.add_parser("approvals", help="list payments waiting for approval, or approve/deny one")
    approvals.add_argument("action", nargs="?", choices=["list", "approve", "deny"], default="list")
    approvals.add_argument("id", nargs="?", help="payment id (for approve/deny)")
    sub.add_parser("spend", help="the spend log and the rolling 24-hour total")
    snippet = sub.add_parser("config-snippet", help="agent configuration for one bot")
    snippet.add_argument("uid", metavar="BOT_UID", help="the bot's 64-hex uid")
    return parser.parse_args(argv)


# -- talking to the daemon ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Daemon:
    datadir: Path
    pid: int
    url: str
    sighup: bool
    token: str


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, plain: bool) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.plain = plain


class _Unreachable(Exception):
    pass


def _locate(datadir: Path) -> _Daemon:
    record = read_runtime(datadir)
    runtime = datadir / RUNTIME_FILE
    if record is None:
        raise CLIError(f"the daemon is not running (no {runtime}); start it with: {PROG} --datadir {datadir}")
    pid, url = record.get("pid"), record.get("url")
    if not isinstance(pid, int) or not isinstance(url, str):
        raise CLIError(f"{runtime} is malformed; restart the daemon")
    if not _pid_alive(pid):
        raise CLIError(f"the daemon is not running (stale {runtime}: no process {pid})")
    token_path = datadir / ADMIN_TOKEN_FILE
    try:
        token = token_path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise CLIError(
            f"admin token file {token_path} is missing: is {datadir} the daemon's --datadir?"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"cannot read admin token file {token_path}: {exc}") from None
    if not token:
        raise CLIError(f"admin token file {token_path} is empty")
    return _Daemon(datadir, pid, url, bool(record.get("sighup")), token)


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy


def _request(daemon: _Daemon, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(
        daemon.url + path,
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {daemon.token}",
            "Accept": "application/json",
            "Content-Type": "application/json",
        },
    )
    try:
        with _OPENER.open(req, timeout=REQUEST_TIMEOUT) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        ctype = exc.headers.get("Content-Type", "") if exc.headers else ""
        message = raw.decode("utf-8", errors="replace").strip()
        if ctype.startswith("application/json"):
            try:
                message = str(json.loads(raw).get("error", message))
            except (ValueError, AttributeError):
                pass
            raise _HTTPError(exc.code, message, plain=False) from None
        raise _HTTPError(exc.code, message, plain=True) from None
    except urllib.error.URLError as exc:
        raise _Unreachable(str(exc.reason)) from None
    except OSError as exc:
        raise _Unreachable(str(exc) or type(exc).__name__) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise CLIError(f"the daemon at {daemon.url} sent a malformed answer") from None


def _enabled_on_disk(datadir: Path) -> bool:
    try:
        return load_settings(datadir / SETTINGS_FILE).enabled
    except BridgeError:
        return True


def _admin(daemon: _Daemon, method: str, path: str, body: Any = None) -> Any:
    disabled = _Disabled(
        "the bridge is disabled, so its admin surface is off; enable it with: "
        f"{PROG} --datadir {daemon.datadir} settings set enabled=true"
    )
    try:
        return _request(daemon, method, path, body)
    except _Unreachable as exc:
        if not _enabled_on_disk(daemon.datadir):
            raise disabled from None
        raise CLIError(f"cannot reach the daemon (pid {daemon.pid}) at {daemon.url}: {exc}") from None
    except _HTTPError as exc:
        if exc.status == 401:
            raise CLIError(
                f"the daemon at {daemon.url} refused the admin token in {daemon.datadir / ADMIN_TOKEN_FILE}"
            ) from None
        if exc.status == 404 and exc.plain:
            raise disabled from None
        raise CLIError(exc.message or f"HTTP {exc.status}") from None


# -- commands ----------------------------------------------------------------------------


def _parse_pairs(pairs: Sequence[str]) -> dict[str, Any]:
    if not pairs:
        raise CLIError(f"settings set needs KEY=VALUE pairs; keys: {', '.join(setting_names())}")
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise CLIError(f"{pair!r}: expected KEY=VALUE")
        if key not in setting_names():
            raise CLIError(f"unknown setting {key!r}; keys: {', '.join(setting_names())}")
        if key == "enabled":
            if value.lower() not in _BOOLS:
                raise CLIError(f"enabled={value!r}: use true or false")
            changes[key] = _BOOLS[value.lower()]
        elif key in _INT_SETTINGS:
            try:
                changes[key] = int(value)
            except ValueError:
                raise CLIError(f"{key}={value!r}: not an integer number of {_unit(key)}") from None
        elif key == "allowed_bots":
            changes[key] = [uid.strip() for uid in value.split(",") if uid.strip()]
        else:
            changes[key] = value
    return changes


def _unit(key: str) -> str:
    return "atoms" if key.endswith("_atoms") else "seconds"


def _set_offline(daemon: _Daemon, changes: dict[str, Any]) -> dict[str, Any]:
    """Apply ``changes`` to mcpclient.json directly (the admin surface is
    off) and have the daemon reload it."""
    path = daemon.datadir / SETTINGS_FILE
    try:
        current = load_settings(path)
        candidate = _settings_from_json(json.dumps(changes), base=current).normalized()
        candidate.validate()
    except SettingsError as exc:
        raise CLIError(str(exc)) from None
    except BridgeError as exc:
        raise CLIError(str(exc)) from None
    if candidate.enabled and not candidate.token:
        candidate = candidate.replace(token=mint_token())
    try:
        save_settings(path, candidate)
    except BridgeError as exc:
        raise CLIError(str(exc)) from None
    if not daemon.sighup:
        print(
            f"{PROG}: saved {path}; this daemon does not reload on SIGHUP, restart it to apply",
            file=sys.stderr,
        )
        return candidate.to_dict()
    try:
        os.kill(daemon.pid, signal.SIGHUP)
    except OSError as exc:
        raise CLIError(f"saved {path}, but could not signal the daemon (pid {daemon.pid}): {exc}") from None
    print(
        f"{PROG}: the bridge was disabled: saved {path} and sent SIGHUP to pid {daemon.pid}", file=sys.stderr
    )
    if not candidate.enabled:
        return candidate.to_dict()
    deadline = time.monotonic() + RELOAD_WAIT
    while True:
        try:
            answer = _admin(daemon, "GET", "/admin/settings")
        except CLIError:
            if time.monotonic() > deadline:
                raise CLIError(
                    f"saved {path}, but the daemon (pid {daemon.pid}) did not open {daemon.url} "
                    f"within {RELOAD_WAIT:.0f}s; see its log"
                ) from None
            time.sleep(0.1)
            continue
        return dict(answer)


def _cmd_settings(daemon: _Daemon, args: argparse.Namespace) -> None:
    if args.action is None:
        if args.pairs:
            raise CLIError("to change settings use: settings set KEY=VALUE...")
        result = _admin(daemon, "GET", "/admin/settings")
    else:
        changes = _parse_pairs(args.pairs)
        try:
            result = _admin(daemon, "PUT", "/admin/settings", changes)
        except _Disabled:
            result = _set_offline(daemon, changes)
    _print_json(result, args.json)


def _cmd_approvals(daemon: _Daemon, args: argparse.Namespace) -> None:
    if args.action == "list":
        if args.id is not None:
            raise CLIError("usage: approvals [approve ID | deny ID]")
        result = _admin(daemon, "GET", "/admin/approvals")
        if args.json:
            _print_json(result, True)
            return
        pending = result.get("pending") or []
        if not pending:
            print("no payments waiting for approval")
            return
        print(f"{'ID':<34} {'BOT':<18} {'TOOL':<20} {'ATOMS':>12}  CREATED")
        for p in pending:
            print(
                f"{_shown(p['id']):<34} {_shown(p['bot'])[:16]:<18} {_shown(p['tool']):<20} "
                f"{p['atoms']:>12}  {_when(p['created'])}"
            )
        return
    if not args.id:
        raise CLIError(f"approvals {args.action} needs a payment ID (see: {PROG} approvals)")
    result = _admin(daemon, "POST", f"/admin/approvals/{quote(args.id, safe='')}/{args.action}")
    if args.json:
        _print_json(result, True)
        return
    print(f"{'approved' if result.get('approved') else 'denied'} {result.get('id', args.id)}")


def _cmd_spend(daemon: _Daemon, args: argparse.Namespace) -> None:
    result = _admin(daemon, "GET", "/admin/spend")
    if args.json:
        _print_json(result, True)
        return
    entries = result.get("entries") or []
    if not entries:
        print("no payments yet")
    else:
        print(f"{'WHEN (UTC)':<20} {'BOT':<18} {'TOOL':<20} {'ATOMS':>12}  STATUS")
        for e in entries:
            status = _shown(e.get("status") or "paid")
            if e.get("err"):
                status += f" ({_shown(e['err'])})"
            print(
                f"{_when(e['ts']):<20} {_shown(e['bot'])[:16]:<18} {_shown(e['tool']):<20} "
                f"{e['atoms']:>12}  {status}"
            )
    print(f"spent in the last 24 hours: {result.get('day_total_atoms', 0)} atoms")


def _cmd_config_snippet(daemon: _Daemon, args: argparse.Namespace) -> None:
    uid = args.uid.strip()
    if not is_uid(uid):
        raise CLIError(f"bot uid {uid!r} is not 64 hex characters")
    result = _admin(daemon, "GET", f"/admin/config-snippet/{uid.lower()}")
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
            f"{PROG} --datadir {daemon.datadir} settings set allowed_bots=<uid>,...",
            file=sys.stderr,
        )


def _shown(value: Any) -> str:
    """``value`` for a terminal table: control and format characters (from a
    bot's tool name or brclient's error text) escaped, so they cannot move
    the cursor or rewrite what the user decides from."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _when(ts: Any) -> str:
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
}


# -- the daemon --------------------------------------------------------------------------


def _run_daemon(args: argparse.Namespace, datadir: Path) -> int:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        daemon = BridgeDaemon.from_datadir(datadir, listen=args.listen)
    except ClientrpcConfigError as exc:
        print(f"{PROG}: {exc} (see {datadir / (BOT_CONFIG_NAME + '.conf')})", file=sys.stderr)
        return 1
    except (BridgeError, ValueError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    try:
        anyio.run(partial(daemon.run, handle_signals=True))
    except BridgeError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 ok, 1 error)."""
    args = _parse_args(argv)
    datadir = Path(args.datadir).expanduser()
    if args.command is None:
        return _run_daemon(args, datadir)
    try:
        daemon = _locate(datadir)
        _COMMANDS[args.command](daemon, args)
    except CLIError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    return 0
