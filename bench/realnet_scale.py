"""Concurrency benchmark on brnet: one bot identity under K concurrent agents.

Run: ``python bench/realnet_scale.py`` (needs Go; builds brnet on first use).
Options: ``--latency 0,250`` (added one-way latencies in ms, each in its own
process), ``--agents 1,2,4,8,16,32`` (K), ``--calls N`` (calls per row, split
over the agents; at least 2 per agent), ``--no-batch`` (bridge and bot do not
offer batched PMs, WIRE.md §Batches), ``--quick`` (K = 1, 4, 16 and fewer calls).

For each latency it starts brnet (``bot``, ``alice`` and three more bridge
users), brmcp-serve on ``bot`` (rate limit out of the way) and a brmcp-bridge
on every other user, and measures:

* the raw PM rate: 40 back-to-back PMs alice → bot, arrival rate at bot;
* the raw round trip: plain PMs between two other users, answered at once;
* K concurrent official-SDK agents on alice's bridge, each making free
  ``echo`` calls back to back (rows ``free``), then paid ``fortune`` calls
  on a balance alice tipped the bot directly, so the bridge does not know
  it (rows ``paid``);
* four bridges on the one bot, K agents spread over them (rows ``4 bridges``).

Per row: calls/s, p50 and p95 of the agent-visible call, relay PMs per call
(every PM any of the clients received during the row, counted on their own
PM streams), calls that failed, and for paid rows the tips the bridges sent.

Targets (``MISS`` printed when missed, exit status 1): every call answered;
calls/s at least 90% of what K calls can reach (the raw PM rate, or K per
raw round trip when that is lower); at most 2.1 PMs per call; p95 no worse
than the queue the pacing implies (K calls ahead, one PM interval each,
plus one round trip and 50% slack); at most one tip in the first paid
row (the bridge learns the balance from one payment); with batching, at 16
agents at least 3x the raw PM rate. After the paid rows the books are
checked to the atom: tips paid = credits at the bot = charges + balance.
Figures are for this machine and run only.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from brmcp.bridge import BridgeDaemon, Settings
from brmcp.clientrpc import write_bot_config
from brmcp.protocol.units import atoms_from_milliatoms
from brmcp.serve import ServeApp
from brmcp.serve.config import ServeConfig, bot_config_path, write_serve_config
from brmcp.testing.brnet import BrNet, BrNetUnavailable, BrNetUser, brnet_binary

FAST = {"backoff_initial": 0.2, "backoff_max": 2.0}
PRICE = 10_000
BRIDGES = ("alice", "carol", "dave", "erin")
#: Alice's direct tip before the paid rows (atoms): enough for every paid call.
TOPUP = 20_000_000


class PMCounter:
    """PMs received by the clients (each on its own PM stream), with arrival times."""

    def __init__(self) -> None:
        self.count = 0
        self.last = time.monotonic()
        self.arrivals: dict[str, list[float]] = {}

    async def run(self, users: list[BrNetUser], *, task_status: Any) -> None:
        async with AsyncExitStack() as stack:
            subs = []
            for u in users:
                c = await stack.enter_async_context(u.client(**FAST))
                await c.wait_connected()
                sub = c.pm_stream()
                await sub.wait_open()
                subs.append((u.nick, sub))
            async with anyio.create_task_group() as tg:
                for nick, sub in subs:
                    tg.start_soon(self._drain, nick, sub)
                task_status.started()

    async def _drain(self, nick: str, sub: Any) -> None:
        times = self.arrivals.setdefault(nick, [])
        async for _ in sub:
            self.count += 1
            self.last = time.monotonic()
            times.append(self.last)

    async def settle(self, quiet: float = 0.5) -> None:
        while True:
            if time.monotonic() - self.last >= quiet:
                return
            await anyio.sleep(0.05)


@dataclass
class Row:
    kind: str
    agents: int
    calls: int = 0
    failed: int = 0
    seconds: float = 0.0
    pms: int = 0
    tips: int = 0
    latencies: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        lat = sorted(self.latencies) or [math.nan]
        return {
            "kind": self.kind,
            "agents": self.agents,
            "calls": self.calls,
            "failed": self.failed,
            "rate": self.calls / self.seconds if self.seconds else 0.0,
            "p50": statistics.median(lat),
            "p95": lat[min(len(lat) - 1, math.ceil(0.95 * len(lat)) - 1)],
            "pms_per_call": self.pms / self.calls if self.calls else math.inf,
            "tips": self.tips,
        }


async def poll(done: Any, limit: float) -> None:
    """Wait until ``done()`` is true, at most ``limit`` seconds."""
    with anyio.fail_after(limit):
        while True:
            if done():
                return
            await anyio.sleep(0.05)


async def poll_balance(app: ServeApp, uid: str, atoms: int) -> None:
    """Wait until ``uid``'s balance at the bot is at least ``atoms`` (60 s at most)."""
    with anyio.fail_after(60):
        while True:
            if await app.harness.balance(uid) >= atoms:
                return
            await anyio.sleep(0.05)


