"""The process tests/server/test_crash_safety.py kills: a Harness serving paid keyed
load over its own in-process fabric and SDK clients.

Run as ``python tests/server/crash_worker.py <data_dir> <log_dir>``: a *zygote* that
imports everything once, then reads commands on stdin and forks one child
per run, so each restart costs a fork rather than a fresh interpreter:

* ``run <n> <seed>``: the child serves load until it is killed;
* ``finish <n> <seed> <calls>``: the child makes ``calls`` calls and exits 0.

Lines on stdout (each one ``os.write``, so the zygote's and the child's
never interleave): ``zygote ready``, ``child <n> <pid>``, ``ready <n>``,
``exit <pid> <status>``. The zygote exits at end of input.

Durable records written by the child (append, one ``os.write`` per line,
then fsync), read by the test to check the ledger against what happened:

* ``executions.log``: ``<peer> <key or -> ok|fail``, written by the paid
  handler *before* it returns (or raises);
* ``tips.log``: ``<seq> <peer> <matoms>``, written before each
  ``credit_tip`` call (a redelivery is logged again);
* ``issued.log``: ``<peer index> <key>`` per new callKey (a hint for the
  next run, which retries the newest keys first and reuses older ones).
"""

from __future__ import annotations

import os
import random
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession

from brmcp import RouterOptions
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, uid

BOT = uid(1)
PEERS = (uid(2), uid(3), uid(4))  # allowed
STRANGER = uid(14)  # tips from it are never credited
PRICE = 7
SESSIONS_PER_PEER = 2
CALLERS_PER_SESSION = 2


def emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


class DurableLog:
    """Append-only lines, each made durable before :meth:`append` returns."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def append(self, line: str) -> None:
        os.write(self._fd, (line + "\n").encode())
        os.fsync(self._fd)


def build_harness(data_dir: str, executions: DurableLog, rng: random.Random) -> Harness:
    # PMs unpaced (an in-memory fabric has no relay to spare), so many paid
    # calls are in flight whenever the kill lands.
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir,
            allowed_peers=set(PEERS),
            calls_per_minute=10**6,
            router_options=RouterOptions(pm_interval=0),
        )
    )

    @harness.tool(price_atoms=PRICE, description="Paid work that records each execution")
    async def work(ctx: CallContext, fail: bool = False, nonce: int = 0) -> dict[str, Any]:
        executions.append(f"{ctx.peer} {ctx.call_key or '-'} {'fail' if fail else 'ok'}")
        # Widen the window between the charge and its completion.
        await anyio.sleep(rng.random() * 0.004)
        if fail:
            raise RuntimeError("requested failure")
        return {"key": ctx.call_key, "nonce": nonce, "charged": ctx.charged_atoms}

    return harness


def issued_keys(path: Path) -> list[tuple[int, str]]:
    """Every callKey issued so far, oldest first, as (peer index, key)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        index, key = line.split()
        out.append((int(index), key))
    return out


