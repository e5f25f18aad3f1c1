"""Real-network benchmark: relay PMs and wall time per agent-visible call on
brnet (a real bisonrelay relay and real clients on loopback).

Run: ``python bench/realnet_bench.py`` (needs Go; builds brnet on first use;
about half a minute once built). ``--latency 0,250`` picks the added one-way
latencies in ms (default 0 and 250); ``--reps N`` repeats the free call and
the paid call with balance N times (median reported).

For each latency it starts brnet (users ``bot`` and ``alice``), brmcp-serve on
``bot`` and brmcp-bridge on ``alice`` in this process, and an official-SDK
agent on the bridge, then times each agent-visible call and counts the PMs the
two real clients received meanwhile (on their own PM streams):

* ``initialize`` (the bridge opens its BR session: initialize + tools/list);
* ``tools/list`` (served from the bridge's snapshot: 0 PMs);
* a free ``echo`` (one round trip: 2 PMs);
* the first paid ``fortune`` with no balance (call, payment_required, a real
  tip through TipUser, reissue, result: 4 PMs + the tip);
* a paid ``fortune`` with balance (alice tipped the bot beforehand: 2 PMs).

The money rule is checked at the end of each run: tips paid = credits at the
bot = charges + balance. Figures are for this machine and run only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from brmcp.bridge import BridgeDaemon, Settings
from brmcp.clientrpc import write_bot_config
from brmcp.protocol.units import atoms_from_milliatoms
from brmcp.serve import ServeApp, init_datadir
from brmcp.testing.brnet import BrNet, BrNetUnavailable, BrNetUser, brnet_binary

FAST = {"backoff_initial": 0.2, "backoff_max": 2.0}
PRICE = 10_000


class PMCounter:
    """PMs received by the two clients (each on its own PM stream, no acks)."""

    def __init__(self) -> None:
        self.count = 0
        self.last = time.monotonic()

    async def run(self, users: list[BrNetUser], *, task_status: Any) -> None:
        async with AsyncExitStack() as stack:
            subs = []
            for u in users:
                c = await stack.enter_async_context(u.client(**FAST))
                await c.wait_connected()
                sub = c.pm_stream()
                await sub.wait_open()
                subs.append(sub)
            async with anyio.create_task_group() as tg:
                for sub in subs:
                    tg.start_soon(self._drain, sub)
                task_status.started()

    async def _drain(self, sub: Any) -> None:
        async for _ in sub:
            self.count += 1
            self.last = time.monotonic()

    async def settle(self, quiet: float = 0.4) -> None:
        while True:
            if time.monotonic() - self.last >= quiet:
                return
            await anyio.sleep(0.05)


@asynccontextmanager
async def stack_on(net: BrNet, root: Path) -> AsyncIterator[tuple[ServeApp, BridgeDaemon, PMCounter]]:
    bot, alice = net.user("bot"), net.user("alice")
    async with anyio.create_task_group() as tg:
        serve_dir = root / "serve"
        init_datadir(
            serve_dir, bot_config=bot.bot_config_for(serve_dir, "brmcp-serve"), allowed_uids=[alice.uid]
        )
        app = ServeApp.from_datadir(serve_dir, client_options=FAST)
        await tg.start(app.run)
        await app.client.wait_connected()
        bridge_dir = root / "bridge"
        write_bot_config(bridge_dir / "brmcp-bridge.conf", alice.bot_config_for(bridge_dir, "brmcp-bridge"))
        daemon = BridgeDaemon.from_datadir(bridge_dir, listen="127.0.0.1:0", client_options=FAST)
        await tg.start(daemon.run)
        await daemon.client.wait_connected()
        await daemon.bridge.apply_settings(
            Settings(
                enabled=True,
                mode="autopay",
                per_call_cap_atoms=20_000,
                per_day_cap_atoms=1_000_000,
                allowed_bots=(bot.uid,),
            )
        )
        counter = PMCounter()
        await tg.start(counter.run, [bot, alice])
        yield app, daemon, counter
        tg.cancel_scope.cancel()


async def measure(counter: PMCounter, fn: Callable[[], Awaitable[Any]]) -> tuple[float, int, Any]:
    await counter.settle()
    before, began = counter.count, time.monotonic()
    result = await fn()
    elapsed = time.monotonic() - began
    await counter.settle()
    return elapsed, counter.count - before, result


async def run_once(latency_ms: int, reps: int, exe: Path) -> dict[str, tuple[float, int]]:
    with tempfile.TemporaryDirectory(prefix="brmcp-realnet-bench-") as tmp:
        root = Path(tmp)
        net = BrNet(root / "brnet", users=("bot", "alice"), latency_ms=latency_ms, binary=exe)
        await anyio.to_thread.run_sync(net.start)
        try:
            async with stack_on(net, root) as (app, daemon, counter):
                bot, alice = net.user("bot"), net.user("alice")
                snippet = daemon.bridge.config_snippet(bot.uid)
                await anyio.sleep(1.2)  # past brnet's 1 s TipUser restart delay
                rows: dict[str, tuple[float, int]] = {}

                async def agent_calls() -> None:
                    async with (
                        httpx2.AsyncClient(
                            headers={"Authorization": f"Bearer {snippet.token}"}, timeout=60
                        ) as http,
                        streamable_http_client(snippet.url, http_client=http) as (read, write),
                        ClientSession(read, write) as s,
                    ):
                        t, n, _ = await measure(counter, s.initialize)
                        rows["initialize"] = (t, n)
                        t, n, _ = await measure(counter, s.list_tools)
                        rows["tools/list"] = (t, n)
                        samples = [
                            await measure(counter, lambda: s.call_tool("echo", {"text": "x"}))
                            for _ in range(reps)
                        ]
                        rows["free call (echo)"] = (
                            statistics.median(x[0] for x in samples),
                            round(statistics.median(x[1] for x in samples)),
                        )
                        t, n, r = await measure(counter, lambda: s.call_tool("fortune", {}))
                        assert not r.is_error, r
                        rows["first paid call"] = (t, n)
                        # Top up: alice tips the bot directly, then paid calls run on balance.
                        async with alice.client(**FAST) as ca:
                            await ca.wait_connected()
                            await ca.tip_user(bot.uid, reps * PRICE / 1e8, 3)
                        with anyio.fail_after(60):
                            while True:
                                if await app.harness.balance(alice.uid) >= reps * PRICE:
                                    break
                                await anyio.sleep(0.05)
                        samples = [
                            await measure(counter, lambda: s.call_tool("fortune", {})) for _ in range(reps)
                        ]
                        assert all(not x[2].is_error for x in samples)
                        rows["paid call with balance"] = (
                            statistics.median(x[0] for x in samples),
                            round(statistics.median(x[1] for x in samples)),
                        )
                        # Measurements done: leave without the SDK's session
                        # close, which can hang for the HTTP timeout.
                        agent_scope.cancel()

                with anyio.CancelScope() as agent_scope:
                    await agent_calls()
                statement = await app.harness.statement(alice.uid)
                credited = sum(e.atoms for e in statement if e.kind == "tip")
                charged = -sum(e.atoms for e in statement if e.kind != "tip")
                balance = await app.harness.balance(alice.uid)
                paid = json.loads((net.root / "simwallet.json").read_text())
                tips_paid = atoms_from_milliatoms(sum(int(m) for m in paid.values()))
                ok = tips_paid == credited == charged + balance
                rows["_books"] = (float(ok), tips_paid)
                return rows
        finally:
            await anyio.to_thread.run_sync(net.stop)


async def one_run(latency_ms: int, reps: int) -> int:
    """Measure one latency and print the rows as JSON (a child process)."""
    exe = await anyio.to_thread.run_sync(brnet_binary)
    rows = await run_once(latency_ms, reps, exe)
    print(json.dumps(rows))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--latency", default="0,250", help="comma-separated added one-way latencies in ms")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of the free and balance-paid calls")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        return anyio.run(one_run, args.one, args.reps)
    try:
        brnet_binary()
    except BrNetUnavailable as exc:
        print(f"realnet bench: skipped: {exc}")
        return 0
    latencies = [int(x) for x in args.latency.split(",") if x.strip()]
    results: dict[int, dict[str, list[float]]] = {}
    for lat in latencies:
        # Each latency in its own process, so nothing of one run lingers in the next.
        cmd = [sys.executable, __file__, "--one", str(lat), "--reps", str(args.reps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            print(f"realnet bench: the run at {lat} ms failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        results[lat] = json.loads(proc.stdout.strip().splitlines()[-1])
    names = ["initialize", "tools/list", "free call (echo)", "first paid call", "paid call with balance"]
    print(f"{'agent-visible call':<24}" + "".join(f"{f'{lat} ms: wall / PMs':>26}" for lat in latencies))
    for name in names:
        cells = "".join(
            f"{results[lat][name][0] * 1000:>16.0f} ms / {results[lat][name][1]:>2.0f} PMs"
            for lat in latencies
        )
        print(f"{name:<24}{cells}")
    ok_all = True
    for lat in latencies:
        ok, paid = results[lat]["_books"]
        ok_all = ok_all and bool(ok)
        print(f"books at {lat} ms: tips paid {paid:.0f} atoms; money rule {'holds' if ok else 'BROKEN'}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