async def raw_round_trip(alice: BrNetUser, bot: BrNetUser, n: int = 8) -> float:
    """Median round trip of plain PMs alice → bot → alice (bot's client
    answers each at once), seconds: what one call at a time can reach."""
    async with alice.client(**FAST) as ca, bot.client(**FAST) as cb:
        await ca.wait_connected()
        await cb.wait_connected()
        to_bot, to_alice = cb.pm_stream(), ca.pm_stream()
        await to_bot.wait_open()
        await to_alice.wait_open()
        times: list[float] = []
        async with anyio.create_task_group() as tg:

            async def answer() -> None:
                async for pm in to_bot:
                    if pm.message.startswith("ping "):
                        await cb.send_pm(alice.uid, "pong " + pm.message[5:])

            tg.start_soon(answer)
            replies = to_alice.__aiter__()
            for i in range(n):
                began = time.monotonic()
                await ca.send_pm(bot.uid, f"ping {i}")
                with anyio.fail_after(30):
                    while (await replies.__anext__()).message != f"pong {i}":
                        pass
                times.append(time.monotonic() - began)
                await anyio.sleep(0.3)
            tg.cancel_scope.cancel()
    return statistics.median(times)


async def raw_pm_rate(alice: BrNetUser, bot: BrNetUser, counter: PMCounter, n: int = 40) -> float:
    """Back-to-back PMs alice → bot; their arrival rate at bot (PMs/s)."""
    await counter.settle()
    seen = len(counter.arrivals.get("bot", []))
    async with alice.client(**FAST) as c:
        await c.wait_connected()
        for i in range(n):
            await c.send_pm(bot.uid, f"raw pm {i}")
        await poll(lambda: len(counter.arrivals.get("bot", [])) >= seen + n, 120)
    times = counter.arrivals["bot"][seen : seen + n]
    return (n - 1) / (times[-1] - times[0])


@asynccontextmanager
async def stack_on(
    net: BrNet, root: Path, batch: bool
) -> AsyncIterator[tuple[ServeApp, list[BridgeDaemon], PMCounter]]:
    bot = net.user("bot")
    async with anyio.create_task_group() as tg:
        counter = PMCounter()
        await tg.start(counter.run, [net.user(n) for n in ("bot", *BRIDGES)])
        serve_dir = root / "serve"
        serve_dir.mkdir(mode=0o700)
        write_bot_config(bot_config_path(serve_dir), bot.bot_config_for(serve_dir, "brmcp-serve"))
        uids = tuple(net.user(n).uid for n in BRIDGES)
        config = ServeConfig(allowed_uids=uids, calls_per_minute=1_000_000, chat_help=False)
        write_serve_config(serve_dir / "brmcp.json", config)
        app = ServeApp.from_datadir(serve_dir, client_options=FAST)
        if not batch:
            app.harness.config.router_options = replace(app.harness.config.router_options, batch=False)
        await tg.start(app.run)
        await app.client.wait_connected()
        daemons = []
        for nick in BRIDGES:
            user = net.user(nick)
            bridge_dir = root / f"bridge-{nick}"
            conf = user.bot_config_for(bridge_dir, "brmcp-bridge")
            write_bot_config(bridge_dir / "brmcp-bridge.conf", conf)
            daemon = BridgeDaemon.from_datadir(bridge_dir, listen="127.0.0.1:0", client_options=FAST)
            if not batch:
                router = daemon.bridge.router
                router.options = replace(router.options, batch=False)
            await tg.start(daemon.run)
            await daemon.client.wait_connected()
            await daemon.bridge.apply_settings(
                Settings(
                    enabled=True,
                    mode="autopay",
                    per_call_cap_atoms=20_000,
                    per_day_cap_atoms=100_000_000,
                    allowed_bots=(bot.uid,),
                )
            )
            daemons.append(daemon)
        yield app, daemons, counter
        tg.cancel_scope.cancel()


