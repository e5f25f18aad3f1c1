"""Bot pools against hostile bots (WIRE.md §Pools; BRIDGE.md §Bot pools,
§The hard bound; brmcp/bridge/pay/_pools.py, brmcp/bridge/pay/_payloop.py).

Every pool member is a stranger. Whatever members announce, list, answer
or charge, for each logical agent call: the atoms paid are at most the price
the agent was shown at the endpoint it called (and the per-call cap); one
payment per call in autopay; nothing goes to a bot that is not a member of
the called bot's pool at that moment (a bot claiming the pool's id and key
without being listed back, a former member, a de-listed one). After each
scenario the books agree to the atom: every payment the payer made is in
the spend log, and was credited to the ledger of the bot paid.

Most scenarios use :class:`PoolBot`, a :class:`~brmcp.testing.HostileBot`
that announces ``brmcp/pool`` and ``brmcp/receiptKey``; two of them given
one ledger and one callKey record are a pool on one book. The last ones
use brmcp harness members on PostgreSQL (tests/bridge/test_pools.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server import ServerRequestContext
from mcp.types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
)

from brmcp.bridge import Bridge, ManualClock, RetryPolicy
from brmcp.protocol.pool import POOL_META_KEY, STILL_RUNNING_ELSEWHERE
from brmcp.protocol.receipts import RECEIPT_KEY_META
from brmcp.testing import Fabric, HostileBot, uid
from brmcp.testing.hostile import (
    Behaviour,
    Die,
    HostileCall,
    HostileTool,
    KeyState,
    RefusalLoop,
    Reply,
    by_tool,
)
from brmcp.transport.router import RouterOptions
from tests.bridge.test_pools import POOL as HARNESS_POOL
from tests.bridge.test_pools import SIBLING, _members_known
from tests.bridge.test_pools import pool_env as harness_pool_env
from tests.kit import BOT, CLIENT, until
from tests.kit.bridge import NAME, TOKEN, bridge_stack, call, fixture_settings, joined

pytestmark = pytest.mark.anyio

START = 1_800_000_000
TTL = 4.0
RETRY = RetryPolicy(initial=0.5, minimum=0.5, maximum=1.0, answer_timeout=2.0)
PRICE = 500
POOL = "fortunes"
KEY = "ab" * 32
A, B, C = uid(60), uid(61), uid(62)
H1, H2 = uid(63), uid(64)
#: A dynamically priced tool charging 1 atom: its receipt tells the bridge
#: the balance without a payment.
WARM = HostileTool("warm", 1, listing="dynamic")
FREE = HostileTool("free", 0)


def tools(price: int = PRICE) -> list[HostileTool]:
    return [HostileTool("paid", price), FREE, WARM]


class PoolBot(HostileBot):
    """A :class:`HostileBot` whose tool list announces ``announce`` (a
    ``brmcp/pool`` object; None: none) and ``brmcp/receiptKey`` ``key``."""

    def __init__(
        self,
        fabric: Fabric,
        me: str,
        listed: Sequence[HostileTool],
        *,
        members: Sequence[str],
        key: str = KEY,
        pool_id: str = POOL,
        **options: Any,
    ) -> None:
        super().__init__(fabric, me, listed, **options)
        self.key = key
        self.announce: dict[str, Any] | None = {"id": pool_id, "members": list(members), "key": key}

    async def _on_list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        result = await super()._on_list_tools(ctx, params)
        meta = dict(result.meta or {})
        meta[RECEIPT_KEY_META] = self.key
        if self.announce is not None:
            meta[POOL_META_KEY] = self.announce
        return result.model_copy(update={"meta": meta})


class GatedBot(PoolBot):
    """A :class:`PoolBot` whose ``paid`` calls wait for :attr:`gate` (when
    set) before they are answered."""

    gate: anyio.Event | None = None

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        gate = self.gate
        if params.name == "paid" and gate is not None:
            self.waiting += 1
            await gate.wait()
        return await super()._on_call_tool(ctx, params)

    waiting = 0


def one_book(*bots: HostileBot, keys: bool = True) -> None:
    """Give ``bots`` the first one's ledger and, with ``keys``, its callKey
    record (a pool's shared book; without it each member keeps its own
    behaviour per call)."""
    for bot in bots[1:]:
        bot.ledger = bots[0].ledger
        if keys:
            bot._keys = bots[0]._keys


@dataclass(frozen=True, slots=True)
class StillRunning(Behaviour):
    """Every copy answered at once: the original still runs at another member."""

    def respond(self, bot: HostileBot, call: HostileCall, state: KeyState) -> Reply:
        text = f"{STILL_RUNNING_ELSEWHERE}; retry with the same callKey"
        return Reply(CallToolResult(content=[TextContent(type="text", text=text)], is_error=True))


class LedgerPayer:
    """Credits the ledger of the bot paid, as a confirmed tip; records every
    payment ``(payee, atoms)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.bots: dict[str, HostileBot] = {}

    async def pay(self, payee_uid: str, atoms: int) -> None:
        self.calls.append((payee_uid, atoms))
        await anyio.lowlevel.checkpoint()
        self.bots[payee_uid].ledger.credit(CLIENT, atoms)

    def to(self, *uids: str) -> int:
        return sum(atoms for payee, atoms in self.calls if payee in uids)


