"""``brmcp-fakebr``: a fake relay with one fake brclient per user, on loopback.

    brmcp-fakebr --datadir DIR --users bot,alice

For each user it creates ``DIR/<user>/`` like a brclient root (``rpc.cert``,
``rpc.key``, ``rpc-ca.cert``, ``rpc-client.cert``, ``rpc-client.key`` and a
``brclient.conf`` with its ``[clientrpc]`` section), makes all users mutual
contacts, prints each user's uid, URL and certificate paths, writes the same
as JSON to ``DIR/fakebr.json``, and serves until SIGINT/SIGTERM. One
process per DIR: a second one on a DIR in use exits 1 naming the first's pid.

The next run on the same DIR reuses each user's uid and, unless ``--port`` is
given, its port from ``fakebr.json``, so configs written for the previous run
(allowlists, ``brmcp-serve.conf``) stay valid; a port that is taken now is
replaced by a free one, with a notice on stderr that names the config
files ``--write-confs`` changed and the daemons to restart (SIGHUP does not
reload a ``.conf``). ``--port N`` gives the users
the ports N, N+1, … in ``--users`` order; when one of them (or ``--host``)
cannot be bound, it prints one line naming the address
(``brmcp-fakebr: cannot listen on 127.0.0.1:N: address already in use
(another process holds it; choose another with --port)``) and exits 1
before it creates anything in DIR.

``--write-confs CONFS`` also writes ready ``brmcp-serve`` and
``brmcp-bridge`` configs for these users (:func:`write_confs`); with
``--gateway CMD`` it adds ``CONFS/brmcp-gateway/``, the same bot selling the
stdio MCP server CMD (brmcp/gateway) instead of the example tools.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio

from ..._ops.console import add_version
from ..._ops.lockfile import LockHeldError, acquire
from ...metrics.endpoint import cannot_listen
from .relay import FakeRelay
from .server import FakeBRClient

if TYPE_CHECKING:
    from ...clientrpc import BotConfig

__all__ = ["LOCK_FILE", "SUMMARY_FILE", "main", "write_confs"]

#: The summary written into the data directory (and read back on the next run).
SUMMARY_FILE = "fakebr.json"
#: Held (flock) while it runs: a second brmcp-fakebr on the same directory refuses to start.
LOCK_FILE = "fakebr.lock"

_NICK = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="brmcp-fakebr",
        description="Run a fake Bison Relay with one fake brclient (clientrpc over TLS) per user.",
    )
    add_version(parser, "brmcp-fakebr")
    parser.add_argument("--datadir", required=True, help="directory for the users' brclient-style roots")
    parser.add_argument("--users", required=True, help="comma-separated nicks, e.g. bot,alice")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="first port; users get consecutive ports (default: each user's port from the previous "
        "run's fakebr.json when free, else any free port)",
    )
    parser.add_argument(
        "--auth",
        metavar="USER:PASS",
        help="turn on Basic auth (rpcauthmode=basic) with these credentials for every fake brclient",
    )
    parser.add_argument(
        "--write-confs",
        metavar="DIR",
        help="also write ready configs into DIR: brmcp-serve/ (brmcp-serve.conf for the first user, the "
        "bot, and brmcp.json allowing the others) and brmcp-bridge-<nick>/ for each other user "
        "(brmcp-bridge.conf, and mcpclient.json enabled for the bot with caps of 20,000 atoms per call "
        "and 100,000 per day, approval mode); the .conf files are rewritten on every run, the JSON "
        "files only when missing",
    )
    parser.add_argument(
        "--gateway",
        metavar="CMD",
        help="with --write-confs: also write brmcp-gateway/ (brmcp-serve.conf for the bot and brmcp.json "
        'allowing the others, with an "upstream" block), a bot that sells the stdio MCP server CMD '
        "(one string, split like a shell would, e.g. 'uvx mcp-server-time') instead of the example "
        "tools; run it or brmcp-serve/, not both (one harness per brclient)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--log-level", default="warning", help="logging level (default warning)")
    return parser.parse_args(argv)


def _users(spec: str) -> list[str]:
    users = [u.strip() for u in spec.split(",") if u.strip()]
    if not users:
        raise SystemExit("brmcp-fakebr: --users needs at least one nick")
    for nick in users:
        if not _NICK.fullmatch(nick):
            raise SystemExit(f"brmcp-fakebr: invalid nick {nick!r} (letters, digits, _ . -)")
    if len(set(users)) != len(users):
        raise SystemExit("brmcp-fakebr: duplicate nick in --users")
    return users


@dataclass(frozen=True, slots=True)
class _Previous:
    """What the previous run's summary says about one user."""

    uid: str
    port: int = 0


