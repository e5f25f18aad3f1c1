"""One of several processes hammering one PostgreSQL book
(tests/server/test_store_postgres_concurrency.py): eight concurrent clients
on one :class:`~brmcp.server.store.postgres.PostgresExecutor` (so batches
group-commit) make seeded random credits under shared refs, keyed and
unkeyed charges, completions with and without refunds, and deliveries of
shared tips. Prints one JSON object: what this process saw succeed.

Usage: ``python pg_hammer_worker.py URL INDEX OPS SEED``.
"""

from __future__ import annotations

import functools
import json
import random
import sys
from typing import Any

import anyio

from brmcp.server import store
from brmcp.server.calls import is_store_error
from brmcp.server.store.postgres import PostgresExecutor
from brmcp.server.store.url import parse_store_url

PEERS = tuple(c * 64 for c in "abc")
CLIENTS = 8
REFS = 40
KEYS = 60
TIPS = 50


def credit_of(k: int) -> tuple[str, int]:
    """The peer and atoms of shared credit ref ``k``."""
    return PEERS[k % 3], 1000 + k


def tip_of(seq: int) -> tuple[str, int]:
    """The sender and milliatoms of shared tip ``seq``."""
    return PEERS[seq % 3], seq * 1000 + 1500


async def main(url: str, index: int, ops: int, seed: int) -> None:
    ex = PostgresExecutor(parse_store_url(url))
    seen: dict[str, list[Any]] = {"credits": [], "charges": [], "refunds": [], "tips": [], "errors": []}

    async def attempt(op: Any) -> Any:
        try:
            with anyio.CancelScope(shield=True):
                return await ex.run(op)
        except store.BalanceLimitError:
            return None
        except Exception as exc:
            if not is_store_error(exc):
                raise
            seen["errors"].append(type(exc).__name__)
            return None

    async def client(c: int) -> None:
        rng = random.Random(seed * 1000 + index * 100 + c)
        for n in range(ops):
            roll = rng.random()
            op: Any
            if roll < 0.25:
                k = rng.randrange(REFS)
                peer, atoms = credit_of(k)
                op = functools.partial(
                    store.credit, peer=peer, atoms=atoms, ts=1.0, kind="credit", ref=f"s:{k}"
                )
                if await attempt(op) is not None:
                    seen["credits"].append(k)
            elif roll < 0.6:
                keyed = rng.random() < 0.5
                k = rng.randrange(KEYS)
                peer = PEERS[k % 3] if keyed else rng.choice(PEERS)
                call_id = f"w{index}-{c}-{n}"
                atoms = rng.randint(1, 900)
                op = functools.partial(
                    store.charge,
                    call_id=call_id,
                    peer=peer,
                    call_key=f"k{k}" if keyed else None,
                    tool="t",
                    atoms=atoms,
                    ts=2.0,
                )
                result = await attempt(op)
                if result is None or not result[0]:
                    continue
                seen["charges"].append([call_id, peer, f"k{k}" if keyed else None, atoms])
                if keyed:
                    continue  # keyed calls stay charged: their key stays claimed to the end
                refund = rng.random() < 0.5
                done = functools.partial(
                    store.complete,
                    call_id=call_id,
                    keyed=False,
                    ts=3.0,
                    expires=3.0,
                    outcome_json=None,
                    refund=(peer, atoms, True) if refund else None,
                )
                if await attempt(done) is not None and refund:
                    seen["refunds"].append(call_id)
            else:
                seq = rng.randrange(TIPS)
                peer, matoms = tip_of(seq)
                op = functools.partial(
                    store.record_tip,
                    sequence_id=seq,
                    peer=peer,
                    amount_matoms=matoms,
                    atoms=matoms // 1000,
                    credit_it=True,
                    ts=4.0,
                    local=True,
                )
                result = await attempt(op)
                if result is not None and result[0]:
                    seen["tips"].append([seq, result[1]])

    try:
        async with anyio.create_task_group() as tg:
            for c in range(CLIENTS):
                tg.start_soon(client, c)
    finally:
        seen["retries"] = [ex.retries]
        ex.close()
    print(json.dumps(seen))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
