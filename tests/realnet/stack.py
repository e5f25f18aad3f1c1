"""brmcp-serve and brmcp-bridge as subprocesses on two users of a brnet (the
bot ``bot`` and the caller ``alice``), an official-SDK MCP agent on the
bridge, and the money books read from where the money is: the simulated
wallet's paid invoices (tips paid), the bot's ledger database (credits,
charges, balance) and the bridge's spend log."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from brmcp.bridge import Settings
from brmcp.bridge.daemon import read_runtime
from brmcp.clientrpc import load_bot_config
from brmcp.protocol.receipts import RECEIPT_KEY_FILENAME, ReceiptSigner
from brmcp.serve import init_datadir
from brmcp.serve.config import SERVE_CONFIG_FILE, ServeConfig, write_serve_config
from brmcp.server.pool import PoolConfig
from brmcp.testing.brnet import BrNet, BrNetUser
from brmcp.transport.router import Router

TOKEN = "realnet-agent-token-0123456789ab"
FORTUNE_ATOMS = 10_000


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Daemon:
    """A console command running as a subprocess, output in ``log``."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv = argv
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        fh = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT, env=_env())
        finally:
            fh.close()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class Books:
    """Everything in atoms. ``tips_paid``: invoices the simulated wallet paid
    to the bot; ``credited``: tips the bot's ledger credited; ``charges``:
    net charges (charges minus refunds); ``balance``: the caller's balance at
    the bot; ``spend_paid``/``spend_pending``: the bridge's spend log."""

    tips_paid: int
    credited: int
    charges: int
    balance: int
    spend_paid: int
    spend_pending: int
    spend_statuses: list[str]

    def check(self) -> None:
        """The money rule: tips paid = credits at the bot = charges + balance,
        and the bridge's log of paid tips agrees, to the atom."""
        assert self.tips_paid == self.credited, self
        assert self.credited == self.charges + self.balance, self
        assert self.spend_paid == self.tips_paid, self
        assert self.spend_pending == 0, self


@dataclass
class Stack:
    net: BrNet
    bot: BrNetUser
    caller: BrNetUser
    serve_dir: Path
    bridge_dir: Path
    serve: Daemon
    bridge: Daemon

    @property
    def url(self) -> str:
        record = read_runtime(self.bridge_dir)
        assert record is not None
        return f"{record['url']}/mcp/{self.bot.uid}"

    async def wait_bridge(self, limit: float = 60.0) -> None:
        assert self.bridge.proc is not None
        pid = self.bridge.proc.pid
        with anyio.fail_after(limit):
            while (read_runtime(self.bridge_dir) or {}).get("pid") != pid:
                if self.bridge.proc.poll() is not None:
                    raise AssertionError(f"brmcp-bridge exited:\n{self.bridge.tail()}")
                await anyio.sleep(0.1)

    def books(self) -> Books:
        paid = (
            json.loads((self.net.root / "simwallet.json").read_text())
            if (self.net.root / "simwallet.json").exists()
            else {}
        )
        tips_paid = sum(int(m) for m in paid.values()) // 1000
        db = sqlite3.connect(f"file:{self.serve_dir / 'brmcp.sqlite3'}?mode=ro", uri=True)
        try:
            rows = db.execute(
                "SELECT kind, COALESCE(SUM(atoms), 0) FROM movements WHERE peer = ? GROUP BY kind",
                (self.caller.uid,),
            ).fetchall()
            bal = db.execute("SELECT atoms FROM balances WHERE peer = ?", (self.caller.uid,)).fetchone()
        finally:
            db.close()
        kinds = dict(rows)
        credited = int(kinds.pop("tip", 0))
        charges = -sum(int(v) for v in kinds.values())
        spend_file = self.bridge_dir / "mcpspend.json"
        entries: list[dict[str, Any]] = json.loads(spend_file.read_text()) if spend_file.exists() else []
        if isinstance(entries, dict):
            entries = entries.get("entries", [])
        statuses = [str(e.get("status") or "paid") for e in entries]
        return Books(
            tips_paid=tips_paid,
            credited=credited,
            charges=charges,
            balance=int(bal[0]) if bal else 0,
            spend_paid=sum(
                int(e.get("atoms", 0)) for e, st in zip(entries, statuses, strict=True) if st == "paid"
            ),
            spend_pending=sum(1 for e in entries if e.get("status") == "pending"),
            spend_statuses=statuses,
        )

    async def settled_books(self, limit: float = 30.0) -> Books:
        """The books once the bridge has no pending spend and the bot has
        credited every paid tip (the bridge writes its log asynchronously)."""
        deadline = time.monotonic() + limit
        while True:
            books = self.books()
            if (
                books.spend_pending == 0 and books.tips_paid == books.credited
            ) or time.monotonic() > deadline:
                return books
            await anyio.sleep(0.2)


