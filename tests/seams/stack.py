"""The long-lived stack the seam tests inject faults into.

* the fake relay with two fake brclients, ``bot`` and ``alice``
  (:mod:`brmcp.testing.fakebr`), run in the test's process so their wallet
  and tip records can be read and their websockets dropped; "stopping the
  relay" takes both fake brclients down (their listeners closed, their users
  off the relay: PMs are stored, tips wait) and brings them back on the same
  ports with the same replay logs;
* ``brmcp-serve`` (the bot, selling the example ``fortune`` at
  :data:`PRICE` atoms) as a child process on one data directory, its book on
  SQLite or on a PostgreSQL database;
* ``brmcp-bridge`` (alice's payer, autopay within caps) as a child process on
  one data directory and HTTP port.

Only a killed component is restarted; everything else keeps running from one
run to the next. The ledger is read with :mod:`brmcp.server.store.reports` (one
snapshot per read, safe while the bot runs).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from brmcp.bridge.daemon import read_runtime, resolve_listen
from brmcp.serve.config import SERVE_CONFIG_FILE, ServeConfig, write_serve_config
from brmcp.serve.reports import report_store
from brmcp.serve.tools import FORTUNE_PRICE_ATOMS
from brmcp.server.store.reports import balances, open_book, statement
from brmcp.testing.fakebr import KIND_PM, KIND_TIP_RECEIVED, FakeBRClient, FakeRelay
from tests.bridge.test_daemon import TOKEN, bridge_settings, prepare_bridge_dir
from tests.kit.serve import prepare_serve_dir

PRICE = FORTUNE_PRICE_ATOMS
#: The bridge's tip_wait_secs: how long a payment in doubt blocks a second one.
TIP_WAIT = 3


@dataclass
class Ledger:
    """One snapshot of the bot's book for the payer: its movements
    ``(kind, atoms, call_key)``, its balance, and the sum of all balances."""

    movements: list[tuple[str, int, str | None]]
    balance: int
    all_balances: int

    def total(self, kind: str) -> int:
        return sum(atoms for k, atoms, _ in self.movements if k == kind)

    def charge_keys(self) -> list[str]:
        return [key or "" for k, _, key in self.movements if k == "charge"]


class Child:
    """One brmcp command as a child process (``argv`` after ``python -m``),
    logging to ``logs/<name>-<n>.log``; ``ready`` tells when a start is done."""

    def __init__(self, name: str, argv: list[str], logs: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.logs = logs
        self.env = env
        self.proc: anyio.abc.Process | None = None
        self.starts = 0

    async def start(self, ready: Callable[[int], bool]) -> None:
        self.starts += 1
        log = (self.logs / f"{self.name}-{self.starts}.log").open("wb")
        cmd = [sys.executable, "-m", *self.argv]
        self.proc = await anyio.open_process(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        proc = self.proc
        with anyio.fail_after(60):
            while not ready(proc.pid):
                if proc.returncode is not None:
                    raise RuntimeError(f"{self.name} exited with {proc.returncode} (see {self.logs})")
                await anyio.sleep(0.02)

    async def kill(self) -> None:
        proc, self.proc = self.proc, None
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        with anyio.move_on_after(20):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.aclose()


@dataclass
class Stack:
    """The running stack; :attr:`tips_started` / :attr:`tips_completed` /
    :attr:`tips_received` are the fake wallet's records of alice's tips to
    the bot (milliatoms), kept by wrapping the fakes' event emitters."""

    root: Path
    relay: FakeRelay
    bot: FakeBRClient
    alice: FakeBRClient
    serve: Child
    bridge: Child
    store: str
    listen: str
    tips_started: list[int] = field(default_factory=list)
    tips_completed: list[int] = field(default_factory=list)
    tips_received: list[int] = field(default_factory=list)
    relay_down: bool = False

    @property
    def url(self) -> str:
        return f"http://{self.listen}/mcp/{self.bot.uid}"

    @property
    def serve_dir(self) -> Path:
        return self.root / "serve"

    @property
    def bridge_dir(self) -> Path:
        return self.root / "bridge"

    # -- starting components -----------------------------------------------------------

    async def start_serve(self) -> None:
        """Start brmcp-serve; ready once its PM and tip streams are open at
        the bot's fake brclient (those of a killed process died with its
        connection)."""
        before = self.bot.total_connections

        def ready(_pid: int) -> bool:
            return (
                self.bot.total_connections > before
                and self.bot.stream_count(KIND_PM) >= 1
                and self.bot.stream_count(KIND_TIP_RECEIVED) >= 1
            )

        await self.serve.start(ready)

    async def start_bridge(self) -> None:
        await self.bridge.start(lambda pid: (read_runtime(self.bridge_dir) or {}).get("pid") == pid)

    async def relay_stop(self) -> None:
        """Take the whole fake relay down: both fake brclients close their
        listeners and connections and go offline (their replay logs saved)."""
        self.relay_down = True
        for fake in (self.bot, self.alice):
            await fake.__aexit__(None, None, None)

    async def relay_start(self) -> None:
        """Bring the fake brclients back on the same ports and state."""
        for fake in (self.bot, self.alice):
            await fake.__aenter__()
        self.relay_down = False

    # -- the books ----------------------------------------------------------------------

    def ledger(self) -> Ledger:
        book = open_book(self.serve_dir, report_store(self.serve_dir))
        try:
            with book.snapshot():
                lines = statement(book, self.alice.uid)
                rows = balances(book)
        finally:
            book.close()
        movements = [(line.entry.kind, line.entry.atoms, line.entry.call_key) for line in lines]
        mine = [atoms for uid, atoms in rows if uid == self.alice.uid]
        return Ledger(movements, sum(mine), sum(atoms for _, atoms in rows))

    def terminate_store_backends(self) -> int:
        """pg_terminate_backend on every backend of the bot's database
        (PostgreSQL only); returns how many were ended."""
        import psycopg

        with psycopg.connect(self.store, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        return sum(1 for (ended,) in rows if ended)


@contextlib.asynccontextmanager
async def running_stack(root: Path, store: str) -> AsyncIterator[Stack]:
    """The stack on ``root`` with the bot's book at ``store`` (``sqlite:`` or
    a PostgreSQL URL); every component stopped on exit."""
    (root / "logs").mkdir(parents=True)
    (root / "locks").mkdir()
    async with FakeRelay() as relay:
        bot = FakeBRClient(relay, "bot", root / "br" / "bot")
        alice = FakeBRClient(relay, "alice", root / "br" / "alice")
        relay.kx_all(bot, alice)
        await bot.__aenter__()
        await alice.__aenter__()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "BRMCP_LOCK_DIR": str(root / "locks")}
        serve_dir, bridge_dir = root / "serve", root / "bridge"
        prepare_serve_dir(serve_dir, bot, [alice.uid])
        # A high rate limit: the runs send many calls a minute on purpose.
        write_serve_config(
            serve_dir / SERVE_CONFIG_FILE,
            ServeConfig(allowed_uids=(alice.uid,), calls_per_minute=100_000, store=store),
        )
        prepare_bridge_dir(
            bridge_dir,
            alice,
            bridge_settings(
                bot.uid, per_call_cap_atoms=2 * PRICE, per_day_cap_atoms=10**12, tip_wait_secs=TIP_WAIT
            ),
        )
        listen = resolve_listen("127.0.0.1:0")
        serve = Child(
            "serve", ["brmcp.serve", "--datadir", str(serve_dir), "--log-level", "debug"], root / "logs", env
        )
        bridge_argv = [
            "brmcp.bridge",
            "--datadir",
            str(bridge_dir),
            "--listen",
            listen,
            "--log-level",
            "debug",
        ]
        bridge = Child("bridge", bridge_argv, root / "logs", env)
        stack = Stack(root, relay, bot, alice, serve, bridge, store, listen)
        _record_tips(stack)
        try:
            await stack.start_serve()
            await stack.start_bridge()
            yield stack
        finally:
            with anyio.CancelScope(shield=True):
                for child in (bridge, serve):
                    with contextlib.suppress(Exception):
                        await child.stop()
                if stack.relay_down:
                    await stack.relay_start()
                await alice.__aexit__(None, None, None)
                await bot.__aexit__(None, None, None)


