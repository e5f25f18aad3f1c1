"""Crash safety of the bridge daemon (SECURITY.md §5, BRIDGE.md §Spend log
and approvals): ``brmcp-bridge`` runs as a child process on a fake brclient
(alice) and pays a brmcp-serve bot for ``fortune`` calls; it is killed with
SIGKILL at seeded random points of a payment, restarted on the same data
directory, and the agent retries the call until it is answered.

Kill points (each logical call draws one):

* ``before``: the spend entry is on disk and TipUser was sent, but brclient
  never acted on it (the fake holds the request; it dies with the
  connection), so no tip exists;
* ``during``: the tip is under way (it takes 0.5 to 6 s) and the daemon dies
  at a random moment before its confirmation; the tip completes anyway,
  while the daemon is down, or after its restart (before or after the
  agent's retry reaches the bot);
* ``after``: the tip is confirmed and the entry ``paid`` on disk, and the
  daemon dies before its reissue of the call reaches the bot;
* ``none``: no kill.

The bot answers a call marked as paid alongside at once (its hold is off),
so it runs a paid call only when a bridge reissues it after the tip's
confirmation; a bot that holds the call runs it when the tip lands even if
the bridge died meanwhile (BRIDGE.md §Failures, "A crash while a bot holds
a call paid alongside"). Two more tests kill the daemon right after TipUser:
one with a bot that holds the call (the restarted daemon's identical retry
takes over the spend entry's callKey and is answered from the bot's record),
one with a tip that lands seconds after the restart (the retry waits for it
and runs on its credit); both are booked exactly once.

The rules, from the fake brclient's records and the bot's ledger, to the atom:

* the wallet paid at most one price per logical call, however often the
  agent retried it (the daemon after a restart takes a payment in doubt as
  the call's own instead of paying again);
* every completed tip appears in ``mcpspend.json`` as paid, and the entries
  reconcile: paid entries = completed tips, and only tips that never
  existed (``before``) stay pending;
* the bot's ledger: its tips from alice are the completed tips, and it
  charged each answered call once.

``BRMCP_CRASH_SEED`` picks the seed, ``BRMCP_CRASH_CALLS`` the number of
logical calls, ``BRMCP_CRASH_ATTEMPTS`` the agent's attempts per call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest

from brmcp.bridge.daemon import read_runtime, resolve_listen
from brmcp.bridge.pay import SPEND_FILE, arguments_hash
from brmcp.testing.fakebr import KIND_TIP_PROGRESS, TipFailure
from tests.bridge.test_daemon import TOKEN, bridge_settings, prepare_bridge_dir
from tests.kit.serve import ServeEnv, serve_network, until

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("BRMCP_CRASH_SEED", "20260801"))
CALLS = int(os.environ.get("BRMCP_CRASH_CALLS", "8"))
PRICE = 10_000
PHASES = ("before", "during", "after", "none")
#: Attempts the agent makes at one logical call before it gives up on it,
#: and the seconds between them.
ATTEMPTS = int(os.environ.get("BRMCP_CRASH_ATTEMPTS", "5"))
RETRY_PAUSE = 1.0
#: The bridge's tip_wait_secs: shorter than the agent's retries take in all.
TIP_WAIT = 3
TIP_USER = "PaymentsService.TipUser"
PM = "ChatService.PM"
HEADERS = {
    "Authorization": f"Bearer {TOKEN}",
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
}


@dataclass
class Logical:
    """One logical call: its kill point, the agent's attempts, whether it
    was answered, and the TipUser requests made while it ran (``held``:
    the ones brclient never acted on)."""

    phase: str
    attempts: int = 0
    answered: bool = False
    killed: bool = False
    tip_requests: int = 0
    held: int = 0
    outcomes: list[str] = field(default_factory=list)

    @property
    def tips(self) -> int:
        """Tips the wallet made for this call."""
        return self.tip_requests - self.held


class Daemon:
    """``brmcp-bridge`` as a child process on one data directory and port."""

    def __init__(self, datadir: Path, listen: str, logs: Path) -> None:
        self.datadir = datadir
        self.listen = listen
        self.logs = logs
        self.proc: anyio.abc.Process | None = None
        self.starts = 0
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "BRMCP_LOCK_DIR": str(logs / "locks")}

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    async def start(self) -> None:
        self.starts += 1
        log = (self.logs / f"bridge-{self.starts}.log").open("wb")
        cmd = [sys.executable, "-m", "brmcp.bridge", "--datadir", str(self.datadir), "--listen", self.listen]
        cmd += ["--log-level", "debug"]
        self.proc = await anyio.open_process(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        proc = self.proc
        await until(lambda: (read_runtime(self.datadir) or {}).get("pid") == proc.pid, 60)

    async def kill(self) -> None:
        proc = self.proc
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await proc.aclose()
        self.proc = None

    async def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        with anyio.move_on_after(20):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.aclose()
        self.proc = None


async def _events(response: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if line.startswith("data:") and line[5:].strip():
            value = json.loads(line[5:])
            if isinstance(value, dict):
                yield value


async def _attempt(url: str) -> dict[str, Any] | None:
    """One agent attempt at ``fortune`` on a new MCP session: the JSON-RPC
    answer, or None when the connection to the bridge failed."""
    try:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(120, connect=5)) as http:
            init = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "crash-agent", "version": "1"},
                },
            }
            opened = await http.post(url, json=init, headers=HEADERS)
            if opened.status_code != 200:
                return None
            headers = {
                **HEADERS,
                "mcp-session-id": opened.headers["mcp-session-id"],
                "mcp-protocol-version": "2025-11-25",
            }
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            if (await http.post(url, json=note, headers=headers)).status_code != 202:
                return None
            body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "fortune"}}
            async with http.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code != 200:
                    return None
                if response.headers.get("content-type", "").startswith("application/json"):
                    value = json.loads(await response.aread())
                    return value if isinstance(value, dict) else None
                async for message in _events(response):
                    if message.get("id") == 2:
                        return message
    except (httpx2.HTTPError, OSError, json.JSONDecodeError):
        return None
    return None


def _spend(datadir: Path) -> list[dict[str, Any]]:
    path = datadir / SPEND_FILE
    if not path.exists():
        return []
    value = json.loads(path.read_text())
    assert isinstance(value, list)
    return value


def _tip_requests(env: ServeEnv) -> int:
    return sum(1 for method, _ in env.alice.requests if method == TIP_USER)


async def _kill_at(
    phase: str, rng: random.Random, env: ServeEnv, daemon: Daemon, call: Logical, attempt_done: anyio.Event
) -> None:
    """Kill the daemon at ``phase`` of the payment of the call under way (no
    kill when the attempt ends without a TipUser: credit was already there)."""
    alice = env.alice
    before = _tip_requests(env)
    delay = rng.uniform(0.5, 6.0)
    if phase == "during":
        alice.fail_next_tip(TipFailure(attempts=0, delay=delay))
    elif phase == "after":
        alice.fail_next_tip(TipFailure(attempts=0, delay=0.3))
    elif phase == "before":
        alice.hold(TIP_USER)
    try:
        await alice.wait_for(lambda: _tip_requests(env) > before or attempt_done.is_set())
        if _tip_requests(env) == before:
            return
        if phase == "after":
            alice.hold(PM)  # the reissue after the confirmation never leaves
            paid = _paid(daemon.datadir)
            await until(lambda: _paid(daemon.datadir) > paid, 30)
            await anyio.sleep(rng.uniform(0, 0.1))
        elif phase == "during":
            await anyio.sleep(rng.uniform(0, delay))
        await daemon.kill()
        call.killed = True
        # A request brclient holds dies with the connection of the killed daemon.
        await alice.wait_for(lambda: alice.connection_count == 0)
        if phase == "before":
            call.held += 1
    finally:
        alice.release(TIP_USER)
        alice.release(PM)


def _paid(datadir: Path) -> int:
    return sum(1 for e in _spend(datadir) if e.get("status") == "paid")


async def _attempt_with_kill(
    call: Logical, rng: random.Random, env: ServeEnv, daemon: Daemon, url: str
) -> dict[str, Any] | None:
    """One attempt; the first one of a call with a kill point dies there."""
    if call.attempts > 1 or call.phase == "none":
        return await _attempt(url)
    answer: list[dict[str, Any] | None] = []
    done = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def agent() -> None:
            try:
                answer.append(await _attempt(url))
            finally:
                done.set()

        tg.start_soon(agent)
        await _kill_at(call.phase, rng, env, daemon, call, done)
    return answer[0]


async def _logical_call(phase: str, rng: random.Random, env: ServeEnv, daemon: Daemon, url: str) -> Logical:
    """The agent calls ``fortune`` until it is answered (at most
    :data:`ATTEMPTS` attempts, :data:`RETRY_PAUSE` s apart)."""
    call = Logical(phase)
    first_request = _tip_requests(env)
    while call.attempts < ATTEMPTS and not call.answered:
        if call.attempts:
            await anyio.sleep(RETRY_PAUSE)
        call.attempts += 1
        message = await _attempt_with_kill(call, rng, env, daemon, url)
        if daemon.proc is None:
            await daemon.start()
        result = message.get("result") if message is not None else None
        if isinstance(result, dict) and not result.get("isError"):
            call.answered = True
            call.outcomes.append("answered")
        else:
            call.outcomes.append(json.dumps(message)[-300:] if message is not None else "connection lost")
    call.tip_requests = _tip_requests(env) - first_request
    return call


async def test_sigkill_at_random_points_of_a_payment_never_pays_twice_for_one_call(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    with anyio.fail_after(900):
        async with serve_network(tmp_path) as env:
            # The bot answers a marked call at once (see the module docs).
            env.app.harness.config.hold_seconds = 0
            # Every bridge process opens BR sessions of its own, and those of a
            # killed one linger at the bot until its idle timeout (600 s); lift
            # the bot's cap of 8 sessions per peer so the restarts are served.
            router = env.app.harness.router
            assert router is not None
            router.options = dataclasses.replace(router.options, max_sessions_per_peer=None)
            completed: list[int] = []
            emit = env.alice.emit_tip_progress

            def recording(to_uid: str, amount_matoms: int, **kwargs: Any) -> Any:
                event = emit(to_uid, amount_matoms, **kwargs)
                if kwargs.get("completed"):
                    assert to_uid == env.bot.uid
                    completed.append(amount_matoms)
                return event

            env.alice.emit_tip_progress = recording  # type: ignore[method-assign]
            datadir = tmp_path / "bridge"
            prepare_bridge_dir(
                datadir,
                env.alice,
                # A payment in doubt after a kill blocks a second payment for
                # tip_wait_secs, and no longer (BRIDGE.md §The hard bound).
                bridge_settings(env.bot.uid, per_day_cap_atoms=10 * CALLS * PRICE, tip_wait_secs=TIP_WAIT),
            )
            (tmp_path / "locks").mkdir()
            daemon = Daemon(datadir, resolve_listen("127.0.0.1:0"), tmp_path)
            url = f"{daemon.url}/mcp/{env.bot.uid}"
            calls: list[Logical] = []
            try:
                await daemon.start()
                # Every kill point at least once, the rest drawn at random.
                phases = ["before", "during", "after", *rng.choices(PHASES, k=max(CALLS - 3, 0))]
                rng.shuffle(phases)
                for phase in phases:
                    calls.append(await _logical_call(phase, rng, env, daemon, url))
                # Every tip that exists completes; the running daemon settles
                # its entry and acks its event.
                tips = sum(c.tips for c in calls)
                await until(lambda: len(completed) == tips, 60)
                await env.alice.wait_for(lambda: env.alice.pending_events(KIND_TIP_PROGRESS) == [])
                await until(lambda: sum(e.get("status") == "paid" for e in _spend(datadir)) == tips, 30)
            finally:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await daemon.stop()
            report = "; ".join(f"{c.phase}: {c.tips} tip(s), {c.outcomes}" for c in calls)
            # 1. One price at most per logical call, however often it was retried.
            assert all(c.tips <= 1 for c in calls), report
            assert completed == [PRICE * 1000] * len(completed), report
            # 2. The spend log reconciles with the wallet: every completed tip is a
            #    paid entry; only the tips that never existed stay pending.
            spend = _spend(datadir)
            assert all(e["atoms"] == PRICE and e["bot"] == env.bot.uid for e in spend), spend
            statuses = [e.get("status") for e in spend]
            assert statuses.count("paid") == len(completed), (statuses, report)
            assert statuses.count("pending") <= sum(c.held for c in calls), (statuses, report)
            assert "failed" not in statuses, (spend, report)
            # 3. The bot's ledger: its tips are the wallet's, each answered call charged once.
            statement = await env.app.harness.statement(env.alice.uid)
            credited = [e.atoms for e in statement if e.kind == "tip"]
            charged = [e.atoms for e in statement if e.kind == "charge"]
            assert sum(credited) == PRICE * len(completed), (statement, report)
            answered = sum(c.answered for c in calls)
            assert charged == [-PRICE] * answered, (statement, report)
            assert await env.app.harness.balance(env.alice.uid) == sum(credited) + sum(charged)
            # Every logical call was answered in the end (a payment in doubt
            # must not block its tool for good).
            assert answered == len(calls), report
            # The daemon was killed at each kill point drawn (unless credit already
            # at the bot paid for that call), and at least once at each kind.
            assert daemon.starts == 1 + sum(c.killed for c in calls), report
            assert {c.phase for c in calls if c.killed} >= {"before", "during", "after"}, report


# -- a kill while a payment made alongside is in flight -------------------------------


@contextlib.asynccontextmanager
async def _one_bot(
    tmp_path: Path, *, hold_seconds: float
) -> AsyncIterator[tuple[ServeEnv, Daemon, list[int]]]:
    """The bot (its pay-alongside hold ``hold_seconds``; 0: off), alice's
    daemon started on a fresh data directory, and the amounts (milliatoms)
    of the tips alice's brclient completed."""
    async with serve_network(tmp_path) as env:
        env.app.harness.config.hold_seconds = hold_seconds
        router = env.app.harness.router
        assert router is not None
        router.options = dataclasses.replace(router.options, max_sessions_per_peer=None)
        completed: list[int] = []
        emit = env.alice.emit_tip_progress

        def recording(to_uid: str, amount_matoms: int, **kwargs: Any) -> Any:
            event = emit(to_uid, amount_matoms, **kwargs)
            if kwargs.get("completed"):
                completed.append(amount_matoms)
            return event

        env.alice.emit_tip_progress = recording  # type: ignore[method-assign]
        datadir = tmp_path / "bridge"
        prepare_bridge_dir(datadir, env.alice, bridge_settings(env.bot.uid, tip_wait_secs=TIP_WAIT))
        (tmp_path / "locks").mkdir()
        daemon = Daemon(datadir, resolve_listen("127.0.0.1:0"), tmp_path)
        try:
            await daemon.start()
            yield env, daemon, completed
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await daemon.stop()