def start_serve(
    net: BrNet, bot: BrNetUser, caller: BrNetUser, datadir: Path, calls_per_minute: int | None = None
) -> Daemon:
    conf = bot.install_conf(datadir, "brmcp-serve")
    init_datadir(datadir, bot_config=load_bot_config(conf), allowed_uids=[caller.uid])
    if calls_per_minute is not None:
        config = ServeConfig(allowed_uids=(caller.uid,), calls_per_minute=calls_per_minute)
        write_serve_config(datadir / SERVE_CONFIG_FILE, config)
    daemon = Daemon([sys.executable, "-m", "brmcp.serve", "--datadir", str(datadir)], datadir / "serve.out")
    daemon.start()
    return daemon


def start_bridge(caller: BrNetUser, bot: BrNetUser, datadir: Path, **settings: Any) -> Daemon:
    caller.install_conf(datadir, "brmcp-bridge")
    base = Settings(
        enabled=True,
        token=TOKEN,
        mode="autopay",
        per_call_cap_atoms=20_000,
        per_day_cap_atoms=1_000_000,
        allowed_bots=(bot.uid,),
    )
    (datadir / "mcpclient.json").write_text(base.replace(**settings).to_json())
    daemon = Daemon(
        [sys.executable, "-m", "brmcp.bridge", "--datadir", str(datadir), "--listen", "127.0.0.1:0"],
        datadir / "bridge.out",
    )
    daemon.start()
    return daemon


@contextlib.asynccontextmanager
async def real_stack(
    factory: Callable[..., BrNet],
    tmp_path: Path,
    *,
    net_options: dict[str, Any] | None = None,
    calls_per_minute: int | None = None,
    **settings: Any,
) -> AsyncIterator[Stack]:
    """brnet with users ``bot`` and ``alice``, brmcp-serve on ``bot`` (alice
    allowed; ``calls_per_minute`` its rate limit, default the serve
    default), brmcp-bridge on ``alice`` (autopay, caps 20,000 / 1,000,000)."""
    options = {"users": ("bot", "alice"), **(net_options or {})}
    net = await anyio.to_thread.run_sync(lambda: factory(**options))
    bot, alice = net.user("bot"), net.user("alice")
    serve = start_serve(net, bot, alice, tmp_path / "serve", calls_per_minute)
    bridge = start_bridge(alice, bot, tmp_path / "bridge", **settings)
    stack = Stack(net, bot, alice, tmp_path / "serve", tmp_path / "bridge", serve, bridge)
    try:
        await stack.wait_bridge()
        yield stack
    finally:
        bridge.stop()
        serve.stop()


@contextlib.asynccontextmanager
async def agent(
    url: str, read_timeout: float = 120.0, max_sse_event_size: int = 1024 * 1024
) -> AsyncIterator[ClientSession]:
    """An official MCP SDK client session on the bridge (bearer token). The
    SDK refuses server-sent events over ``max_sse_event_size`` bytes (1 MiB
    by default): an agent expecting larger results must raise it."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=read_timeout) as http,
        streamable_http_client(url, http_client=http, max_sse_event_size=max_sse_event_size) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


# -- bot pools (WIRE.md §Pools) ---------------------------------------------------------


def kill(daemon: Daemon) -> None:
    """SIGKILL ``daemon`` and reap it (no shutdown path runs); idempotent."""
    proc, daemon.proc = daemon.proc, None
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def start_pool_member(
    member: BrNetUser,
    callers: Sequence[str],
    datadir: Path,
    store: str,
    pool: PoolConfig,
    receipt_key: Path,
    upstream: Sequence[str] = (),
    prices: str = "",
) -> Daemon:
    """brmcp-serve on ``member`` as one member of ``pool`` on the shared
    book ``store`` (a PostgreSQL URL): ``callers`` allowed, the rate limit
    out of the way, no plain-chat help, and the pool's ``receiptkey.json``
    (``receipt_key``) copied into ``datadir`` (mode 0600), as an operator
    sets up each member (README "Running a real bot"). With ``upstream``
    (a stdio MCP server's command) it sells that server's tools at the
    prices of ``prices`` (the ``prices.json`` text) instead of the example
    tools (README "Sell an MCP server you already have")."""
    member.install_conf(datadir, "brmcp-serve")
    config = ServeConfig(
        allowed_uids=tuple(callers), calls_per_minute=1_000_000, chat_help=False, store=store, pool=pool
    )
    write_serve_config(datadir / SERVE_CONFIG_FILE, config)
    target = datadir / RECEIPT_KEY_FILENAME
    if target.resolve() != receipt_key.resolve():
        shutil.copyfile(receipt_key, target)
    target.chmod(0o600)
    argv = [sys.executable, "-m", "brmcp.serve", "--datadir", str(datadir)]
    if upstream:
        (datadir / "prices.json").write_text(prices)
        argv += ["--upstream", *upstream]
    daemon = Daemon(argv, datadir / "serve.out")
    daemon.start()
    return daemon


def pool_receipt_key(datadir: Path) -> Path:
    """Create the pool's receipt key in ``datadir`` (``receiptkey.json``,
    :meth:`brmcp.protocol.receipts.ReceiptSigner.load_or_create`) and return
    its path, for :func:`start_pool_member` to copy to every member."""
    datadir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = datadir / RECEIPT_KEY_FILENAME
    ReceiptSigner.load_or_create(path)
    return path


@dataclass
class PoolBooks:
    """One caller's money in a pool's shared PostgreSQL book, in atoms.
    ``credited``: tips credited (at any member); ``charges``: net charges
    (charges minus refunds and recovery refunds); ``balance``: the caller's
    one balance; ``charges_per_key``: charge rows per callKey;
    ``refunds_per_key``: refund and recovery-refund rows per callKey;
    ``open_calls``: journal rows still ``charging``/``charged``;
    ``tips``: tip rows credited (one per tip); ``call_states``: each keyed
    journal row's state by callKey (``done`` once settled)."""

    credited: int
    charges: int
    balance: int
    charges_per_key: dict[str, int]
    refunds_per_key: dict[str, int]
    open_calls: int
    tips: int
    call_states: dict[str, str]

    def check(self) -> None:
        """Credits = charges + balance to the atom; every callKey charged at
        most once, refunded at most as often as charged."""
        assert self.credited == self.charges + self.balance, self
        assert all(n == 1 for n in self.charges_per_key.values()), self.charges_per_key
        assert all(self.charges_per_key.get(k, 0) >= n for k, n in self.refunds_per_key.items()), self