def _previous_users(summary: Path) -> dict[str, _Previous]:
    """Nick → uid and port from a summary written by an earlier run; an
    unreadable or malformed file (or entry) contributes nothing."""
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
        users = data.get("users", [])
    except (OSError, ValueError, AttributeError):
        return {}
    found: dict[str, _Previous] = {}
    for user in users if isinstance(users, list) else ():
        try:
            nick, uid = str(user["nick"]), str(user["uid"])
        except (KeyError, TypeError):
            continue
        port = 0
        try:
            port = urlsplit(str(user.get("url", ""))).port or 0
        except ValueError:
            pass
        found[nick] = _Previous(uid, port)
    return found


def _describe(br: FakeBRClient, conf: Path) -> dict[str, Any]:
    return {
        "nick": br.nick,
        "uid": br.uid,
        "url": br.url,
        "root": str(br.root),
        "servercertpath": str(br.certs.server_cert),
        "clientcertpath": str(br.certs.client_cert),
        "clientkeypath": str(br.certs.client_key),
        "cacertpath": str(br.certs.ca_cert),
        "brclientconf": str(conf),
        "rpcuser": br.rpcuser,
        "rpcpass": br.rpcpass,
    }


def _write_summary(path: Path, summary: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(summary, indent=2))
    os.replace(tmp, path)


class _CannotListen(Exception):
    """A fake brclient cannot listen on its address; the message is the one line to print."""


