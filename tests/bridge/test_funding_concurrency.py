"""Concurrent first paid calls through one bridge (BRIDGE.md §Pay alongside
and prepay, "One payment to a bot at a time"; brmcp/bridge/pay/_funding.py).

While the bridge does not know the caller's balance at a bot, or a payment
to that bot is in flight, at most one call pays; the others wait for its
answer and decide with the credit it reports. Measured on a real
relay before the rule: 8 agents' first calls, with credit already at the
bot that the bridge did not know of, paid alongside 8 times.

The K calls of each test are started in the same instant straight into the
bot's mirror server (:meth:`BotProxy.call`, as the HTTP layer calls it for
each agent), so they all decide before any payment is under way: the worst
case for the rule. Bots: the fixture harness (holds marked calls), the same
with holding off, and a bot that answers as the Go reference does
(``payment_required`` at once, no receipts). Waits are on conditions the
code under test makes true (:func:`until`); the bridge clock is the kit's
:class:`ManualClock`.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from brmcp.bridge import Bridge, ManualClock
from brmcp.bridge.agent import BotProxy
from brmcp.bridge.pay import Funding
from brmcp.protocol.payment import parse_receipt
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric
from brmcp.testing.hostile import Behaviour, HostileBot, HostileCall, HostileTool, KeyState, Reply
from brmcp.transport.router import RouterOptions
from tests.kit import BOT, CLIENT, until
from tests.kit.bridge import NAME, PAID_SCHEMA, START, TestPayer, bridge_stack, fixture_settings

PRICE = 500
#: The credit the measured caller had at the bot, tipped directly.
CREDIT = 1_440_000

#: ``harness``: the fixture harness, holding a marked call until its tip lands;
#: ``no-hold``: the same with holding off (a marked call is refused at once);
#: ``go``: answers as the Go reference does (refused at once, no receipts).
Kind = Literal["harness", "no-hold", "go"]
KINDS: tuple[Kind, ...] = ("harness", "no-hold", "go")


@dataclass(frozen=True, slots=True)
class GoReference(Behaviour):
    """The Go reference's answers: the mark is not known, a call is charged
    at once without a receipt (WIRE.md §Receipts), or refused at once."""

    def respond(self, bot: HostileBot, call: HostileCall, state: KeyState) -> Reply:
        price = bot.tools[call.tool].price_atoms
        if state.outcome is None and bot.ledger.debit(call.peer, price):
            state.outcome = bot.success(call)
        if state.outcome is not None:
            return Reply(state.outcome)
        return Reply(bot.refusal(call.tool, price, bot.ledger.balance(call.peer)))


@dataclass
class Stack:
    """A bot of one :data:`Kind` selling ``paid`` at ``price``, a bridge,
    and the bridge's mirror server of the bot (``proxy``)."""

    kind: Kind
    price: int
    bridge: Bridge
    proxy: BotProxy
    payer: TestPayer
    harness: Harness | None = None
    bot: HostileBot | None = None
    executions: dict[str, int] = field(default_factory=dict)

    @property
    def funding(self) -> Funding:
        funding = self.proxy.funding
        assert funding is not None
        return funding

    @property
    def tips(self) -> list[int]:
        """The atoms of every tip the wallet was asked for."""
        return [atoms for _, atoms in self.payer.calls]

    @property
    def ran(self) -> int:
        """Executions of ``paid`` at the bot."""
        if self.bot is not None:
            return sum(1 for kind, _, _ in self.bot.ledger.entries if kind == "debit")
        return self.executions.get("paid", 0)

    async def balance(self) -> int:
        """The caller's balance at the bot, as the bot's books say."""
        if self.bot is not None:
            return self.bot.ledger.balance(CLIENT)
        assert self.harness is not None
        return await self.harness.balance(CLIENT)

    @property
    def holds(self) -> int:
        """Calls the harness held at least once for a payment alongside."""
        assert self.harness is not None
        return self.harness.holds

    def held_now(self) -> int:
        """Calls the harness holds right now for a payment alongside."""
        assert self.harness is not None
        return len(self.harness._pipeline.held._held.get(CLIENT, []))

    def spend(self) -> list[tuple[str, int]]:
        return [(e.status, e.atoms) for e in self.bridge.spend_log().entries]

    async def settled(self) -> None:
        """Until no payment is under way (nor pending in the spend log)."""
        await until(
            lambda: not self.funding.round_open and all(status != "pending" for status, _ in self.spend())
        )