async def _kill_after_tip_user(env: ServeEnv, daemon: Daemon, url: str, *, held: bool) -> None:
    """The agent's first attempt; the daemon is killed as soon as brclient
    took its TipUser (its reply came and the spend entry says so on disk:
    ``"scheduled": true``; and, with ``held``, the bot holds the marked
    call), before the tip's confirmation."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(_attempt, url)
        await env.alice.wait_for(lambda: _tip_requests(env) == 1)
        await until(lambda: any(e.get("scheduled") for e in _spend(daemon.datadir)), 30)
        if held:
            holds = env.app.harness._pipeline.held
            await until(lambda: holds.holds == 1, 30)
        await daemon.kill()
        tg.cancel_scope.cancel()


async def _books(env: ServeEnv, daemon: Daemon, completed: list[int]) -> None:
    """Exact to the atom: one TipUser and one completed tip of the price in
    the wallet; one paid spend entry naming the call's tool, callKey and
    arguments hash; at the bot one tip credited and one charge, balance 0."""
    assert _tip_requests(env) == 1
    assert completed == [PRICE * 1000]
    await until(lambda: [e.get("status") for e in _spend(daemon.datadir)] == ["paid"], 30)
    (entry,) = _spend(daemon.datadir)
    assert (entry["bot"], entry["tool"], entry["atoms"]) == (env.bot.uid, "fortune", PRICE)
    assert len(entry["callKey"]) == 32
    assert entry["argsHash"] == arguments_hash({})
    statement = await env.app.harness.statement(env.alice.uid)
    assert sorted((e.kind, e.atoms) for e in statement) == [("charge", -PRICE), ("tip", PRICE)]
    assert await env.app.harness.balance(env.alice.uid) == 0


async def test_a_kill_while_the_bot_holds_a_call_paid_alongside_answers_the_retry_from_its_record(
    tmp_path: Path,
) -> None:
    """SIGKILL after TipUser, before the confirmation, with the bot holding
    the call paid alongside: the tip lands while the bridge is down and the
    bot runs the held call (for nobody) and charges it. The restarted
    bridge gives the agent's identical retry that payment's callKey (from
    the spend entry's tool and arguments hash), so the bot answers it from
    its record: one tip, one charge, one run, the result delivered."""
    with anyio.fail_after(240):
        async with _one_bot(tmp_path, hold_seconds=30) as (env, daemon, completed):
            url = f"{daemon.url}/mcp/{env.bot.uid}"
            env.alice.fail_next_tip(TipFailure(attempts=0, delay=1.0))
            await _kill_after_tip_user(env, daemon, url, held=True)
            # The held call ran and was charged while the bridge was down.
            await until(lambda: len(completed) == 1, 30)
            harness = env.app.harness

            async def charged() -> bool:
                return any(e.kind == "charge" for e in await harness.statement(env.alice.uid))

            await until(charged, 30)
            await daemon.start()
            answer = await _attempt(url)
            assert answer is not None
            result = answer.get("result")
            assert isinstance(result, dict), answer
            assert not result.get("isError"), answer
            await _books(env, daemon, completed)
            assert env.app.harness._pipeline.held.holds == 1


async def test_a_retry_after_a_restart_waits_for_the_tip_in_flight_and_runs_on_its_credit(
    tmp_path: Path,
) -> None:
    """SIGKILL after TipUser, before the confirmation; the tip lands seconds
    after the restart, while the agent's identical retry is under way (the
    bot holds nothing, so it refuses until the credit is there). The retry
    waits, within its deadline, for brclient's outcome and then runs on
    that credit: one tip, one charge, the result delivered."""
    with anyio.fail_after(240):
        async with _one_bot(tmp_path, hold_seconds=0) as (env, daemon, completed):
            url = f"{daemon.url}/mcp/{env.bot.uid}"
            env.alice.fail_next_tip(TipFailure(attempts=0, delay=12.0))
            await _kill_after_tip_user(env, daemon, url, held=False)
            await daemon.start()
            assert completed == []  # the tip is still in flight when the retry starts
            answer = await _attempt(url)
            assert answer is not None
            result = answer.get("result")
            assert isinstance(result, dict), answer
            assert not result.get("isError"), answer
            await _books(env, daemon, completed)