class Agent:
    """One SDK agent session on a bridge's endpoint for the bot."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.session: ClientSession | None = None

    async def run(self, *, task_status: Any) -> None:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {self.token}"}, timeout=300) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            await s.list_tools()
            self.session = s
            task_status.started()
            await anyio.sleep_forever()


async def run_row(agents: list[Agent], row: Row, calls: int, tool: str, counter: PMCounter) -> None:
    per = max(2, math.ceil(calls / len(agents)))
    await counter.settle()
    before = counter.count

    async def one(agent: Agent) -> None:
        assert agent.session is not None
        for _ in range(per):
            began = time.monotonic()
            args = {"text": "x"} if tool == "echo" else {}
            try:
                with anyio.fail_after(120):
                    result = await agent.session.call_tool(tool, args)
                ok = not result.is_error
            except Exception:
                ok = False
            row.latencies.append(time.monotonic() - began)
            row.calls += 1
            if not ok:
                row.failed += 1

    began = time.monotonic()
    async with anyio.create_task_group() as tg:
        for agent in agents:
            tg.start_soon(one, agent)
    row.seconds = time.monotonic() - began
    await counter.settle()
    row.pms = counter.count - before


def tips_sent(net: BrNet) -> int:
    path = net.root / "simwallet.json"
    if not path.exists():
        return 0
    return len(json.loads(path.read_text()))


async def run_once(latency_ms: int, ks: list[int], calls: int, batch: bool, exe: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="brmcp-realnet-scale-") as tmp:
        root = Path(tmp)
        net = BrNet(root / "brnet", users=("bot", *BRIDGES), latency_ms=latency_ms, binary=exe)
        await anyio.to_thread.run_sync(net.start)
        try:
            async with stack_on(net, root, batch) as (app, daemons, counter):
                bot, alice = net.user("bot"), net.user("alice")
                raw = await raw_pm_rate(alice, bot, counter)
                rtt = await raw_round_trip(net.user("dave"), net.user("erin"))
                await anyio.sleep(1.2)  # past brnet's 1 s TipUser restart delay
                rows: list[dict[str, Any]] = []
                async with anyio.create_task_group() as tg:
                    pools: list[list[Agent]] = []
                    for d in daemons:
                        snippet = d.bridge.config_snippet(bot.uid)
                        pool = []
                        for _ in range(max(ks)):
                            agent = Agent(snippet.url, snippet.token)
                            with anyio.fail_after(60):
                                await tg.start(agent.run)
                            pool.append(agent)
                        pools.append(pool)
                    for k in ks:
                        row = Row("free", k)
                        await run_row(pools[0][:k], row, max(calls, 2 * k), "echo", counter)
                        rows.append(row.to_json())
                    for k in ks:
                        spread = [pools[i % len(pools)][i // len(pools)] for i in range(k)]
                        row = Row("4 bridges", k)
                        await run_row(spread, row, max(calls, 2 * k), "echo", counter)
                        rows.append(row.to_json())
                    # Paid rows: alice tops up directly; the bridge does not know it.
                    async with alice.client(**FAST) as ca:
                        await ca.wait_connected()
                        await ca.tip_user(bot.uid, TOPUP / 1e8, 3)
                    await poll_balance(app, alice.uid, TOPUP)
                    # K concurrent first paid calls on a bridge that never paid
                    # (carol's), with credit at the bot it does not know of.
                    carol = net.user("carol")
                    async with carol.client(**FAST) as cc:
                        await cc.wait_connected()
                        await cc.tip_user(bot.uid, TOPUP / 1e8, 3)
                    await poll_balance(app, carol.uid, TOPUP)
                    first_k = max(ks)
                    tips = tips_sent(net)
                    row = Row("first paid", first_k)
                    await run_row(pools[1][:first_k], row, first_k, "fortune", counter)
                    row.tips = tips_sent(net) - tips
                    rows.append(row.to_json())
                    for k in ks:
                        tips = tips_sent(net)
                        row = Row("paid", k)
                        await run_row(pools[0][:k], row, max(calls, 2 * k), "fortune", counter)
                        row.tips = tips_sent(net) - tips
                        rows.append(row.to_json())
                    tg.cancel_scope.cancel()
                credited = charged = balance = 0
                for nick in BRIDGES:
                    uid = net.user(nick).uid
                    statement = await app.harness.statement(uid)
                    credited += sum(e.atoms for e in statement if e.kind == "tip")
                    charged -= sum(e.atoms for e in statement if e.kind != "tip")
                    balance += await app.harness.balance(uid)
                paid = json.loads((net.root / "simwallet.json").read_text())
                tips_paid = atoms_from_milliatoms(sum(int(m) for m in paid.values()))
                books = tips_paid == credited == charged + balance
                return {
                    "raw": raw,
                    "rtt": rtt,
                    "rows": rows,
                    "books": books,
                    "books_text": (
                        f"tips paid {tips_paid}, credited {credited}, charged {charged}, balance {balance}"
                    ),
                }
        finally:
            await anyio.to_thread.run_sync(net.stop)


def check(result: dict[str, Any], latency_ms: int, batch: bool) -> list[str]:
    """The rows' target failures (empty: every target met)."""
    raw, rtt = result["raw"], result["rtt"]
    interval = 1 / raw
    misses = []
    for r in result["rows"]:
        name = f"{r['kind']} K={r['agents']}"
        if r["failed"]:
            misses.append(f"{name}: {r['failed']} of {r['calls']} calls failed")
        # K calls at a time cannot pass K per round trip, nor the pace.
        reachable = min(raw, r["agents"] / rtt)
        if r["kind"] != "first paid" and r["rate"] < 0.9 * reachable:
            misses.append(
                f"{name}: {r['rate']:.1f} calls/s < 90% of {reachable:.1f} (raw {raw:.1f} PMs/s,"
                f" round trip {rtt * 1000:.0f} ms)"
            )
        if r["pms_per_call"] > 2.1:
            misses.append(f"{name}: {r['pms_per_call']:.2f} PMs per call > 2.1")
        bound = 1.5 * (r["agents"] * interval + rtt)
        if r["p95"] > bound:
            misses.append(f"{name}: p95 {r['p95'] * 1000:.0f} ms > {bound * 1000:.0f} ms the pacing implies")
        if r["kind"] == "first paid" and r["tips"] > 1:
            misses.append(
                f"{name}: {r['tips']} tips for {r['agents']} concurrent first paid calls (target 1)"
            )
        if batch and r["kind"] == "free" and r["agents"] == 16 and r["rate"] < 3 * raw:
            misses.append(f"{name}: {r['rate']:.1f} calls/s < 3x the raw PM rate with batching")
    if not result["books"]:
        misses.append(f"books do not balance: {result['books_text']}")
    return misses


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--latency", default="0,250", help="comma-separated added one-way latencies in ms")
    parser.add_argument("--agents", default="1,2,4,8,16,32", help="comma-separated concurrent agents K")
    parser.add_argument("--calls", type=int, default=48, help="calls per row (at least 2 per agent)")
    parser.add_argument("--no-batch", action="store_true", help="no batched PMs on either side")
    parser.add_argument("--quick", action="store_true", help="K = 1, 4, 16 and 24 calls per row")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.agents, args.calls = "1,4,16", 24
    ks = [int(x) for x in args.agents.split(",") if x.strip()]
    batch = not args.no_batch
    if args.one is not None:
        exe = brnet_binary()
        print(json.dumps(anyio.run(run_once, args.one, ks, args.calls, batch, exe)))
        return 0
    try:
        brnet_binary()
    except BrNetUnavailable as exc:
        print(f"realnet scale bench: skipped: {exc}")
        return 0
    missed = False
    for lat in [int(x) for x in args.latency.split(",") if x.strip()]:
        cmd = [sys.executable, __file__, "--one", str(lat), "--agents", args.agents]
        cmd += ["--calls", str(args.calls)]
        if not batch:
            cmd.append("--no-batch")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        except subprocess.TimeoutExpired:
            print(f"MISS the run at {lat} ms did not finish within 1800 s (a stall)")
            return 1
        if proc.returncode != 0:
            print(f"realnet scale bench: the run at {lat} ms failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        state = "on" if batch else "off"
        print(
            f"\n{lat} ms added latency, batching {state}: raw PM rate {result['raw']:.1f} PMs/s,"
            f" raw round trip {result['rtt'] * 1000:.0f} ms"
        )
        head = f"{'row':<12}{'K':>4}{'calls/s':>9}{'p50 ms':>9}{'p95 ms':>9}"
        print(f"{head}{'PMs/call':>10}{'failed':>8}{'tips':>6}")
        for r in result["rows"]:
            cells = f"{r['kind']:<12}{r['agents']:>4}{r['rate']:>9.1f}"
            cells += f"{r['p50'] * 1000:>9.0f}{r['p95'] * 1000:>9.0f}"
            print(f"{cells}{r['pms_per_call']:>10.2f}{r['failed']:>8}{r['tips']:>6}")
        print(f"books: {result['books_text']}; {'exact' if result['books'] else 'BROKEN'}")
        for miss in check(result, lat, batch):
            missed = True
            print(f"MISS {miss}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