def _record_tips(stack: Stack) -> None:
    """Keep the fake wallet's records of alice's tips to the bot."""
    start_tip = stack.relay.start_tip
    emit_progress = stack.alice.emit_tip_progress
    emit_received = stack.bot.emit_received_tip

    def starting(sender: Any, to_uid: str, amount_matoms: int, *args: Any) -> None:
        if sender is stack.alice and to_uid == stack.bot.uid:
            stack.tips_started.append(amount_matoms)
        start_tip(sender, to_uid, amount_matoms, *args)

    def progress(to_uid: str, amount_matoms: int, **kwargs: Any) -> Any:
        event = emit_progress(to_uid, amount_matoms, **kwargs)
        if kwargs.get("completed") and to_uid == stack.bot.uid:
            stack.tips_completed.append(amount_matoms)
        return event

    def received(from_uid: str, amount_matoms: int, **kwargs: Any) -> Any:
        event = emit_received(from_uid, amount_matoms, **kwargs)
        if from_uid == stack.alice.uid:
            stack.tips_received.append(amount_matoms)
        return event

    stack.relay.start_tip = starting  # type: ignore[method-assign,assignment]
    stack.alice.emit_tip_progress = progress  # type: ignore[method-assign]
    stack.bot.emit_received_tip = received  # type: ignore[method-assign]


HEADERS = {
    "Authorization": f"Bearer {TOKEN}",
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}


def event_data(line: str) -> dict[str, Any] | None:
    """The JSON object of one SSE ``data:`` line, else None."""
    if not line.startswith("data:") or not line[5:].strip():
        return None
    value = json.loads(line[5:])
    return value if isinstance(value, dict) else None