@dataclass
class PoolEnv:
    fabric: Fabric
    bridge: Bridge
    payer: LedgerPayer
    bots: dict[str, HostileBot]
    sent_to: list[str] = field(default_factory=list)

    @asynccontextmanager
    async def session(self, bot: str) -> AsyncIterator[ClientSession]:
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

    async def learn(self, home: str, count: int) -> None:
        """Call ``free`` at ``home`` until the bridge knows ``count`` members."""
        async with self.session(home) as session:
            result = await call(session, "free")
            assert not result.is_error, joined(result)
        await until(lambda: len(self.bridge.pools.members(home)) == count)

    def books(self) -> None:
        """Every payment made is in the spend log (paid) and was credited at
        the bot paid; no logical call paid more than PRICE or twice."""
        entries = [e for e in self.bridge.spend_log().entries if e.counts]
        assert sorted((e.bot, e.atoms) for e in entries) == sorted(self.payer.calls)
        assert all(e.status == "paid" for e in entries), entries
        per_call: dict[str | None, list[int]] = {}
        for e in entries:
            per_call.setdefault(e.call_key, []).append(e.atoms)
        assert all(len(v) == 1 and v[0] <= PRICE for v in per_call.values()), per_call
        ledgers = {id(bot.ledger): bot.ledger for bot in self.bots.values()}
        assert sum(ledger.credited for ledger in ledgers.values()) == sum(a for _, a in self.payer.calls)


@asynccontextmanager
async def pool_env(tmp_path: Path, bots: Sequence[HostileBot], fabric: Fabric) -> AsyncIterator[PoolEnv]:
    """A bridge at CLIENT allowing every bot in ``bots`` (on ``fabric``,
    not entered yet), failover after 0.5 s."""
    payer = LedgerPayer()
    payer.bots = {bot.uid: bot for bot in bots}
    settings = fixture_settings(allowed_bots=tuple(bot.uid for bot in bots))
    async with (
        bridge_stack(
            tmp_path,
            payer,
            bot=None,
            settings=settings,
            fabric=fabric,
            name=NAME,
            clock=ManualClock(START, auto=True),
            router_options=RouterOptions(ttl=TTL),
            retry=RETRY,
        ) as built,
        AsyncExitStack() as stack,
    ):
        for bot in bots:
            await stack.enter_async_context(bot)
        built.bridge.pools.failover_after = 0.5
        built.bridge.pools.still_running_pause = 0.2
        env = PoolEnv(built.fabric, built.bridge, payer, payer.bots)
        fabric.add_tap(lambda src, dst, text: env.sent_to.append(dst))
        yield env