def pool_books(store: str, caller: str) -> PoolBooks:
    """Read :class:`PoolBooks` for ``caller`` from the shared book at ``store``
    (blocking: call it through ``anyio.to_thread.run_sync``)."""
    import psycopg

    with psycopg.connect(store, autocommit=True) as conn:
        kinds: dict[str, int] = {
            str(kind): int(atoms)
            for kind, atoms in conn.execute(
                "SELECT kind, COALESCE(SUM(atoms), 0) FROM movements WHERE peer = %s GROUP BY kind", (caller,)
            ).fetchall()
        }
        tips = conn.execute(
            "SELECT COUNT(*) FROM movements WHERE peer = %s AND kind = 'tip'", (caller,)
        ).fetchone()
        per_key = conn.execute(
            "SELECT call_key, kind, COUNT(*) FROM movements WHERE peer = %s AND call_key IS NOT NULL "
            "GROUP BY call_key, kind",
            (caller,),
        ).fetchall()
        bal = conn.execute("SELECT atoms FROM balances WHERE peer = %s", (caller,)).fetchone()
        open_calls = conn.execute(
            "SELECT COUNT(*) FROM calls WHERE state IN ('charging', 'charged')"
        ).fetchone()
        states = conn.execute(
            "SELECT call_key, state FROM calls WHERE peer = %s AND call_key IS NOT NULL", (caller,)
        ).fetchall()
    credited = int(kinds.pop("tip", 0))
    charges = -sum(kinds.values())
    charged: dict[str, int] = {}
    refunded: dict[str, int] = {}
    for key, kind, n in per_key:
        if kind == "charge":
            charged[str(key)] = int(n)
        elif kind in ("refund", "recovery_refund"):
            refunded[str(key)] = refunded.get(str(key), 0) + int(n)
    return PoolBooks(
        credited=credited,
        charges=charges,
        balance=int(bal[0]) if bal else 0,
        charges_per_key=charged,
        refunds_per_key=refunded,
        open_calls=int(open_calls[0]) if open_calls else 0,
        tips=int(tips[0]) if tips else 0,
        call_states={str(key): str(state) for key, state in states},
    )


def wallet_tips(net: BrNet) -> tuple[int, int]:
    """``(tips, atoms)`` the simulated wallet of ``net`` paid so far."""
    path = net.root / "simwallet.json"
    paid: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return len(paid), sum(int(m) for m in paid.values()) // 1000


def spend_entries(bridge_dir: Path) -> list[dict[str, Any]]:
    """The bridge's spend log (``mcpspend.json``) entries, oldest first."""
    path = bridge_dir / "mcpspend.json"
    entries: Any = json.loads(path.read_text()) if path.exists() else []
    if isinstance(entries, dict):
        entries = entries.get("entries", [])
    return list(entries)


@contextlib.asynccontextmanager
async def pm_router(user: BrNetUser) -> AsyncIterator[Router]:
    """A client-role :class:`brmcp.transport.router.Router` on ``user``'s
    brclient (PMs in from its PM stream, out through ``send_pm``): dial a
    bot with ``router.dial(uid)`` and run an SDK ``ClientSession`` on the
    returned connection's streams, as a directory does."""
    async with user.client(backoff_initial=0.05, backoff_max=0.2, ping_interval=None) as client:
        await client.wait_connected()
        sub = client.pm_stream()
        await sub.wait_open()
        async with Router(client) as router, anyio.create_task_group() as tg:

            async def feed() -> None:
                async for pm in sub:
                    router.handle_pm(pm.uid, pm.message)
                    await client.ack_received_pm(pm.sequence_id)

            tg.start_soon(feed)
            yield router
            tg.cancel_scope.cancel()
