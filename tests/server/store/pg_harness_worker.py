"""One of three harness processes sharing one PostgreSQL book, killed with
SIGKILL by tests/server/test_store_postgres_concurrency.py.

Run as ``python pg_harness_worker.py URL INDEX SEED LOG``: builds a Harness
on the ``store`` URL (its start-up reconciles the book: calls interrupted
by the previous kill are refunded), prints ``started``, waits for a line on
stdin (so no sibling serves while another reconciles), credits each peer,
prints ``go`` and then makes paid calls from eight concurrent callers until
killed. callKeys are ``w<INDEX>-<n>`` with n < 300, so a restarted worker
retries keys its previous runs used (those must be answered from the
journal, never executed again); a key whose n is a multiple of 5 asks the
tool to fail (refunded), as does one unkeyed call in five.

``LOG`` gets ``<peer> <key or -> ok|fail`` per execution, appended and
fsynced by the tool *before* it returns or raises.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

import anyio

from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import uid

PEERS = (uid(2), uid(3), uid(4))
PRICE = 7
CREDIT = 100_000
CALLERS = 8
KEYS = 300


def emit(line: str) -> None:
    os.write(1, (line + "\n").encode())


def key_fails(key: str) -> bool:
    """Whether the call under ``key`` asks the tool to fail."""
    return int(key.rsplit("-", 1)[1]) % 5 == 0


async def main(url: str, index: int, seed: int, log_path: str) -> None:
    rng = random.Random(seed)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    harness = Harness(HarnessConfig(store=url, allowed_peers=set(PEERS), calls_per_minute=10**6))

    @harness.tool(price_atoms=PRICE, description="Paid work that records each execution")
    async def work(ctx: CallContext, fail: bool = False) -> dict[str, Any]:
        os.write(fd, f"{ctx.peer} {ctx.call_key or '-'} {'fail' if fail else 'ok'}\n".encode())
        os.fsync(fd)
        await anyio.sleep(rng.random() * 0.005)
        if fail:
            raise RuntimeError("asked to fail")
        return {"ok": True}

    emit("started")
    await anyio.to_thread.run_sync(sys.stdin.readline)
    spec = next(t for t in harness.tools() if t.name == "work")
    async with harness:
        for peer in PEERS:
            await harness.credit(peer, CREDIT)
        emit("go")

        async def caller(c: int) -> None:
            local = random.Random(seed * 100 + c)
            while True:
                peer = local.choice(PEERS)
                key = f"w{index}-{local.randrange(KEYS)}" if local.random() < 0.8 else None
                args = {"fail": key_fails(key) if key is not None else local.random() < 0.2}
                with anyio.CancelScope(shield=True):
                    await harness.call(peer, spec, args, args, key)

        async with anyio.create_task_group() as tg:
            for c in range(CALLERS):
                tg.start_soon(caller, c)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
