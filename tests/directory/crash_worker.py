"""The process tests/directory/test_crash_safety.py kills: a Directory, four
providers (harnesses selling a priced test tool), a peer directory selling
snapshots and an admin, on one in-memory fabric with unpaced PMs. Each
provider cycles through registering, tipping its invoice, the verification
run (fee, crawl, paid test), approval, renewals and spot checks; the admin
buys the peer's snapshot over and over.

Run as ``python -m tests.directory.crash_worker <data_dir> <log_dir>`` from the
repository root: a *zygote* that imports everything once, then reads commands
on stdin and forks one child per run (the protocol of
tests/server/crash_worker.py):

* ``run <n> <seed>``: the child serves the load until it is killed;
* ``finish <n> <seed>``: the child starts no new registration, lets every
  run left crawling or testing finish, approves what passed, and exits 0.

Lines on stdout: ``zygote ready``, ``child <n> <pid>``, ``ready <n>``,
``exit <pid> <status>``, and ``error ...`` when a child fails.

Data: the directory's database in ``<data_dir>/dir``, provider ``i``'s in
``<data_dir>/p<i>``, the peer directory's in ``<data_dir>/peer``. Durable
records (one ``os.write`` per line, then fsync), each written *before* the
effect it describes, as a wallet writes its own:

* ``tips.log``: ``<seq> <provider> <matoms>``, before a provider's tip is
  handed to :meth:`Directory.credit_tip` (redeliveries are logged again);
* ``payments.log``: ``<seq> <payee> <atoms> <spend ref> <callKey>``, the
  directory's payer, once the money has left and before the payee's harness
  is credited (the spend-journal row it pays is read from the directory's
  store at that moment; ``- -`` when there is none, which the test rejects);
* ``executions.log``: ``<provider> <peer> <callKey or -> <reg_id or -> <0|1>
  ok|fail``, by the provider's paid tool before it returns; the flag says
  whether the directory's stored registration carried that callKey then.

At start-up a child redelivers every logged payment to its payee's harness
(deduplicated there by sequence id) and the last few provider tips to the
directory, as brclient redelivers what was not acknowledged.
"""

from __future__ import annotations

import os
import random
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
from mcp import ClientSession

from brmcp import RouterOptions
from brmcp.directory import Directory, DirectoryConfig, Policy, Timeouts
from brmcp.directory.model import (
    STATE_AWAITING_FUNDING,
    STATE_CRAWLING,
    STATE_LISTED,
    STATE_PENDING_REVIEW,
    STATE_TESTING,
)
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, uid
from tests.server.crash_worker import DurableLog, emit

DIRECTORY = uid(60)
ADMIN = uid(61)
#: Provider uids and their test tool's price in atoms: two plain ones, one
#: whose tool fails a quarter of the time (the provider refunds), one priced
#: above the test budget (the directory declines to pay).
PROVIDERS = (uid(62), uid(63), uid(64), uid(65))
PRICES = (500, 700, 300, 3_000)
FLAKY = 2
#: A peer directory whose snapshot the directory buys out of its own pocket.
PEER_DIR = uid(66)
SNAPSHOT_PRICE = 300
FEE = 1_000
BUDGET = 2_000
#: Provider tips of earlier runs redelivered at each start.
REDELIVER_TIPS = 6
TIMEOUTS = Timeouts(dial=5.0, crawl=5.0, call=5.0, pay=5.0, credit_polls=2, credit_poll_delay=0.02)
UNPACED = RouterOptions(pm_interval=0)


class PayError(Exception):
    """A definitive rail failure: nothing left the wallet."""


class InDoubtError(Exception):
    """The tip went out but was not confirmed."""

    may_land = True


def directory_data(data_dir: Path) -> Path:
    return data_dir / "dir"


def provider_data(data_dir: Path, index: int) -> Path:
    return data_dir / f"p{index}"


def peer_data(data_dir: Path) -> Path:
    return data_dir / "peer"


def policy() -> Policy:
    return Policy(admin_uids=(ADMIN,), listing_fee_atoms=FEE, calls_per_minute=10**6)


def read_lines(path: Path) -> list[list[str]]:
    """The words of each line of a durable log (none when it does not exist)."""
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line]


class NoPayer:
    """The peer directory's payer: it never buys anything here."""

    async def pay(self, payee_uid: str, atoms: int) -> None:
        raise PayError(f"the peer pays nobody ({atoms} atoms to {payee_uid[:8]})")


