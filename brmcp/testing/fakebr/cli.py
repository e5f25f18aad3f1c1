"""``brmcp-fakebr``: a fake relay with one fake brclient per user, on loopback.

    brmcp-fakebr --datadir DIR --users bot,alice

For each user it creates ``DIR/<user>/`` like a brclient root (``rpc.cert``,
``rpc.key``, ``rpc-ca.cert``, ``rpc-client.cert``, ``rpc-client.key`` and a
``brclient.conf`` with its ``[clientrpc]`` section), makes all users mutual
contacts, prints each user's uid, URL and certificate paths, writes the same
as JSON to ``DIR/fakebr.json`` (uids are reused from it on the next run), and
serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from .relay import FakeRelay
from .server import FakeBRClient

__all__ = ["main"]

_NICK = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="brmcp-fakebr",
        description="Run a fake Bison Relay with one fake brclient (clientrpc over TLS) per user.",
    )
    parser.add_argument("--datadir", required=True, help="directory for the users' brclient-style roots")
    parser.add_argument("--users", required=True, help="comma-separated nicks, e.g. bot,alice")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="first port; users get consecutive ports (default 0: any free port)",
    )
    parser.add_argument(
        "--auth",
        metavar="USER:PASS",
        help="turn on Basic auth (rpcauthmode=basic) with these credentials for every fake brclient",
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


def _previous_uids(summary: Path) -> dict[str, str]:
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
        return {str(u["nick"]): str(u["uid"]) for u in data.get("users", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


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


async def _serve(args: argparse.Namespace, datadir: Path, nicks: list[str], known: dict[str, str]) -> None:
    user, password, mode = "", "", ""
    if args.auth:
        user, sep, password = args.auth.partition(":")
        if not sep or not user or not password:
            raise SystemExit("brmcp-fakebr: --auth must be USER:PASS with both non-empty")
        mode = "basic"
    summary_path = datadir / "fakebr.json"
    async with FakeRelay() as relay, contextlib.AsyncExitStack() as stack:
        fakes: list[FakeBRClient] = []
        for index, nick in enumerate(nicks):
            fake = FakeBRClient(
                relay,
                nick,
                datadir / nick,
                uid=known.get(nick),
                host=args.host,
                port=args.port + index if args.port else 0,
                auth_mode=mode,
                rpcuser=user,
                rpcpass=password,
            )
            fakes.append(await stack.enter_async_context(fake))
        relay.kx_all(*fakes)
        described = [_describe(f, await anyio.to_thread.run_sync(f.write_brclient_conf)) for f in fakes]
        summary = {"relay": "fake", "users": described}
        await anyio.to_thread.run_sync(_write_summary, summary_path, summary)
        if args.json:
            print(json.dumps(summary), flush=True)
        else:
            print(f"brmcp-fakebr: fake relay with {len(fakes)} users (all mutual contacts)", flush=True)
            for d in described:
                print(f"{d['nick']}: uid {d['uid']}", flush=True)
                print(f"  url             {d['url']}", flush=True)
                print(f"  servercertpath  {d['servercertpath']}", flush=True)
                print(f"  clientcertpath  {d['clientcertpath']}", flush=True)
                print(f"  clientkeypath   {d['clientkeypath']}", flush=True)
                print(f"  brclient.conf   {d['brclientconf']}", flush=True)
            print(f"summary written to {summary_path}; Ctrl-C to stop", flush=True)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                print(f"brmcp-fakebr: {signal.Signals(signum).name}, stopping", file=sys.stderr, flush=True)
                break


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    args = _parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    datadir = Path(args.datadir).expanduser().resolve()
    nicks = _users(args.users)
    try:
        datadir.mkdir(mode=0o700, parents=True, exist_ok=True)
        anyio.run(_serve, args, datadir, nicks, _previous_uids(datadir / "fakebr.json"))
    except OSError as exc:
        print(f"brmcp-fakebr: {exc}", file=sys.stderr)
        return 1
    return 0