def previous_tips(path: Path, limit: int) -> list[tuple[int, str, int]]:
    """The last offered tips of earlier runs (the wallet redelivers un-acked
    tips after a restart)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines()[-limit:]:
        seq, peer, matoms = line.split()
        out.append((int(seq), peer, int(matoms)))
    return out


async def serve(run: int, seed: int, data_dir: str, log_dir: Path, calls: int | None) -> None:
    rng = random.Random(seed * 1_000_003 + run)
    executions = DurableLog(log_dir / "executions.log")
    tips_path = log_dir / "tips.log"
    redeliver = previous_tips(tips_path, 6)
    tips = DurableLog(tips_path)
    harness = build_harness(data_dir, executions, rng)
    budget = {"left": calls if calls is not None else -1}
    issued_path = log_dir / "issued.log"
    history = issued_keys(issued_path)
    issued = os.open(issued_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    known: dict[int, list[str]] = {i: [] for i in range(len(PEERS))}
    for index, key in history:
        known[index].append(key)
    # The newest keys of the killed run were likely in flight at the kill:
    # retry them first, as a client whose call got no answer does.
    retry: dict[int, list[str]] = {i: [] for i in range(len(PEERS))}
    for index, key in history[-4 * len(PEERS) * SESSIONS_PER_PEER * CALLERS_PER_SESSION :]:
        retry[index].append(key)
    offered: list[tuple[int, str, int]] = []

    async def tipper() -> None:
        for seq, peer, matoms in redeliver:
            tips.append(f"{seq} {peer} {matoms}")
            await harness.credit_tip(peer, matoms, seq)
        i = 0
        while True:
            if offered and rng.random() < 0.2:
                seq, peer, matoms = rng.choice(offered)  # redelivery
            else:
                i += 1
                seq = run * 1_000_000 + i
                peer = rng.choice((*PEERS, STRANGER))
                matoms = (
                    rng.choice((0, -1000, 999, 1000, 1999)) if rng.random() < 0.15 else rng.randint(1, 60_000)
                )
                offered.append((seq, peer, matoms))
            tips.append(f"{seq} {peer} {matoms}")
            await harness.credit_tip(peer, matoms, seq)
            await anyio.sleep(rng.random() * 0.01)

    async def caller(session: ClientSession, peer_index: int, caller_id: str) -> None:
        n = 0
        while budget["left"] != 0:
            if budget["left"] > 0:
                budget["left"] -= 1
            n += 1
            roll = rng.random()
            key: str | None
            if retry[peer_index]:
                key = retry[peer_index].pop()
            elif roll < 0.1:
                key = None  # unkeyed paid call
            elif roll < 0.3 and known[peer_index]:
                key = rng.choice(known[peer_index])  # reuse a key of this peer, any run
            else:
                key = f"k{peer_index}-{run}-{caller_id}-{n}"
                known[peer_index].append(key)
                os.write(issued, f"{peer_index} {key}\n".encode())
            args = {"fail": rng.random() < 0.1, "nonce": rng.randint(0, 10**9)}
            meta: Any = None if key is None else {"brmcp/callKey": key}
            await session.call_tool("work", args, meta=meta)

    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric(seed=seed))
        await stack.enter_async_context(harness)
        router = await harness.start(fabric.sender(BOT))
        fabric.attach(BOT, router.handle_pm)
        clients = [await stack.enter_async_context(fabric.router(peer, pm_interval=0)) for peer in PEERS]
        sessions: list[tuple[ClientSession, int]] = []
        for peer_index, client in enumerate(clients):
            for _ in range(SESSIONS_PER_PEER):
                conn = client.dial(BOT)
                session = await stack.enter_async_context(
                    ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=30)
                )
                await session.initialize()
                sessions.append((session, peer_index))
        emit(f"ready {run}")
        async with anyio.create_task_group() as tg:
            tg.start_soon(tipper)
            async with anyio.create_task_group() as callers:
                for s_index, (session, peer_index) in enumerate(sessions):
                    for c in range(CALLERS_PER_SESSION):
                        callers.start_soon(caller, session, peer_index, f"{s_index}.{c}")
            tg.cancel_scope.cancel()


def child_main(run: int, seed: int, data_dir: str, log_dir: Path, calls: int | None) -> None:
    code = 1
    try:
        anyio.run(serve, run, seed, data_dir, log_dir, calls)
        code = 0
    except BaseException as exc:
        emit(f"error {run} {type(exc).__name__}: {exc}")
    finally:
        os._exit(code)


def zygote(data_dir: str, log_dir: Path) -> None:
    emit("zygote ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        run, seed = int(words[1]), int(words[2])
        calls = int(words[3]) if words[0] == "finish" else None
        pid = os.fork()
        if pid == 0:
            child_main(run, seed, data_dir, log_dir, calls)
        emit(f"child {run} {pid}")
        _, status = os.waitpid(pid, 0)
        emit(f"exit {pid} {status}")


if __name__ == "__main__":
    zygote(sys.argv[1], Path(sys.argv[2]))