class WalletPayer:
    """The directory's payer: a tip to the payee's harness under a fresh
    sequence id, logged (with the newest ``launched`` journal row for the
    payee, the one this payment settles) before the payee is credited. About
    one payment in twelve fails definitively (nothing sent, nothing logged);
    one in twelve is sent and then reported in doubt (``may_land``)."""

    def __init__(self, log: DurableLog, run: int, rng: random.Random) -> None:
        self.log = log
        self.run = run
        self.rng = rng
        self.harnesses: dict[str, Harness] = {}
        self.directory: Directory | None = None
        self.seq = 0

    async def pay(self, payee_uid: str, atoms: int) -> None:
        roll = self.rng.random()
        if roll < 0.08:
            raise PayError("no route to the payee")
        assert self.directory is not None
        launched = [
            e
            for e in await self.directory.store.spends(payee_uid)
            if e.state == "launched" and e.atoms == atoms
        ]
        ref, key = (launched[-1].ref, launched[-1].call_key) if launched else ("-", "-")
        self.seq += 1
        seq = self.run * 1_000_000 + self.seq
        self.log.append(f"{seq} {payee_uid} {atoms} {ref} {key}")
        await anyio.sleep(self.rng.random() * 0.005)  # the tip is on its way
        await self.harnesses[payee_uid].credit_tip(DIRECTORY, atoms * 1000, seq)
        if roll < 0.16:
            raise InDoubtError("tip sent, confirmation lost")


def provider_harness(
    data_dir: Path, index: int, executions: DurableLog, holder: list[Directory], rng: random.Random
) -> Harness:
    """Provider ``index``: ``probe`` at ``PRICES[index]`` atoms (logs each
    execution durably before answering) and the free ``echo``."""
    me = PROVIDERS[index]
    harness = Harness(
        HarnessConfig(
            data_dir=provider_data(data_dir, index),
            allow=lambda _peer: True,
            calls_per_minute=10**6,
            router_options=UNPACED,
            name=f"provider{index}",
        )
    )

    @harness.tool(price_atoms=PRICES[index], description="A priced probe the directory tests")
    async def probe(ctx: CallContext, topic: str = "") -> dict[str, Any]:
        reg = await holder[0].store.registration(me) if holder else None
        key = ctx.call_key or "-"
        match = int(reg is not None and reg.call_key == ctx.call_key)
        fail = index == FLAKY and rng.random() < 0.25
        reg_id = reg.reg_id if reg is not None else "-"
        executions.append(f"{me} {ctx.peer} {key} {reg_id} {match} {'fail' if fail else 'ok'}")
        await anyio.sleep(rng.random() * 0.01)  # widen the window between charge and answer
        if fail:
            raise RuntimeError("probe failed")
        return {"probe": topic, "charged": ctx.charged_atoms}

    @harness.tool(description="Echo, free")
    async def echo(ctx: CallContext, text: str = "") -> dict[str, Any]:
        return {"text": text}

    return harness


def structured(result: types.CallToolResult) -> dict[str, Any]:
    """A directory tool's structured answer; RuntimeError for a tool error."""
    if result.is_error:
        text = (
            result.content[0].text
            if result.content and isinstance(result.content[0], types.TextContent)
            else ""
        )
        raise RuntimeError(f"tool error: {text}")
    assert result.structured_content is not None
    return dict(result.structured_content)


