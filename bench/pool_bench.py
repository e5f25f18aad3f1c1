"""Bot pool throughput on brnet: paid calls per second over 1, 2 and 4 pool
members (identities) sharing one PostgreSQL book (WIRE.md §Pools).

Run: ``python bench/pool_bench.py`` (needs Go, which builds brnet on first
use, and PostgreSQL's ``initdb``/``pg_ctl`` with psycopg 3). Options:
``--agents K`` (concurrent agents per row, default 16), ``--calls N``
(calls per row, split over the agents; default 96), ``--quick`` (K = 8,
48 calls per row).

It starts brnet (four members ``m0``..``m3`` and the caller ``alice``), a
private PostgreSQL server (:mod:`brmcp.testing.pgserver`), four brmcp-serve
processes on one ``pool`` block and one book (the same ``receiptkey.json``
copied to each), and one brmcp-bridge on ``alice`` in approval mode: alice
tips member ``m0`` once, up front, enough for every call, so the rows are
paid calls on balance (``fortune``, 10,000 atoms, charged at once) and no
tip is on any call's path. Each row allows the first 1, 2 or 4 members on
the bridge (``allowed_bots``, reloaded with SIGHUP) and runs K official-SDK
agents, all at member ``m0``'s endpoint, each making paid calls back to
back: the bridge spreads them over the members it may use (BRIDGE.md §Bot
pools). The 1-member row is the single-identity limit of this run: each
identity has its own PM pacing (about 10 PMs/s each way, plus batches), so
more identities carry more calls. The members that served each row are
counted from its results' signed receipts.

Per row: calls/s, p50 and p95 of the agent-visible call, and failed calls.
After each row the book is checked to the atom (tips credited = net
charges + balance, every callKey charged once, nothing left charged, the
row's charges = its successful calls x the price) and no tip was sent.

Target (``PASS``/``MISS`` printed; the exit status is 0 either way, 0 also
when skipped): calls/s at 4 members at least 3x the 1-member figure, every
call answered, the books exact. Figures are for this machine and run only
(a 2-core machine runs the four members, the bridge, brnet and PostgreSQL
on the same cores).
"""

from __future__ import annotations

import argparse
import math
import signal
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brmcp.bridge import Settings
from brmcp.bridge.daemon import read_runtime
from brmcp.protocol.receipts import ReceiptError, ReceiptSigner, signed_receipt_from_meta, verify_receipt
from brmcp.server.pool import PoolConfig
from brmcp.testing.brnet import BrNet, BrNetUnavailable, brnet_binary
from brmcp.testing.pgserver import ServerUnavailable, start_server
from tests.realnet.stack import (
    FORTUNE_ATOMS,
    TOKEN,
    Daemon,
    agent,
    pool_books,
    pool_receipt_key,
    start_bridge,
    start_pool_member,
    wallet_tips,
)

MEMBERS = ("m0", "m1", "m2", "m3")
SPREADS = (1, 2, 4)
SCALE_TARGET = 3.0