async def prefer(env: PoolEnv, home: str, payee: str) -> None:
    """Call ``free`` at ``home`` until the pool's next payment ahead of need
    would go to ``payee``."""
    async with env.session(home) as session:
        for _ in range(4):
            funding = env.bridge.pools.funding(home)
            assert funding is not None
            if funding.bot == payee:
                return
            await call(session, "free")
    raise AssertionError(f"the pool of {home[:4]} never preferred {payee[:4]}")


# -- membership ---------------------------------------------------------------------


async def test_a_pair_claiming_the_pools_id_and_key_gets_nothing_for_the_pools_calls(tmp_path: Path) -> None:
    """H1 and H2 (allowed, listing each other) announce the id and key of
    the pool of A and B. They are a pool of their own, never the same one:
    calls at A's endpoint pay only A or B, and the balance H1 reports is
    not A's."""
    fabric = Fabric()
    a, b = (PoolBot(fabric, me, tools(), members=(A, B)) for me in (A, B))
    h1, h2 = (PoolBot(fabric, me, tools(), members=(H1, H2)) for me in (H1, H2))
    one_book(a, b)
    one_book(h1, h2)
    async with pool_env(tmp_path, [a, b, h1, h2], fabric) as env:
        await env.learn(H1, 2)
        async with env.session(H1) as session:
            result = await call(session, "paid")
            assert not result.is_error, joined(result)
        assert env.payer.to(H1, H2) == PRICE
        await env.learn(A, 2)
        assert {link.uid for link in env.bridge.pools.members(A)} == {A, B}
        async with env.session(A) as session:
            for _ in range(3):
                result = await call(session, "paid")
                assert not result.is_error, (joined(result), [(p[:4], a) for p, a in env.payer.calls])
        assert env.payer.to(H1, H2) == PRICE, [(p[:4], a) for p, a in env.payer.calls]
        assert env.payer.to(A, B) == 3 * PRICE
        assert env.bridge.pools.funding(A) is not env.bridge.pools.funding(H1)
        assert a.ledger.charged == 3 * PRICE
        balances = env.bridge.bot_balances()
        assert balances[A].atoms == balances[B].atoms == a.ledger.balance(CLIENT)
        assert balances[H1].atoms == balances[H2].atoms == h1.ledger.balance(CLIENT)
        env.books()


async def test_a_former_member_gets_nothing_for_the_pools_calls(tmp_path: Path) -> None:
    """A, B and C are a pool; A stops announcing it. The calls at B's
    endpoint then pay B or C only, never A."""
    fabric = Fabric()
    a, b, c = (PoolBot(fabric, me, tools(), members=(A, B, C)) for me in (A, B, C))
    one_book(a, b, c)
    async with pool_env(tmp_path, [a, b, c], fabric) as env:
        await env.learn(A, 3)
        async with env.session(A) as session:
            for _ in range(2):
                result = await call(session, "paid")
                assert not result.is_error, joined(result)
        home = env.bridge.pools.members(A)[0]
        a.announce = None
        assert home.doubt_tools()
        await home.refresh()
        assert home.pool is None
        await env.learn(B, 2)
        assert {link.uid for link in env.bridge.pools.members(B)} == {B, C}
        before = env.payer.to(A)
        async with env.session(B) as session:
            for _ in range(3):
                result = await call(session, "paid")
                assert not result.is_error, joined(result)
        assert env.payer.to(A) == before, env.payer.calls
        env.books()


