"""Bot pools seen from the bridge (WIRE.md §Pools; BRIDGE.md §Bot pools;
brmcp/bridge/pay/_pools.py).

Two or three harness members on one PostgreSQL book, each its own uid on
the fabric, all signing with one receipt key and announcing one pool. An
agent talks to one member's endpoint; the bridge spreads its calls over the
members that announced the pool themselves, fails over from a member that
went offline with the same callKey, keeps one balance for the pool, and the
books come out exact: what the payer paid equals the balance left plus 500
atoms per execution, and every answered call ran exactly once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import ClientSession

from brmcp.bridge import Bridge, ManualClock
from brmcp.protocol.receipts import ReceiptSigner
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.server.pool import PoolConfig
from brmcp.testing import Fabric, uid
from tests.kit import BOT, CLIENT
from tests.kit.bridge import NAME, START, TOKEN, call, fabric_bridge, fixture_settings, joined

pytestmark = pytest.mark.anyio

SIBLING = uid(20)
THIRD = uid(21)
PRICE = 500
POOL = "fortunes"


@dataclass
class Member:
    uid: str
    harness: Harness
    runs: list[int] = field(default_factory=list)


class PoolPayer:
    """Credits the shared book at the member paid, as its tip would; records
    every payment ``(payee, atoms)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.members: dict[str, Member] = {}

    async def pay(self, payee_uid: str, atoms: int) -> None:
        self.calls.append((payee_uid, atoms))
        await self.members[payee_uid].harness.credit(CLIENT, atoms)


@dataclass
class PoolEnv:
    fabric: Fabric
    bridge: Bridge
    payer: PoolPayer
    members: dict[str, Member]
    counter: list[int]

    @asynccontextmanager
    async def session(self, bot: str = BOT) -> AsyncIterator[ClientSession]:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        address = self.bridge.listen_address
        assert address is not None
        url = f"http://{address[0]}:{address[1]}/mcp/{bot}"
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session

    async def books(self) -> None:
        """Every atom paid is the balance left plus the price of each run."""
        runs = sum(len(m.runs) for m in self.members.values())
        balance = await next(iter(self.members.values())).harness.balance(CLIENT)
        paid = sum(atoms for _, atoms in self.payer.calls)
        assert paid == balance + PRICE * runs, f"paid {paid}, balance {balance}, {runs} runs"
        for member in self.members.values():
            assert await member.harness.balance(CLIENT) == balance, "one book, one balance"


def _member(
    data_dir: Path, me: str, store: str, key: Ed25519PrivateKey, pool: PoolConfig | None, counter: list[int]
) -> Member:
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir,
            store=store,
            allowed_peers={CLIENT},
            calls_per_minute=100_000,
            name=f"member-{me[:4]}",
            receipt_signer=ReceiptSigner(key, bot=me),
            pool=pool,
            hold_seconds=2.0,
        )
    )
    member = Member(me, harness)

    async def paid(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        counter[0] += 1
        member.runs.append(counter[0])
        return {"n": counter[0], "by": me}

    async def free(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"by": me}

    harness.add_tool(
        "paid", paid, description="A paid tool", input_schema={"type": "object"}, price_atoms=PRICE
    )
    harness.add_tool("free", free, description="A free tool", input_schema={"type": "object"})
    return member


@asynccontextmanager
async def pool_env(
    tmp_path: Path,
    store: str,
    *,
    uids: tuple[str, ...] = (BOT, SIBLING),
    allowed: tuple[str, ...] | None = None,
    announced: tuple[str, ...] | None = None,
    outsider: str | None = None,
    outsider_claims: str = "none",
) -> AsyncIterator[PoolEnv]:
    """Members at ``uids`` announcing ``announced`` (default ``uids``) as the
    pool; ``outsider``: one more bot on the same book listed by the others
    but not a member: ``outsider_claims`` "none" (it announces no pool),
    "other-key" (the same id and members under a key of its own) or
    "not-listing-back" (the same id and key, members without the first
    member). The bridge allows ``allowed`` (default
    every bot)."""
    key = Ed25519PrivateKey.generate()
    pool = PoolConfig(POOL, announced or uids)
    counter = [0]
    members = {me: _member(tmp_path / me[:6], me, store, key, pool, counter) for me in uids}
    if outsider is not None:
        claims = {
            "none": (key, None),
            "other-key": (Ed25519PrivateKey.generate(), pool),
            "not-listing-back": (key, PoolConfig(POOL, (outsider, THIRD))),
        }
        own, claimed = claims[outsider_claims]
        members[outsider] = _member(tmp_path / outsider[:6], outsider, store, own, claimed, counter)
    payer = PoolPayer()
    payer.members = members
    bots = allowed if allowed is not None else tuple(members)
    data_dir = tmp_path / "bridge"
    data_dir.mkdir()
    (data_dir / "mcpclient.json").write_text(fixture_settings(allowed_bots=bots).to_json())
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric())
        for member in members.values():
            await stack.enter_async_context(member.harness)
            router = await member.harness.start(fabric.sender(member.uid))
            fabric.attach(member.uid, router.handle_pm)
        bridge = fabric_bridge(fabric, data_dir, payer, name=NAME, clock=ManualClock(START, auto=True))
        await stack.enter_async_context(bridge)
        bridge.pools.failover_after = 1.0
        yield PoolEnv(fabric, bridge, payer, members, counter)