@asynccontextmanager
async def stack(
    tmp_path: Path,
    kind: Kind = "harness",
    *,
    price: int = PRICE,
    credit: int = 0,
    paid_before: bool = False,
    ttl: float | None = None,
    prepay: bool = False,
) -> AsyncIterator[Stack]:
    """The bot (``credit`` atoms of the caller's already there, unknown to
    the bridge), and a bridge that has paid this bot before
    (``paid_before``: its balance is unknown after a restart) or never.
    ``ttl``: the message TTL, which is each call's deadline; ``prepay``: the
    bot is on ``prepay_bots``."""
    data_dir = tmp_path / "bridge"
    data_dir.mkdir(parents=True, exist_ok=True)
    if paid_before:
        entry = {"ts": START - 2 * 86_400, "bot": BOT, "tool": "paid", "rail": "tip", "atoms": price}
        (data_dir / "mcpspend.json").write_text(json.dumps([{**entry, "status": "paid"}]))
    payer = TestPayer()
    executions: dict[str, int] = {}
    harness: Harness | None = None
    bot: HostileBot | None = None
    fabric = Fabric()
    served: Harness | HostileBot
    if kind == "go":
        served = bot = HostileBot(
            fabric,
            BOT,
            [HostileTool("paid", price)],
            strategy=GoReference(),
            opening={CLIENT: credit} if credit else None,
        )
        payer.behaviour = bot.tip_from(CLIENT)
    else:
        served = harness = Harness(
            HarnessConfig(
                data_dir=tmp_path / "bot",
                allowed_peers={CLIENT},
                calls_per_minute=100_000,
                name="fixture-bot",
                hold_seconds=30.0 if kind == "harness" else 0.0,
                max_held_calls=4,
            )
        )

        async def paid(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
            executions["paid"] = executions.get("paid", 0) + 1
            return {"n": executions["paid"]}

        harness.add_tool("paid", paid, description="A paid tool", input_schema=PAID_SCHEMA, price_atoms=price)
        payer.harness = harness
    settings_ = fixture_settings(
        per_call_cap_atoms=max(price, 10_000),
        per_day_cap_atoms=10**12,
        prepay_bots=(BOT,) if prepay else None,
    )
    options = RouterOptions() if ttl is None else RouterOptions(ttl=ttl)
    clock = ManualClock(START, auto=True)
    async with bridge_stack(
        tmp_path,
        payer,
        bot=served,
        settings=settings_,
        fabric=fabric,
        listen=None,
        name=NAME,
        clock=clock,
        router_options=options,
    ) as built:
        if harness is not None and credit:
            await harness.credit(CLIENT, credit)
        proxy = built.bridge._proxy(BOT)
        await proxy.link.refresh()
        yield Stack(kind, price, built.bridge, proxy, payer, harness, bot, executions)


async def at_once(env: Stack, k: int) -> list[CallToolResult]:
    """``k`` calls of ``paid`` started in the same instant."""
    results: list[CallToolResult] = []

    async def one(i: int) -> None:
        results.append(await env.proxy.call("paid", {"text": f"call {i}"}))

    async with anyio.create_task_group() as tg:
        for i in range(k):
            tg.start_soon(one, i)
    return results


def check_answered_and_charged_once(env: Stack, results: list[CallToolResult], k: int) -> None:
    """Every call answered once and charged once (a receipt of the price
    where the bot gives receipts), and the bot ran the tool k times."""
    assert len(results) == k
    for result in results:
        assert not result.is_error, result.content
        if env.kind != "go":
            receipt = parse_receipt(result.meta)
            assert receipt is not None
            assert receipt.charged_atoms == env.price
    if env.kind != "go":
        assert sorted(r.structured_content["n"] for r in results if r.structured_content) == list(
            range(1, k + 1)
        )
    assert env.ran == k


async def check_books(env: Stack, credit: int, charges: int) -> int:
    """To the atom: the credit there before plus the tips credited equals
    the charges plus the balance left. Returns that balance."""
    await env.settled()
    balance = await env.balance()
    assert credit + sum(env.tips) == charges * env.price + balance, (credit, env.tips, charges, balance)
    assert all(status == "paid" for status, _ in env.spend())
    return balance


# -- credit already at the bot ---------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [8, 16])
@pytest.mark.parametrize(("paid_before", "tips"), [(False, 1), (True, 0)], ids=["never-paid", "paid-before"])
async def test_credit_unknown_to_the_bridge_costs_at_most_one_tip(
    tmp_path: Path, kind: Kind, k: int, paid_before: bool, tips: int
) -> None:
    """K first calls at once, with credit at the bot the bridge does not know
    of. A bridge that never paid this bot counts the unknown balance as
    empty: exactly one call pays alongside (1 tip, which stays at the bot as
    credit); its answer (a receipt, or for the Go reference a result and a
    confirmed payment) tells the others, which go out unmarked and are
    charged from the credit. A bridge that paid this bot before (a restart)
    sends every call unmarked: 0 tips."""
    with anyio.fail_after(60):
        async with stack(tmp_path, kind, credit=CREDIT, paid_before=paid_before) as env:
            results = await at_once(env, k)
            check_answered_and_charged_once(env, results, k)
            assert env.tips == [PRICE] * tips
            assert env.funding.started == tips
            balance = await check_books(env, CREDIT, k)
            assert balance == CREDIT - k * PRICE + tips * PRICE
            assert env.funding.waiting == 0
            assert env.funding.reserved == 0


# -- no credit at the bot ---------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [8, 16])
async def test_no_credit_each_call_pays_its_own_price_once(tmp_path: Path, kind: Kind, k: int) -> None:
    """K first calls at once, nothing at the bot: one at a time pays
    alongside; each answer (a receipt of 0 left, or the refusal's balance
    and the payment confirmed) tells the next that it must pay. K tips of
    the price, exactly what the calls need; no call pays twice."""
    with anyio.fail_after(60):
        async with stack(tmp_path, kind) as env:
            results = await at_once(env, k)
            check_answered_and_charged_once(env, results, k)
            assert env.tips == [PRICE] * k
            assert await check_books(env, 0, k) == 0
            assert env.funding.reserved == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("paid_before", [False, True], ids=["never-paid", "paid-before"])
async def test_part_of_what_the_calls_need_is_there(tmp_path: Path, kind: Kind, paid_before: bool) -> None:
    """3.5 prices at the bot for 8 calls: the tips make up the 4.5 prices
    missing, give or take one call's shortfall. After a restart the calls
    go unmarked and five of them are refused at once, all reading the same
    balance (half a price): one pays what that balance leaves short, the
    others a price each, one at a time, so none is refused again having
    paid."""
    credit = 7 * PRICE // 2
    with anyio.fail_after(60):
        async with stack(tmp_path, kind, credit=credit, paid_before=paid_before) as env:
            results = await at_once(env, 8)
            check_answered_and_charged_once(env, results, 8)
            assert 8 * PRICE - credit <= sum(env.tips) <= 8 * PRICE - credit + PRICE
            await check_books(env, credit, 8)


# -- the paying call fails or goes away ----------------------------------------------


async def test_the_paying_call_given_up_mid_payment_hands_over(tmp_path: Path) -> None:
    """The call paying alongside is held by the bot for its tip; its agent
    gives up (the call is cancelled) while the tip is under way. The waiting
    calls do not pay for that shortfall again: once the tip is confirmed its
    credit is theirs, one of them is charged from it, and the others pay one
    at a time. Four calls, three answered, three tips."""
    tip_may_land = anyio.Event()
    with anyio.fail_after(60):
        async with stack(tmp_path) as env:

            async def slow_tip(payee: str, atoms: int) -> None:
                await tip_may_land.wait()
                await env.payer.credit(payee, atoms)

            env.payer.behaviour = slow_tip
            scopes: dict[int, anyio.CancelScope] = {}
            results: dict[int, CallToolResult] = {}

            async def one(i: int) -> None:
                with anyio.CancelScope() as scope:
                    scopes[i] = scope
                    results[i] = await env.proxy.call("paid", {"text": f"call {i}"})

            try:
                async with anyio.create_task_group() as tg:
                    for i in range(4):
                        tg.start_soon(one, i)
                    # One call pays alongside and is held by the bot; three wait.
                    await until(lambda: env.holds == 1 and env.funding.waiting == 3 and len(env.tips) == 1)
                    # The paying call is the first started (the first to decide).
                    scopes[0].cancel()
                    # Withdrawn: the bot drops the held call, nothing charged.
                    await until(lambda: env.held_now() == 0)
                    assert env.funding.waiting == 3  # no second tip for that shortfall
                    assert len(env.payer.calls) == 1
                    tip_may_land.set()
            finally:
                tip_may_land.set()
            assert sorted(results) == [1, 2, 3]
            check_answered_and_charged_once(env, list(results.values()), 3)
            assert env.tips == [PRICE] * 3
            assert await check_books(env, 0, 3) == 0


async def test_a_failed_payment_hands_over_to_a_waiter(tmp_path: Path) -> None:
    """The payment made alongside fails (no route): that call ends with the
    payment's note, and a waiting call takes over and pays for itself."""
    fail_now = anyio.Event()
    with anyio.fail_after(60):
        async with stack(tmp_path) as env:
            first = True

            async def tip(payee: str, atoms: int) -> None:
                nonlocal first
                if first:
                    first = False
                    await fail_now.wait()
                    raise RuntimeError("no route to bot")
                await env.payer.credit(payee, atoms)

            env.payer.behaviour = tip
            results: list[CallToolResult] = []
            try:
                async with anyio.create_task_group() as tg:
                    for i in range(4):
                        tg.start_soon(_append, results, env.proxy.call("paid", {"text": f"call {i}"}))
                    await until(lambda: env.holds == 1 and env.funding.waiting == 3)
                    fail_now.set()
            finally:
                fail_now.set()
            failed = [r for r in results if r.is_error]
            assert len(failed) == 1
            assert failed[0].content[-1].text == "brclientd: payment not made: no route to bot"  # type: ignore[union-attr]
            check_answered_and_charged_once(env, [r for r in results if not r.is_error], 3)
            assert env.tips == [PRICE] * 4  # the failed one, then one per answered call
            assert [s for s, _ in env.spend()].count("failed") == 1
            await env.settled()
            assert await env.balance() == 0


async def test_a_waiting_call_keeps_its_deadline_and_its_cancellation(tmp_path: Path) -> None:
    """While one call's tip is under way (the bot holds that call), a waiting
    call whose agent gives up stops at once, and one that waits past its
    own deadline ends with an error saying nothing was paid; neither pays.
    The paying call reaches its deadline too; its one tip, once it lands,
    pays for that call if the bot still held it, else stays at the bot."""
    tip_may_land = anyio.Event()
    with anyio.fail_after(60):
        async with stack(tmp_path, ttl=3.0) as env:

            async def slow_tip(payee: str, atoms: int) -> None:
                await tip_may_land.wait()
                await env.payer.credit(payee, atoms)

            env.payer.behaviour = slow_tip
            errors: list[str] = []
            impatient = anyio.CancelScope()

            async def paying() -> None:
                with pytest.raises(MCPError, match="no reply from bot"):
                    await env.proxy.call("paid", {"text": "pays"})

            async def waiting() -> None:
                try:
                    await env.proxy.call("paid", {"text": "waits"})
                except MCPError as exc:
                    errors.append(exc.error.message)

            async def gives_up() -> None:
                with impatient:
                    await env.proxy.call("paid", {"text": "gives up"})

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(paying)
                    await until(lambda: env.holds == 1)
                    tg.start_soon(waiting)
                    tg.start_soon(gives_up)
                    await until(lambda: env.funding.waiting == 2)
                    impatient.cancel()
                    await until(lambda: env.funding.waiting == 1)
                    # The paying call and the waiting one reach their deadlines.
                assert impatient.cancelled_caught
                assert errors == [
                    "the call's deadline passed while it waited for the answer to another call's payment "
                    f"to bot {BOT[:8]}; nothing was paid for this call"
                ]
                assert len(env.payer.calls) == 1
            finally:
                tip_may_land.set()
            await env.settled()
            await until(lambda: env.held_now() == 0)
            # The held call ran when its tip landed (or had been dropped, and
            # the credit stays at the bot); the others never ran.
            assert env.ran in (0, 1)
            assert await check_books(env, 0, env.ran) == (1 - env.ran) * PRICE


@pytest.mark.parametrize("kind", ["harness", "no-hold"])
@pytest.mark.paced  # the flood/funding timing it bounds is the paced one
async def test_calls_arriving_while_a_prepayment_is_under_way(tmp_path: Path, kind: Kind) -> None:
    """Prepay on: the first call's receipt leaves nothing, so a prepayment
    starts, and its tip is slow. Eight calls arrive meanwhile: the
    prepayment covers one, which waits for it; the others wait for it too
    and then pay one at a time. Every call answered and charged once; one
    tip per call, plus at most the last prepayment, which stays at the bot."""
    tip_may_land = anyio.Event()
    with anyio.fail_after(60):
        async with stack(tmp_path, kind, prepay=True) as env:

            async def tip(payee: str, atoms: int) -> None:
                if len(env.payer.calls) == 2:  # the prepayment after the first call
                    await tip_may_land.wait()
                await env.payer.credit(payee, atoms)

            env.payer.behaviour = tip
            try:
                first = await env.proxy.call("paid", {"text": "first"})
                assert not first.is_error
                await until(lambda: len(env.payer.calls) == 2)
                results: list[CallToolResult] = []
                async with anyio.create_task_group() as tg:
                    for i in range(8):
                        tg.start_soon(_append, results, env.proxy.call("paid", {"text": f"call {i}"}))
                    # One is marked with the prepayment; seven wait for it.
                    await until(
                        lambda: env.funding.waiting == 7,
                        state=lambda: f"{env.funding.waiting} calls wait, tips {env.payer.calls}",
                    )
                    assert len(env.payer.calls) == 2
                    tip_may_land.set()
            finally:
                tip_may_land.set()
            check_answered_and_charged_once(env, [first, *results], 9)
            balance = await check_books(env, 0, 9)
            assert balance <= PRICE
            assert len(env.tips) == 9 + balance // PRICE


# -- the property ----------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    kind: Kind
    k: int
    price: int
    credit: int
    paid_before: bool


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    k = draw(st.integers(1, 16))
    price = draw(st.sampled_from([1, 7, 500, 9_999]) | st.integers(1, 10_000))
    credit = draw(st.sampled_from([0, k * price, price - 1 if price > 1 else 0]) | st.integers(0, k * price))
    return Plan(
        kind=draw(st.sampled_from(KINDS)),
        k=k,
        price=price,
        credit=min(credit, k * price),
        paid_before=draw(st.booleans()),
    )


async def _run(plan: Plan) -> None:
    with tempfile.TemporaryDirectory() as tmp, anyio.fail_after(60):
        async with stack(
            Path(tmp), plan.kind, price=plan.price, credit=plan.credit, paid_before=plan.paid_before
        ) as env:
            results = await at_once(env, plan.k)
            check_answered_and_charged_once(env, results, plan.k)
            need = max(0, plan.k * plan.price - plan.credit)
            # At most one shortfall beyond what the calls needed (the first
            # call pays alongside an unknown balance it counts as empty).
            assert need <= sum(env.tips) <= need + plan.price, (plan, env.tips)
            await check_books(env, plan.credit, plan.k)


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=plans())
def test_tips_never_exceed_the_need_by_more_than_one_shortfall(plan: Plan) -> None:
    """K first calls at once (1..16) with an unknown credit (0..K*price) at a
    bot of any kind, from a bridge that never paid it or one restarted:
    every call answered and charged once, the atoms that left the wallet
    ≤ max(0, K*price - credit) + one call's shortfall, and the bot's books
    exact to the atom (credit + tips = charges + balance)."""
    anyio.run(_run, plan)


async def _append(results: list[CallToolResult], pending: Awaitable[CallToolResult]) -> None:
    results.append(await pending)