async def test_a_member_that_leaves_the_pool_while_a_call_waits_on_it_is_not_paid(tmp_path: Path) -> None:
    """The call sits at B; B stops announcing the pool, then refuses it
    (claiming a balance of 0 on a book of its own now). B is paid nothing:
    the call is asked again of the pool's members (A alone), which runs it
    on the credit known."""
    fabric = Fabric()
    a = PoolBot(fabric, A, tools(), members=(A, B), opening={CLIENT: 501})
    b = GatedBot(fabric, B, tools(), members=(A, B), strategy=by_tool({"paid": RefusalLoop(balance_atoms=0)}))
    async with pool_env(tmp_path, [a, b], fabric) as env:
        await env.learn(A, 2)
        async with env.session(A) as session:
            await call(session, "warm")  # the balance is known: 500
        await prefer(env, A, B)
        b.gate = anyio.Event()
        sibling = next(link for link in env.bridge.pools.members(A) if link.uid == B)
        async with env.session(A) as session, anyio.create_task_group() as tg:
            results: list[CallToolResult] = []

            async def paid() -> None:
                results.append(await call(session, "paid"))

            tg.start_soon(paid)
            await until(lambda: b.waiting > 0)
            b.announce = None
            assert sibling.doubt_tools()
            await sibling.refresh()
            assert [link.uid for link in env.bridge.pools.members(A)] == [A]
            b.gate.set()
        (result,) = results
        assert not result.is_error, joined(result)
        assert [c.outcome for c in b.calls if c.tool == "paid"] == ["refused"]
        assert env.payer.calls == []
        assert a.ledger.charged == 1 + PRICE
        env.books()


# -- prices ---------------------------------------------------------------------------


@pytest.mark.parametrize("sibling_price", [9_000, 100])
async def test_a_sibling_listing_another_price_never_makes_a_call_pay_above_the_homes(
    tmp_path: Path, sibling_price: int
) -> None:
    """B lists ``paid`` at another price than A. A call at A's endpoint was
    shown A's price: nothing paid for it (alongside, or answering B's
    refusal) exceeds it, whichever member is preferred."""
    fabric = Fabric()
    a = PoolBot(fabric, A, tools(), members=(A, B))
    b = PoolBot(fabric, B, tools(sibling_price), members=(A, B))
    one_book(a, b)
    async with pool_env(tmp_path, [a, b], fabric) as env:
        await env.learn(A, 2)
        await prefer(env, A, B)
        async with env.session(A) as session:
            await call(session, "paid")
            await call(session, "paid")
        assert all(atoms <= PRICE for _, atoms in env.payer.calls), env.payer.calls
        env.books()


# -- answers --------------------------------------------------------------------------


async def test_a_member_saying_still_running_forever_ends_at_the_deadline_paying_nothing_more(
    tmp_path: Path,
) -> None:
    """A never answers (it ran nothing), B answers at once, for ever, that
    the original still runs elsewhere: the agent gets the deadline error,
    at most one payment (made alongside before any answer) was made, and
    B was asked about once per pause, not in a tight loop."""
    fabric = Fabric()
    a = PoolBot(fabric, A, tools(), members=(A, B), strategy=by_tool({"paid": Die()}))
    b = PoolBot(fabric, B, tools(), members=(A, B), strategy=by_tool({"paid": StillRunning()}))
    async with pool_env(tmp_path, [a, b], fabric) as env:
        await env.learn(A, 2)
        await prefer(env, A, A)
        async with env.session(A) as session:
            with pytest.raises(Exception) as caught:
                await call(session, "paid")
        assert "no reply" in str(caught.value) or "deadline" in str(caught.value), caught.value
        assert len(env.payer.calls) <= 1
        assert env.payer.to(A, B) <= PRICE
        asked = [c for c in b.calls if c.tool == "paid"]
        assert 1 <= len(asked) <= TTL / env.bridge.pools.still_running_pause + 2, len(asked)
        assert not a.ledger.charged
        assert not b.ledger.charged
        env.books()