async def _members_known(env: PoolEnv, count: int) -> None:
    # The sibling's tool list is asked for in the background (a probe).
    with anyio.fail_after(20):
        while len(env.bridge.pools.members(BOT)) < count:  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_calls_spread_over_the_members_on_one_balance(tmp_path: Path, postgres_url: str) -> None:
    async with pool_env(tmp_path, postgres_url) as env, env.session() as session:
        await call(session, "free")
        await _members_known(env, 2)
        answers = [await call(session, "paid", {"i": i}) for i in range(6)]
        assert all(not a.is_error for a in answers), [joined(a) for a in answers]
        assert all(len(m.runs) >= 2 for m in env.members.values()), {
            m.uid[:4]: m.runs for m in env.members.values()
        }
        assert sum(len(m.runs) for m in env.members.values()) == 6
        # One payment per call at most, and one balance: a credit paid at one
        # member covers calls served by the other.
        assert len(env.payer.calls) <= 6
        assert all(atoms <= PRICE for _, atoms in env.payer.calls)
        await env.books()


async def test_concurrent_calls_spread_and_are_each_charged_once(tmp_path: Path, postgres_url: str) -> None:
    async with pool_env(tmp_path, postgres_url, uids=(BOT, SIBLING, THIRD)) as env, env.session() as session:
        await call(session, "free")
        await _members_known(env, 3)
        answers: list[Any] = []

        async def one(i: int) -> None:
            answers.append(await call(session, "paid", {"i": i}))

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
        assert len(answers) == 12
        assert all(not a.is_error for a in answers), [joined(a) for a in answers]
        assert sum(len(m.runs) for m in env.members.values()) == 12
        assert sum(1 for m in env.members.values() if m.runs) >= 2
        assert all(atoms <= PRICE for _, atoms in env.payer.calls)
        assert len(env.payer.calls) <= 12
        await env.books()


@pytest.mark.parametrize("down", [BOT, SIBLING])
async def test_a_member_offline_is_failed_over_with_the_same_call_key(
    tmp_path: Path, postgres_url: str, down: str
) -> None:
    async with pool_env(tmp_path, postgres_url) as env, env.session() as session:
        await call(session, "free")
        await _members_known(env, 2)
        env.fabric.set_offline(down)
        answers = [await call(session, "paid", {"i": i}) for i in range(4)]
        assert all(not a.is_error for a in answers), [joined(a) for a in answers]
        up = next(m for m in env.members.values() if m.uid != down)
        assert len(up.runs) == 4
        assert not env.members[down].runs
        assert env.bridge.pools.failovers >= 1
        # At most one payment per call; the member offline is paid at most
        # once, before the bridge learnt it was down (the credit is the
        # pool's, so the call it paid for was still covered).
        payees = [payee for payee, _ in env.payer.calls]
        assert len(payees) <= 4
        assert payees.count(down) <= 1, [p[:4] for p in payees]
        # The member comes back: the copies held for it meanwhile are
        # duplicates of calls already run, replayed, never charged or run.
        env.fabric.set_online(down)
        await anyio.sleep(1.0)
        assert not env.members[down].runs
        assert sum(len(m.runs) for m in env.members.values()) == 4
        await env.books()


@pytest.mark.parametrize("claims", ["none", "other-key", "not-listing-back"])
async def test_a_listed_sibling_that_does_not_announce_the_pool_gets_nothing(
    tmp_path: Path, postgres_url: str, claims: str
) -> None:
    """The home lists SIBLING (allowed, same book, but announcing no pool,
    the same pool id under another key, or the pool without naming the
    home) and THIRD (not allowed): neither is a member; every call goes
    home."""
    async with (
        pool_env(
            tmp_path,
            postgres_url,
            uids=(BOT,),
            announced=(BOT, SIBLING, THIRD),
            outsider=SIBLING,
            outsider_claims=claims,
            allowed=(BOT, SIBLING),
        ) as env,
        env.session() as session,
    ):
        sent_to: list[str] = []
        env.fabric.add_tap(lambda src, dst, text: sent_to.append(dst))
        for i in range(4):
            result = await call(session, "paid", {"i": i})
            assert not result.is_error, joined(result)
        assert [link.uid for link in env.bridge.pools.members(BOT)] == [BOT]
        assert len(env.members[BOT].runs) == 4
        assert not env.members[SIBLING].runs
        assert THIRD not in sent_to
        await env.books()


async def test_a_home_offline_before_any_call_still_answers_through_a_known_sibling(
    tmp_path: Path, postgres_url: str
) -> None:
    """Both members learnt, then every call to the home's endpoint while
    the home is offline: each is answered by the sibling, charged once."""
    async with pool_env(tmp_path, postgres_url) as env, env.session() as session:
        await call(session, "free")
        await _members_known(env, 2)
        env.fabric.set_offline(BOT)
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(call, session, "paid", {"i": i})
        assert len(env.members[SIBLING].runs) == 3
        env.fabric.set_online(BOT)
        await anyio.sleep(1.0)
        assert not env.members[BOT].runs
        await env.books()