async def serve(run: int, seed: int, data_dir: Path, log_dir: Path, finish: bool) -> None:
    rng = random.Random(seed * 1_000_003 + run)
    executions = DurableLog(log_dir / "executions.log")
    tips_path = log_dir / "tips.log"
    old_tips = read_lines(tips_path)[-REDELIVER_TIPS:]
    tips = DurableLog(tips_path)
    payments_path = log_dir / "payments.log"
    old_payments = read_lines(payments_path)
    payer = WalletPayer(DurableLog(payments_path), run, rng)
    holder: list[Directory] = []
    tip_seq = 0
    offered: list[tuple[int, str, int]] = []

    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric(seed=seed + run))
        harnesses = [provider_harness(data_dir, i, executions, holder, rng) for i in range(len(PROVIDERS))]
        routers = []
        for index, harness in enumerate(harnesses):
            await stack.enter_async_context(harness)
            router = await harness.start(fabric.sender(PROVIDERS[index]))
            fabric.attach(PROVIDERS[index], router.handle_pm)
            routers.append(router)
            payer.harnesses[PROVIDERS[index]] = harness

        peer = Directory(
            DirectoryConfig(
                peer_data(data_dir),
                Policy(snapshot_price_atoms=SNAPSHOT_PRICE, calls_per_minute=10**6, name="peerdir"),
                NoPayer(),
                self_uid=PEER_DIR,
                router_options=UNPACED,
                sweep_interval=0,
            )
        )
        await stack.enter_async_context(peer)
        peer_router = await peer.start(fabric.sender(PEER_DIR))
        fabric.attach(PEER_DIR, peer_router.handle_pm)
        payer.harnesses[PEER_DIR] = peer.harness
        # The wallet redelivers every payment it made; each payee credits it once.
        for seq_text, payee, atoms_text, *_ in old_payments:
            await payer.harnesses[payee].credit_tip(DIRECTORY, int(atoms_text) * 1000, int(seq_text))

        directory = Directory(
            DirectoryConfig(
                directory_data(data_dir),
                policy(),
                payer,
                self_uid=DIRECTORY,
                router_options=UNPACED,
                timeouts=TIMEOUTS,
                sweep_interval=0,
            )
        )
        payer.directory = directory
        holder.append(directory)
        await stack.enter_async_context(directory)
        dir_router = await directory.start(fabric.sender(DIRECTORY))
        fabric.attach(DIRECTORY, dir_router.handle_pm)

        async def tip(provider: str, matoms: int, seq: int) -> None:
            tips.append(f"{seq} {provider} {matoms}")
            await directory.credit_tip(provider, matoms, seq)

        for seq_text, provider, matoms_text in old_tips:
            await tip(provider, int(matoms_text), int(seq_text))

        async def open_session(router: Any) -> ClientSession:
            conn = router.dial(DIRECTORY)
            session = await stack.enter_async_context(
                ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=20)
            )
            await session.initialize()
            return session

        admin_router = await stack.enter_async_context(fabric.router(ADMIN, pm_interval=0))
        admin = await open_session(admin_router)
        sessions = [await open_session(router) for router in routers]

        async def approve(provider: str) -> None:
            # May race a renewal or another approval; a refusal is fine.
            await admin.call_tool("approve", {"uid": provider})

        if finish:
            await directory.pipeline.wait_idle()
            for reg in await directory.store.registrations():
                if reg.state == STATE_PENDING_REVIEW and reg.test_outcome == "ok":
                    await approve(reg.uid)
            left = [
                r for r in await directory.store.registrations() if r.state in (STATE_CRAWLING, STATE_TESTING)
            ]
            if left:
                raise RuntimeError(f"runs left after the finish: {[(r.uid[:8], r.state) for r in left]}")
            return

        emit(f"ready {run}")

        async def agent(index: int) -> None:
            nonlocal tip_seq
            me = PROVIDERS[index]
            session = sessions[index]
            test = {"tool": "probe", "args": {"topic": f"run{run}"}, "maxAtoms": BUDGET}
            while True:
                status = structured(await session.call_tool("my_status", {}))
                state = status["state"]
                roll = rng.random()
                if state in ("none", "rejected") or (state == STATE_PENDING_REVIEW and status.get("note")):
                    args = {"description": f"provider {index}", "tags": ["crash"], "test": test}
                    structured(await session.call_tool("register", args))
                elif state == STATE_AWAITING_FUNDING:
                    short = int(status.get("shortfallAtoms", 0))
                    parts = [short] if roll < 0.5 or short < 2 else [short // 2, short - short // 2]
                    for atoms in parts:
                        if offered and rng.random() < 0.2:
                            again = rng.choice(offered)  # a redelivery
                            await tip(again[1], again[2], again[0])
                        tip_seq += 1
                        seq = run * 1_000_000 + tip_seq
                        matoms = atoms * 1000 + rng.choice((0, 0, 1, 999))
                        offered.append((seq, me, matoms))
                        await tip(me, matoms, seq)
                elif state == STATE_PENDING_REVIEW:
                    await approve(me)
                elif state == STATE_LISTED:
                    if roll < 0.35:
                        args = {"description": f"provider {index} renewed", "tags": ["crash"], "test": test}
                        structured(await session.call_tool("register", args))
                    elif roll < 0.5:
                        # A spot check, funded by the provider's residual balance.
                        if rng.random() < 0.5:
                            tip_seq += 1
                            seq = run * 1_000_000 + tip_seq
                            offered.append((seq, me, BUDGET * 1000))
                            await tip(me, BUDGET * 1000, seq)
                        await admin.call_tool("run_verification", {"uid": me})
                await anyio.sleep(rng.random() * 0.01)

        async def federation() -> None:
            await admin.call_tool("add_peer", {"uid": PEER_DIR, "pubKey": peer.public_key})
            while True:
                await admin.call_tool("verify_peer", {"uid": PEER_DIR})
                await anyio.sleep(rng.random() * 0.05)

        async with anyio.create_task_group() as tg:
            tg.start_soon(federation)
            for index in range(len(PROVIDERS)):
                tg.start_soon(agent, index)


def child_main(run: int, seed: int, data_dir: Path, log_dir: Path, finish: bool) -> None:
    code = 1
    try:
        anyio.run(serve, run, seed, data_dir, log_dir, finish)
        code = 0
    except BaseException as exc:
        emit(f"error {run} {type(exc).__name__}: {exc}")
    finally:
        os._exit(code)


def zygote(data_dir: Path, log_dir: Path) -> None:
    emit("zygote ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        run, seed = int(words[1]), int(words[2])
        pid = os.fork()
        if pid == 0:
            child_main(run, seed, data_dir, log_dir, words[0] == "finish")
        emit(f"child {run} {pid}")
        _, status = os.waitpid(pid, 0)
        emit(f"exit {pid} {status}")


if __name__ == "__main__":
    zygote(Path(sys.argv[1]), Path(sys.argv[2]))