async def test_a_member_refusing_while_its_sibling_runs_the_call_is_paid_once(tmp_path: Path) -> None:
    """A charges the call and takes long; B refuses every copy (lying that
    the balance is 0). The call pays at most once, at most its price, and A
    charged it at most once."""
    fabric = Fabric()
    a = PoolBot(
        fabric,
        A,
        tools(),
        members=(A, B),
        strategy=by_tool({"paid": Die(after_charge=True, times=1)}),
        opening={CLIENT: 501},
    )
    b = PoolBot(fabric, B, tools(), members=(A, B), strategy=by_tool({"paid": RefusalLoop(balance_atoms=0)}))
    b.ledger = a.ledger
    async with pool_env(tmp_path, [a, b], fabric) as env:
        await env.learn(A, 2)
        async with env.session(A) as session:
            await call(session, "warm")
            result = await call(session, "paid")
        assert len(env.payer.calls) <= 1
        assert env.payer.to(A, B) <= PRICE
        assert a.ledger.charged <= 1 + PRICE
        if env.payer.calls:
            assert "paid" in joined(result)
        env.books()


async def test_failover_during_a_payment_alongside_runs_and_charges_the_call_once(tmp_path: Path) -> None:
    """The first paid call goes out marked while its payment is under way;
    the member it went to never answers, its sibling answers the same
    request: one payment, one charge, one result."""
    fabric = Fabric()
    a = PoolBot(fabric, A, tools(), members=(A, B), strategy=by_tool({"paid": Die()}))
    b = PoolBot(fabric, B, tools(), members=(A, B))
    one_book(a, b, keys=False)
    async with pool_env(tmp_path, [a, b], fabric) as env:
        await env.learn(A, 2)
        await prefer(env, A, A)
        async with env.session(A) as session:
            result = await call(session, "paid")
        assert not result.is_error, joined(result)
        marked = [c for bot in (a, b) for c in bot.calls if c.tool == "paid" and c.pay_alongside]
        assert marked
        assert all(c.call_key == marked[0].call_key for c in marked)
        assert len(env.payer.calls) == 1
        assert env.payer.to(A, B) == PRICE
        assert a.ledger.charged == PRICE
        assert env.bridge.pools.failovers >= 1
        env.books()


async def test_concurrent_calls_at_two_endpoints_of_one_pool_pay_one_shortfall_at_a_time(
    tmp_path: Path,
) -> None:
    """Six calls at once at A's and B's endpoints, on one known balance of
    0: one Funding for the pool; each call paid at most once and at most
    its price; each ran once; the books exact."""
    fabric = Fabric()
    a, b = (PoolBot(fabric, me, tools(), members=(A, B), opening={CLIENT: 1}) for me in (A, B))
    one_book(a, b)
    async with pool_env(tmp_path, [a, b], fabric) as env:
        await env.learn(A, 2)
        await env.learn(B, 2)
        assert env.bridge.pools.funding(A) is env.bridge.pools.funding(B)
        answers: list[CallToolResult] = []
        async with env.session(A) as at_a, env.session(B) as at_b:
            await call(at_a, "warm")  # the balance is known: 0

            async def one(session: ClientSession, i: int) -> None:
                answers.append(await call(session, "paid", {"i": i}))

            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(one, at_a if i % 2 else at_b, i)
        assert len(answers) == 6
        ok = [r for r in answers if not r.is_error]
        assert a.ledger.charged == 1 + PRICE * len(ok)
        assert len(env.payer.calls) <= 6
        env.books()


# -- de-listing -----------------------------------------------------------------------