async def _until(done: Any, what: str, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not await anyio.to_thread.run_sync(done):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {limit:.0f} s waiting for {what}")
        await anyio.sleep(0.2)


def _serving(daemon: Daemon, datadir: Path) -> bool:
    if daemon.proc is None or daemon.proc.poll() is not None:
        raise RuntimeError(f"brmcp-serve in {datadir} exited:\n{daemon.tail()}")
    try:
        return "serving as " in (datadir / "serve.out").read_text(errors="replace")
    except OSError:
        return False


def _served_by(result: Any, key_hex: str) -> str | None:
    """The member uid a paid result's signed receipt names, or None."""
    signed = signed_receipt_from_meta(result.meta)
    if signed is None:
        return None
    try:
        return verify_receipt(signed, key_hex).bot
    except ReceiptError:
        return None


def _settings(uids: list[str]) -> Settings:
    return Settings(
        enabled=True,
        token=TOKEN,
        mode="approval",
        per_call_cap_atoms=20_000,
        per_day_cap_atoms=0,
        allowed_bots=tuple(uids),
    )


async def _allow(bridge: Daemon, bridge_dir: Path, uids: list[str]) -> None:
    """Reload the bridge with ``uids`` as its allowed bots (SIGHUP)."""
    log = bridge_dir / "bridge.out"

    def reloads() -> int:
        try:
            return log.read_text(errors="replace").count("reloaded settings")
        except OSError:
            return 0

    before = reloads()
    (bridge_dir / "mcpclient.json").write_text(_settings(uids).to_json())
    assert bridge.proc is not None
    bridge.proc.send_signal(signal.SIGHUP)
    await _until(lambda: reloads() > before, "the bridge to reload its settings", 30)


async def _row(
    sessions: list[ClientSession], calls: int, latencies: list[float], key_hex: str, served: dict[str, int]
) -> tuple[int, int, float]:
    """Run ``calls`` paid calls over ``sessions`` back to back; returns
    ``(answered, failed, seconds)``, appends each call's latency and counts
    the results per serving member in ``served``."""
    per = max(1, math.ceil(calls / len(sessions)))
    answered = failed = 0

    async def one(session: ClientSession) -> None:
        nonlocal answered, failed
        for _ in range(per):
            began = time.monotonic()
            try:
                with anyio.fail_after(120):
                    result = await session.call_tool("fortune", {})
                ok = not result.is_error
                member = _served_by(result, key_hex) if ok else None
                if member is not None:
                    served[member] = served.get(member, 0) + 1
            except Exception:
                ok = False
            latencies.append(time.monotonic() - began)
            answered += 1
            failed += 0 if ok else 1

    began = time.monotonic()
    async with anyio.create_task_group() as tg:
        for session in sessions:
            tg.start_soon(one, session)
    return answered, failed, time.monotonic() - began


async def run(agents: int, calls: int, exe: Path, store_url: str, root: Path) -> list[dict[str, Any]]:
    net = BrNet(root / "brnet", users=(*MEMBERS, "alice"), binary=exe)
    await anyio.to_thread.run_sync(net.start)
    daemons: list[Daemon] = []
    try:
        alice = net.user("alice")
        uids = [net.user(n).uid for n in MEMBERS]
        pool = PoolConfig("bench", tuple(uids))
        key = pool_receipt_key(root / "poolkey")
        key_hex = ReceiptSigner.load_or_create(key).public_hex
        dirs = [root / n for n in MEMBERS]
        for nick, datadir in zip(MEMBERS, dirs, strict=True):
            daemons.append(start_pool_member(net.user(nick), [alice.uid], datadir, store_url, pool, key))
        bridge_dir = root / "bridge"
        bridge = start_bridge(
            alice, net.user("m0"), bridge_dir, mode="approval", allowed_bots=(uids[0],), per_day_cap_atoms=0
        )
        daemons.append(bridge)
        for daemon, datadir in zip(daemons, dirs, strict=False):
            await _until(lambda d=daemon, p=datadir: _serving(d, p), f"member {datadir.name}", 90)
        assert bridge.proc is not None
        pid = bridge.proc.pid
        await _until(lambda: (read_runtime(bridge_dir) or {}).get("pid") == pid, "the bridge", 60)
        base = str((read_runtime(bridge_dir) or {})["url"])
        # Every call of every row is prepaid by one direct tip (approval mode:
        # the bridge pays nothing, so no tip is on any call's path).
        total_calls = (len(SPREADS) * max(calls, agents) + 2 * len(MEMBERS) + agents) * 2
        topup = total_calls * FORTUNE_ATOMS
        await anyio.sleep(1.2)  # past brnet's 1 s TipUser restart delay
        async with alice.client(backoff_initial=0.05, backoff_max=0.2, ping_interval=None) as client:
            await client.wait_connected()
            await client.tip_user(uids[0], topup / 1e8, 3)
        await _until(lambda: pool_books(store_url, alice.uid).balance == topup, "the top-up", 60)
        tips_before = wallet_tips(net)[0]
        rows: list[dict[str, Any]] = []
        async with AsyncExitStack() as stack:
            url = f"{base}/mcp/{uids[0]}"
            sessions = [await stack.enter_async_context(agent(url, 300)) for _ in range(agents)]
            for spread in SPREADS:
                if spread > 1:
                    await _allow(bridge, bridge_dir, uids[:spread])
                # Warm up: the bridge's first contact with m0, then (once m0's
                # pool announcement names them) with each sibling it now allows.
                for session in sessions[: 2 * spread]:
                    result = await session.call_tool("fortune", {})
                    if result.is_error:
                        raise RuntimeError(f"warm-up call at {spread} member(s) failed: {result}")
                await anyio.sleep(3.0)
                before = await anyio.to_thread.run_sync(pool_books, store_url, alice.uid)
                latencies: list[float] = []
                served: dict[str, int] = {}
                answered, failed, seconds = await _row(
                    sessions, max(calls, agents), latencies, key_hex, served
                )
                await _until(
                    lambda: pool_books(store_url, alice.uid).open_calls == 0, "the row's calls to settle", 60
                )
                after = await anyio.to_thread.run_sync(pool_books, store_url, alice.uid)
                problems: list[str] = []
                try:
                    after.check()
                except AssertionError as exc:
                    problems.append(f"book: {exc}")
                charged = after.charges - before.charges
                if charged != (answered - failed) * FORTUNE_ATOMS:
                    problems.append(f"charged {charged} atoms for {answered - failed} successful calls")
                if wallet_tips(net)[0] != tips_before:
                    problems.append("a tip was sent during the run")
                lat = sorted(latencies)
                rows.append(
                    {
                        "members": spread,
                        "served": len(served),
                        "agents": agents,
                        "calls": answered,
                        "failed": failed,
                        "rate": answered / seconds if seconds else 0.0,
                        "p50": statistics.median(lat),
                        "p95": lat[min(len(lat) - 1, math.ceil(0.95 * len(lat)) - 1)],
                        "problems": problems,
                    }
                )
        return rows
    finally:
        for daemon in reversed(daemons):
            await anyio.to_thread.run_sync(daemon.stop)
        await anyio.to_thread.run_sync(net.stop)


def report(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'members':>8}{'served':>8}{'agents':>8}{'calls':>7}{'calls/s':>9}{'p50 ms':>9}{'p95 ms':>9}"
        f"{'failed':>8}  books"
    )
    for r in rows:
        books = "exact" if not r["problems"] else "; ".join(r["problems"])
        print(
            f"{r['members']:>8}{r['served']:>8}{r['agents']:>8}{r['calls']:>7}{r['rate']:>9.1f}"
            f"{r['p50'] * 1000:>9.0f}{r['p95'] * 1000:>9.0f}{r['failed']:>8}  {books}"
        )
    by = {r["members"]: r for r in rows}
    if 1 in by and 4 in by and by[1]["rate"]:
        scale = by[4]["rate"] / by[1]["rate"]
        verdict = "PASS" if scale >= SCALE_TARGET else "MISS"
        print(f"4 members / 1 member: {scale:.2f}x  target >= {SCALE_TARGET:.1f}x {verdict}")
    answered = all(r["failed"] == 0 for r in rows)
    print(f"every call answered: {'PASS' if answered else 'MISS'}")
    exact = all(not r["problems"] for r in rows)
    print(f"books: {'PASS' if exact else 'MISS'} (credits = balance + charges, every callKey charged once)")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--agents", type=int, default=16, help="concurrent agents per row")
    parser.add_argument("--calls", type=int, default=96, help="calls per row, split over the agents")
    parser.add_argument("--quick", action="store_true", help="8 agents, 48 calls per row")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.calls = 8, 48
    if args.agents < 4:
        parser.error("--agents must be at least 4 (spread over up to 4 members)")
    try:
        exe = brnet_binary()
    except BrNetUnavailable as exc:
        print(f"pool bench: skipped: {exc}")
        return 0
    try:
        with (
            start_server(max_connections=100) as server,
            tempfile.TemporaryDirectory(prefix="brmcp-pool-") as tmp,
        ):
            store_url = server.create_database("pool")
            print(
                f"{args.agents} agents per row, {args.calls} paid calls per row ({FORTUNE_ATOMS} atoms each)"
            )
            rows = anyio.run(run, args.agents, args.calls, exe, store_url, Path(tmp))
    except ServerUnavailable as exc:
        print(f"pool bench: skipped: {exc}")
        return 0
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