def _probe(host: str, port: int) -> None:
    """Bind ``host:port`` the way :class:`FakeBRClient` does and close it
    again (port 0 checks the host only). Raises OSError."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))


def _cannot_listen(host: str, port: int, exc: OSError) -> _CannotListen:
    host_problem = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
    return _CannotListen(cannot_listen(host, port, exc, option="--host" if host_problem else "--port"))


def _check_ports(host: str, first: int, count: int) -> None:
    """Raise :class:`_CannotListen` for the first of ``first`` … ``first +
    count - 1`` (or, with ``first`` 0, for ``host``) that cannot be bound."""
    for port in range(first, first + count) if first else (0,):
        try:
            _probe(host, port)
        except OSError as exc:
            raise _cannot_listen(host, port, exc) from None


@dataclass(frozen=True, slots=True)
class _Moved:
    """A user whose port from the previous run was taken: it got another."""

    nick: str
    old_port: int
    new_port: int
    old_url: str
    why: str


async def _start(
    stack: contextlib.AsyncExitStack, fake: FakeBRClient, explicit: bool
) -> tuple[FakeBRClient, _Moved | None]:
    """Start ``fake`` on its port; a port remembered from the previous run
    that is taken now falls back to a free one (explicit ports do not),
    returned as a :class:`_Moved`. Raises :class:`_CannotListen` when the
    address cannot be bound."""
    previous: tuple[int, str, OSError] | None = None
    try:
        _probe(fake.host, fake.port)
    except OSError as exc:
        if explicit or fake.port == 0:
            raise _cannot_listen(fake.host, fake.port, exc) from None
        previous, fake.port = (fake.port, fake.url, exc), 0
    try:
        started = await stack.enter_async_context(fake)
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise _cannot_listen(fake.host, fake.port, exc) from None
        raise
    if previous is None:
        return started, None
    port, url, why = previous
    return started, _Moved(fake.nick, port, started.port, url, str(why.strerror or why))


def _notices(moved: Sequence[_Moved], changed: Sequence[dict[str, str]]) -> list[str]:
    """The stderr lines after a start: one per user whose port moved, then
    one naming the config files ``--write-confs`` changed (``changed``:
    ``{"nick", "path", "daemon"}``) and the daemons to restart."""
    lines = []
    covered = {entry["nick"] for entry in changed}
    for move in moved:
        line = (
            f"brmcp-fakebr: {move.nick}'s previous port {move.old_port} is not free ({move.why}); "
            f"using {move.new_port}"
        )
        if move.nick in covered:
            line += " (pin ports with --port)"
        else:
            line += (
                f": update configs that name {move.old_url} and restart the daemons using them, "
                "or pin ports with --port"
            )
        lines.append(line)
    if changed:
        paths = _and([entry["path"] for entry in changed])
        daemons = list(dict.fromkeys(entry["daemon"] for entry in changed))
        which = "it" if len(daemons) == 1 else "whichever of these runs"
        lines.append(
            f"brmcp-fakebr: changed {paths}; SIGHUP does not reload a .conf, so restart {which}: "
            + "; ".join(daemons)
        )
    return lines


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


async def _serve(
    args: argparse.Namespace, datadir: Path, nicks: list[str], known: dict[str, _Previous]
) -> None:
    user, password, mode = "", "", ""
    if args.auth:
        user, sep, password = args.auth.partition(":")
        if not sep or not user or not password:
            raise SystemExit("brmcp-fakebr: --auth must be USER:PASS with both non-empty")
        mode = "basic"
    summary_path = datadir / SUMMARY_FILE
    async with FakeRelay() as relay, contextlib.AsyncExitStack() as stack:
        fakes: list[FakeBRClient] = []
        moved: list[_Moved] = []
        for index, nick in enumerate(nicks):
            previous = known.get(nick)
            fake = FakeBRClient(
                relay,
                nick,
                datadir / nick,
                uid=previous.uid if previous else None,
                host=args.host,
                port=args.port + index if args.port else (previous.port if previous else 0),
                auth_mode=mode,
                rpcuser=user,
                rpcpass=password,
            )
            started, move = await _start(stack, fake, explicit=bool(args.port))
            fakes.append(started)
            if move is not None:
                moved.append(move)
        relay.kx_all(*fakes)
        described = [_describe(f, await anyio.to_thread.run_sync(f.write_brclient_conf)) for f in fakes]
        summary: dict[str, Any] = {"relay": "fake", "users": described}
        if args.write_confs:
            summary["confs"] = await anyio.to_thread.run_sync(
                partial(write_confs, Path(args.write_confs), fakes, gateway=args.gateway_command)
            )
        for line in _notices(moved, summary["confs"]["changed"] if args.write_confs else []):
            print(line, file=sys.stderr, flush=True)
        await anyio.to_thread.run_sync(_write_summary, summary_path, summary)
        # Signals are caught before the summary says the network is up, so a
        # stop right after it is still a clean one.
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            _print_summary(summary, summary_path, as_json=args.json)
            async for signum in signals:
                print(f"brmcp-fakebr: {signal.Signals(signum).name}, stopping", file=sys.stderr, flush=True)
                break


#: Caps written into a new ``mcpclient.json`` by ``--write-confs`` (atoms).
CONF_PER_CALL_CAP = 20_000
CONF_PER_DAY_CAP = 100_000


def write_confs(
    target: Path, fakes: Sequence[FakeBRClient], *, gateway: Sequence[str] | None = None
) -> dict[str, Any]:
    """Write ready configs for ``fakes`` (the first is the bot) under
    ``target``: ``brmcp-serve/brmcp-serve.conf`` and ``brmcp.json`` (allowing
    every other user), and for each other user ``brmcp-bridge-<nick>/``
    with ``brmcp-bridge.conf`` and ``mcpclient.json`` (enabled, the bot
    allowed, caps of :data:`CONF_PER_CALL_CAP`/:data:`CONF_PER_DAY_CAP`
    atoms, approval mode, a fresh token). With ``gateway`` (the argv of a
    stdio MCP server) also ``brmcp-gateway/``: the bot's
    ``brmcp-serve.conf`` and a ``brmcp.json`` allowing the others with an
    ``upstream`` block running that command (brmcp/gateway; its first
    ``brmcp-serve`` run writes ``prices.json`` listing the upstream's tools).
    The ``.conf`` files follow the fakes' current URLs on every run; the
    JSON files are written only when missing, so the user's own settings
    survive. Returns ``{"serve": dir, "gateway": dir (with ``gateway``),
    "bridges": {nick: dir}, "written": [paths], "changed": [{"nick", "path",
    "daemon"}], "next_steps": [lines]}``, where ``changed`` lists the
    ``.conf`` files that existed with another URL, certificate path or
    (with Basic auth) credentials, each with the command of the daemon
    that reads it (a running one must be restarted to follow).
    Raises OSError or ClientrpcConfigError when a file cannot be written."""
    from brmcp.bridge.base import MODE_APPROVAL, SETTINGS_FILE, Settings, mint_token, save_settings

    bot, others = fakes[0], list(fakes[1:])
    written: list[str] = []
    changed: list[dict[str, str]] = []
    allowed = [f.uid for f in others]
    serve_dir = target / "brmcp-serve"
    written += _write_bot_dir(serve_dir, bot, {"allowed_uids": allowed, "calls_per_minute": 30}, changed)
    gateway_dir = target / "brmcp-gateway"
    if gateway:
        block = {"allowed_uids": allowed, "calls_per_minute": 30, "upstream": {"command": list(gateway)}}
        written += _write_bot_dir(gateway_dir, bot, block, changed)
    bridges: dict[str, str] = {}
    for fake in others:
        bridge_dir = target / f"brmcp-bridge-{fake.nick}"
        bridge_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        conf = bridge_dir / "brmcp-bridge.conf"
        if _write_conf(conf, fake, fake.bot_config(bridge_dir, "brmcp-bridge")):
            changed.append(
                {"nick": fake.nick, "path": str(conf), "daemon": f"brmcp-bridge --datadir {bridge_dir}"}
            )
        written.append(str(conf))
        settings_path = bridge_dir / SETTINGS_FILE
        if not settings_path.exists():
            settings = Settings(
                enabled=True,
                token=mint_token(),
                mode=MODE_APPROVAL,
                per_call_cap_atoms=CONF_PER_CALL_CAP,
                per_day_cap_atoms=CONF_PER_DAY_CAP,
                allowed_bots=(bot.uid,),
            )
            save_settings(settings_path, settings)
            written.append(str(settings_path))
        bridges[fake.nick] = str(bridge_dir)
    steps = [f"configs in {target} (the bot is {bot.nick}, uid {bot.uid}):"]
    steps.append(f"  brmcp-serve --datadir {serve_dir}")
    if gateway:
        steps.append(
            f"  brmcp-serve --datadir {gateway_dir}    (instead: the bot selling {shlex.join(gateway)}; "
            "its first run lists the tools into prices.json, the next one serves)"
        )
    for nick, path in bridges.items():
        steps.append(f"  brmcp-bridge --datadir {path}    ({nick}'s bridge; then, in another terminal:)")
        steps.append(f"  brmcp-bridge --datadir {path} config-snippet {bot.uid}")
        steps.append(f"  brmcp-bridge --datadir {path} ui    (a login link to approve payments)")
    result: dict[str, Any] = {"serve": str(serve_dir)}
    if gateway:
        result["gateway"] = str(gateway_dir)
    return result | {"bridges": bridges, "written": written, "changed": changed, "next_steps": steps}


def _write_conf(path: Path, fake: FakeBRClient, cfg: BotConfig) -> bool:
    """Write ``cfg`` to ``path``; True when the file existed and a daemon
    reading it would now reach brclient differently (URL, certificate
    paths, or the credentials of a fake with Basic auth; without auth the
    credentials are random each run and brclient ignores them)."""
    from ...clientrpc import ClientrpcConfigError, load_bot_config, write_bot_config

    old: BotConfig | None = None
    existed = path.exists()
    if existed:
        with contextlib.suppress(ClientrpcConfigError, OSError):
            old = load_bot_config(path)
    write_bot_config(path, cfg)
    if not existed:
        return False
    if old is None:
        return True
    fields = ["brrpcurl", "servercertpath", "clientcertpath", "clientkeypath"]
    if fake.rpcuser or fake.rpcpass:
        fields += ["rpcuser", "rpcpass"]
    return any(getattr(old, name) != getattr(cfg, name) for name in fields)


def _write_bot_dir(
    directory: Path, bot: FakeBRClient, harness: dict[str, Any], changed: list[dict[str, str]]
) -> list[str]:
    """``brmcp-serve.conf`` for ``bot`` (always) and ``brmcp.json`` with
    ``harness`` (only when missing) in ``directory``; the paths written. A
    changed ``.conf`` (:func:`_write_conf`) is added to ``changed``."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    conf = directory / "brmcp-serve.conf"
    if _write_conf(conf, bot, bot.bot_config(directory, "brmcp-serve")):
        changed.append({"nick": bot.nick, "path": str(conf), "daemon": f"brmcp-serve --datadir {directory}"})
    written = [str(conf)]
    allow = directory / "brmcp.json"
    if not allow.exists():
        fd = os.open(allow, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(harness, indent=2) + "\n")
        written.append(str(allow))
    return written


def _print_summary(summary: dict[str, Any], summary_path: Path, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary), flush=True)
        return
    users = summary["users"]
    contacts = " (all mutual contacts)" if len(users) > 1 else ""
    print(f"brmcp-fakebr: fake relay with {_plural(len(users), 'user')}{contacts}", flush=True)
    for d in users:
        print(f"{d['nick']}: uid {d['uid']}", flush=True)
        print(f"  url             {d['url']}", flush=True)
        print(f"  servercertpath  {d['servercertpath']}", flush=True)
        print(f"  clientcertpath  {d['clientcertpath']}", flush=True)
        print(f"  clientkeypath   {d['clientkeypath']}", flush=True)
        print(f"  brclient.conf   {d['brclientconf']}", flush=True)
    confs = summary.get("confs")
    if confs:
        print("", flush=True)
        for line in confs["next_steps"]:
            print(line, flush=True)
        print("", flush=True)
    print(f"summary written to {summary_path}; Ctrl-C to stop", flush=True)
    print(
        "the next run reuses these uids and ports (a taken port is replaced); "
        "--port N pins them to N, N+1, ...",
        flush=True,
    )