async def test_a_member_de_listed_while_a_call_waits_on_it_gets_nothing_more(tmp_path: Path) -> None:
    """A call sits at B (which never answers); B is removed from the
    allowed bots: no PM goes to B from then on, nothing is paid to it, and
    A answers the later calls."""
    fabric = Fabric()
    a = PoolBot(fabric, A, tools(), members=(A, B))
    b = PoolBot(fabric, B, tools(), members=(A, B), strategy=by_tool({"paid": Die()}))
    one_book(a, b, keys=False)
    async with pool_env(tmp_path, [a, b], fabric) as env:
        await env.learn(A, 2)
        await prefer(env, A, B)
        env.bridge.pools.failover_after = 30.0
        async with env.session(A) as session, anyio.create_task_group() as tg:
            results: list[CallToolResult | BaseException] = []

            async def first() -> None:
                try:
                    results.append(await call(session, "paid"))
                except Exception as exc:
                    results.append(exc)

            tg.start_soon(first)
            await until(lambda: any(c.tool == "paid" for c in b.calls))
            # The payment made alongside (to B, preferred) was decided before
            # the de-listing: let it finish.
            await until(lambda: all(e.status != "pending" for e in env.bridge.spend_log().entries))
            paid_to_b = env.payer.to(B)
            # Nothing more is paid to B (its entries' answered mark may change:
            # the call they paid for is answered meanwhile).
            entries_to_b = [
                dataclasses.replace(e, answered=False) for e in env.bridge.spend_log().entries if e.bot == B
            ]
            await env.bridge.apply_settings(env.bridge.settings.replace(allowed_bots=(A,)))
            seen = len([d for d in env.sent_to if d == B])
            await until(lambda: bool(results))
            for _ in range(2):
                result = await call(session, "paid")
                assert not result.is_error, joined(result)
        assert len([d for d in env.sent_to if d == B]) == seen
        assert env.payer.to(B) == paid_to_b
        assert [
            dataclasses.replace(e, answered=False) for e in env.bridge.spend_log().entries if e.bot == B
        ] == entries_to_b
        assert [link.uid for link in env.bridge.pools.members(A)] == [A]
        env.books()


# -- harness members on PostgreSQL ------------------------------------------------------


async def test_a_pair_claiming_a_harness_pools_id_and_key_is_never_paid_for_its_calls(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two brmcp harness members on one PostgreSQL book are a pool; two
    allowed hostile bots announce its id and its (public) key, listing each
    other, and are called first. The pool's calls then pay only its
    members, each call once, and its books come out exact."""
    async with (
        harness_pool_env(tmp_path, postgres_url, allowed=(BOT, SIBLING, H1, H2)) as env,
        env.session() as session,
        AsyncExitStack() as stack,
    ):
        await call(session, "free")
        await _members_known(env, 2)
        key = env.bridge.pools.members(BOT)[0].receipt_key
        assert key is not None
        h1, h2 = (
            PoolBot(env.fabric, me, tools(), members=(H1, H2), key=key, pool_id=HARNESS_POOL)
            for me in (H1, H2)
        )
        one_book(h1, h2)
        for bot in (h1, h2):
            await stack.enter_async_context(bot)
        original = env.payer.pay

        async def pay(payee_uid: str, atoms: int) -> None:
            if payee_uid in (H1, H2):
                env.payer.calls.append((payee_uid, atoms))
                await anyio.lowlevel.checkpoint()
                (h1 if payee_uid == H1 else h2).ledger.credit(CLIENT, atoms)
                return
            await original(payee_uid, atoms)

        env.payer.pay = pay  # type: ignore[method-assign]
        address = env.bridge.listen_address
        assert address is not None
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
            streamable_http_client(f"http://{address[0]}:{address[1]}/mcp/{H1}", http_client=http) as (r, w),
            ClientSession(r, w) as at_h1,
        ):
            await at_h1.initialize()
            await call(at_h1, "free")
            await until(lambda: len(env.bridge.pools.members(H1)) == 2)
            result = await call(at_h1, "paid")
            assert not result.is_error, joined(result)
        hostile = [(p, a) for p, a in env.payer.calls if p in (H1, H2)]
        assert sum(a for _, a in hostile) == PRICE
        for i in range(4):
            result = await call(session, "paid", {"i": i})
            assert not result.is_error, joined(result)
        assert [(p, a) for p, a in env.payer.calls if p in (H1, H2)] == hostile
        assert sum(len(m.runs) for m in env.members.values()) == 4
        env.payer.calls = [(p, a) for p, a in env.payer.calls if p not in (H1, H2)]
        await env.books()
        balances = env.bridge.bot_balances()
        book = await env.members[BOT].harness.balance(CLIENT)
        assert balances[BOT].atoms == balances[SIBLING].atoms == book