class _Made:
    """What a run is about to create in the data directory (the directory
    itself, the users' roots, the lock file), to remove when it cannot start."""

    def __init__(self, datadir: Path, nicks: Sequence[str]) -> None:
        self.datadir = datadir
        self.new_dir = not datadir.exists()
        self.new_roots = [datadir / nick for nick in nicks if not (datadir / nick).exists()]
        self.new_lock = not (datadir / LOCK_FILE).exists()

    def remove(self) -> None:
        if self.new_dir:
            shutil.rmtree(self.datadir, ignore_errors=True)
            return
        for root in self.new_roots:
            shutil.rmtree(root, ignore_errors=True)
        if self.new_lock:
            with contextlib.suppress(OSError):
                (self.datadir / LOCK_FILE).unlink()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 after a clean stop,
    1 when it cannot start: an address that cannot be bound, a data
    directory in use, an OS error)."""
    args = _parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    datadir = Path(args.datadir).expanduser().resolve()
    if args.write_confs:
        args.write_confs = str(Path(args.write_confs).expanduser().resolve())
    nicks = _users(args.users)
    args.gateway_command = None
    if args.gateway is not None:
        if not args.write_confs:
            raise SystemExit(
                "brmcp-fakebr: --gateway CMD needs --write-confs DIR (it writes the bot's configs)"
            )
        try:
            args.gateway_command = shlex.split(args.gateway)
        except ValueError as exc:
            raise SystemExit(f"brmcp-fakebr: --gateway {args.gateway!r}: {exc}") from None
        if not args.gateway_command:
            raise SystemExit("brmcp-fakebr: --gateway needs a command, e.g. --gateway 'uvx mcp-server-time'")
    if args.port and not 1 <= args.port <= 65536 - len(nicks):
        raise SystemExit(
            f"brmcp-fakebr: --port {args.port}: the {len(nicks)} user(s) take ports {args.port} to "
            f"{args.port + len(nicks) - 1}, which must lie within 1-65535 (0 or no --port: any free port)"
        )
    try:
        # Before anything is created in the data directory.
        _check_ports(args.host, args.port, len(nicks))
    except _CannotListen as exc:
        print(f"brmcp-fakebr: {exc}", file=sys.stderr)
        return 1
    made = _Made(datadir, nicks)
    try:
        datadir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with acquire(datadir / LOCK_FILE, what="brmcp-fakebr", detail=str(datadir)):
            anyio.run(_serve, args, datadir, nicks, _previous_users(datadir / SUMMARY_FILE))
    except _CannotListen as exc:
        # Taken between the check and the start: remove what this run made.
        made.remove()
        print(f"brmcp-fakebr: {exc}", file=sys.stderr)
        return 1
    except LockHeldError as exc:
        print(
            f"brmcp-fakebr: another brmcp-fakebr (pid {exc.pid}) is already using {datadir}; "
            f"stop it first (lock {exc.path})",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(f"brmcp-fakebr: {exc}", file=sys.stderr)
        return 1
    return 0
