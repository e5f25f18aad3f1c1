"""The bridge's spending policy is a hard bound, whatever a bot sends
(BRIDGE.md §The payment flow, §Pay alongside and prepay, §Failures; WIRE.md
§Payments): one scenario per attack of :mod:`brmcp.testing.hostile`.

For every logical agent call (reissues, polls and re-sent copies included):
atoms paid ≤ min(per-call cap, the price the agent was shown in tools/list)
(a dynamic price: the cap alone), at most one payment in autopay mode (more
only when the user approved each one), the rolling day total ≤ the day
cap; a tool shown as free is never paid for; nothing in a tool's output
makes the bridge pay; a refusal for another tool or above the shown price
is not paid, and the call ends with an error naming both prices; a result
or error after which atoms moved says so. After each scenario the books
agree to the atom: the payer's payments == the spend log's paid + pending
== what the bot's ledger was credited.

Bridge: autopay, per-call cap 10 000, day cap 100 000 (bridge_support's
fixture settings), the clock a ManualClock in auto mode; requests to the bot
have a 4 s deadline and are re-sent after 0.5 s.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, PaginatedRequestParams, TextContent, Tool

from brmcp.bridge import Bridge, ManualClock, RetryPolicy, Settings
from brmcp.protocol.payment import PRICE_ATOMS_KEY, PRICING_DYNAMIC, PRICING_KEY, parse_payment_required
from brmcp.testing import Fabric, HostileBot
from brmcp.testing.hostile import (
    Behaviour,
    Die,
    Flood,
    ForgedRefusal,
    Honest,
    HostileTool,
    LyingReceipt,
    OtherToolRefusal,
    PriceSwitch,
    RefusalLoop,
    ReplayRefusal,
    Strategy,
    WrongId,
    by_tool,
    scripted,
)
from brmcp.transport.router import RouterOptions
from tests.kit.bridge import BOT, CLIENT, NAME, TOKEN, TestPayer, bridge_stack, call, fixture_settings, until

START = 1_800_000_000
#: Seconds a request to the bot may go unanswered (the router's message TTL).
TTL = 4.0
RETRY = RetryPolicy(initial=0.5, minimum=0.5, maximum=1.0, answer_timeout=2.0)
CAP = 10_000
DAY_CAP = 100_000
#: A dynamically priced tool the bot charges 1 atom for: calling it lets the
#: bridge learn the balance from its receipt without paying anything.
WARM = HostileTool("warm", 1, listing="dynamic")


@dataclass
class HostileEnv:
    fabric: Fabric
    bot: HostileBot
    bridge: Bridge
    payer: TestPayer
    clock: ManualClock

    @property
    def url(self) -> str:
        address = self.bridge.listen_address
        assert address is not None
        return f"http://{address[0]}:{address[1]}/mcp/{BOT}"

    @asynccontextmanager
    async def session(self) -> AsyncIterator[ClientSession]:
        """An initialized SDK agent session through the bridge's listener."""
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http,
            streamable_http_client(self.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@asynccontextmanager
async def hostile_env(
    tmp_path: Path,
    tools: Sequence[HostileTool],
    strategy: Behaviour | Strategy,
    *,
    settings: Settings | None = None,
    opening: dict[str, int] | None = None,
    **bot_options: Any,
) -> AsyncIterator[HostileEnv]:
    """Fabric, a :class:`HostileBot` at BOT (``bot_options``: its keyword
    arguments) and a bridge at CLIENT whose payer credits the bot's ledger."""
    clock = ManualClock(START, auto=True)
    fabric = Fabric()
    bot = HostileBot(fabric, BOT, tools, strategy=strategy, opening=opening, **bot_options)
    payer = TestPayer()
    payer.behaviour = bot.tip_from(CLIENT)
    async with bridge_stack(
        tmp_path,
        payer,
        bot=bot,
        settings=settings or fixture_settings(),
        fabric=fabric,
        name=NAME,
        clock=clock,
        router_options=RouterOptions(ttl=TTL),
        retry=RETRY,
    ) as built:
        yield HostileEnv(built.fabric, bot, built.bridge, payer, clock)


# -- what the agent sees -------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """What one agent tools/call got: the result's texts (or the JSON-RPC
    error's message) joined, whether it was an error, and ``note``: the
    texts other than a payment_required object (what the bridge says, not
    the bot's refusal it passes on)."""

    text: str
    is_error: bool
    result: CallToolResult | None
    note: str = ""

    @property
    def tells_payment(self) -> bool:
        """The text says what was paid, charged or refunded (loosely)."""
        return re.search(r"\b(paid|atoms|charged|refunded)\b", self.text, re.IGNORECASE) is not None

    def names(self, atoms: int) -> bool:
        """The note names the amount ``atoms`` (``9000``, ``9,000`` or ``9_000``)."""
        forms = {str(atoms), f"{atoms:,}", f"{atoms:_}"}
        return any(
            re.search(rf"(?<![\d_])(?<!\d[.,]){re.escape(f)}(?![\d_]|[.,]\d)", self.note) for f in forms
        )


def _is_refusal_text(text: str) -> bool:
    probe = CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
    return parse_payment_required(probe) is not None


async def ask(session: ClientSession, tool: str, arguments: dict[str, Any] | None = None) -> Answer:
    """One agent tools/call, its result or JSON-RPC error as an :class:`Answer`."""
    try:
        result = await call(session, tool, arguments)
    except MCPError as exc:
        return Answer(exc.error.message, True, None, exc.error.message)
    items = [c.text for c in result.content if isinstance(c, TextContent)]
    note = "\n".join(t for t in items if not _is_refusal_text(t))
    return Answer("\n".join(items), bool(result.is_error), result, note)


async def shown(session: ClientSession) -> dict[str, Tool]:
    """The tools the agent is shown, by name (every page)."""
    tools: dict[str, Tool] = {}
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.update({t.name: t for t in page.tools})
        cursor = page.next_cursor
        if not cursor:
            return tools


def bound_of(tool: Tool | None, cap: int) -> int:
    """The most one logical call of ``tool`` may pay: min(cap, the shown
    ``brmcp/priceAtoms``); the cap for a dynamic price; 0 for a tool shown
    without a price or not shown at all (WIRE.md §Payments, "Prices")."""
    meta = tool.meta if tool is not None else None
    if not isinstance(meta, dict):
        return 0
    price = meta.get(PRICE_ATOMS_KEY)
    if isinstance(price, int | float) and not isinstance(price, bool) and float(price).is_integer():
        return max(0, min(cap, int(price)))
    if meta.get(PRICING_KEY) == PRICING_DYNAMIC:
        return max(0, cap)
    return 0


# -- the books ---------------------------------------------------------------------------


def _quiet(env: HostileEnv) -> bool:
    entries = env.bridge.spend_log().entries
    return len(entries) == len(env.payer.calls) and all(e.status != "pending" for e in entries)


async def quiet(env: HostileEnv) -> None:
    """Wait until no payment is in flight (every reserved one finished)."""
    await until(lambda: _quiet(env))


def books(env: HostileEnv) -> tuple[int, int, int]:
    """(atoms the payer paid, the spend log's paid + pending, atoms the bot's
    ledger was credited)."""
    paid = sum(atoms for _, atoms in env.payer.calls)
    logged = sum(e.atoms for e in env.bridge.spend_log().entries if e.status != "failed")
    return paid, logged, env.bot.ledger.credited


async def assert_books(env: HostileEnv) -> None:
    await quiet(env)
    paid, logged, credited = books(env)
    assert paid == logged == credited, f"payer {paid}, spend log {logged}, bot credited {credited}"
    assert env.bridge.spend_log().day_total_atoms <= DAY_CAP


async def measured(env: HostileEnv, session: ClientSession, tool: str, arguments: Any = None) -> Any:
    """One call and the payments made for it: ``(answer, [atoms…])``."""
    before = len(env.payer.calls)
    answer = await ask(session, tool, arguments)
    await quiet(env)
    return answer, [atoms for _, atoms in env.payer.calls[before:]]


def assert_within(payments: list[int], bound: int, what: str) -> None:
    """The rule for one logical call in autopay mode."""
    assert len(payments) <= 1, f"{what}: {len(payments)} payments {payments} for one call"
    assert sum(payments) <= bound, f"{what}: paid {sum(payments)} atoms, the bound is {bound}"


async def prime(env: HostileEnv, session: ClientSession) -> None:
    """Let the bridge learn the balance the bot holds (a receipt of ``warm``,
    charged 1 atom from the opening balance): the next call goes unmarked,
    so whatever it pays, it pays because of the bot's answer."""
    answer, payments = await measured(env, session, "warm")
    assert not answer.is_error, answer.text
    assert payments == []


FORTUNE = HostileTool("fortune", 500)
OPENING = {CLIENT: 2_000}


# -- the honest bot (the kit itself) --------------------------------------------------


async def test_honest_bot_is_paid_its_price_once(tmp_path: Path) -> None:
    """The kit's honest strategy behaves as a harness does: one payment of
    the price, one charge, the books agree."""
    with anyio.fail_after(30):
        async with hostile_env(tmp_path, [FORTUNE], Honest()) as env, env.session() as session:
            tools = await shown(session)
            assert bound_of(tools["fortune"], CAP) == 500
            for n in range(3):
                answer, payments = await measured(env, session, "fortune", {"n": n})
                assert not answer.is_error, answer.text
                assert payments == [500]
            assert env.bot.ledger.charged == 1_500
            assert [c.outcome for c in env.bot.calls].count("answered") == 3
            await assert_books(env)


async def test_a_paid_result_tells_the_agent_what_was_paid(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with hostile_env(tmp_path, [FORTUNE], Honest()) as env, env.session() as session:
            answer, payments = await measured(env, session, "fortune")
            assert payments == [500]
            assert not answer.is_error
            assert answer.tells_payment, f"atoms moved, the agent was not told: {answer.text!r}"
            await assert_books(env)


# -- free tools ---------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("listing", "marked"), [("fixed", False), ("unpriced", False), ("fixed", True)], ids=str
)
async def test_forged_refusal_from_a_free_tool_pays_nothing(
    tmp_path: Path, listing: Any, marked: bool
) -> None:
    """A free tool (priceAtoms 0, or no price key) answers with a
    payment_required-shaped error, even one carrying the genuine-refusal
    mark of a bot that says it marks its refusals: nothing is paid."""
    free = HostileTool("lookup", 0, listing=listing)
    forged = ForgedRefusal(price_atoms=500, marked=marked)
    with anyio.fail_after(30):
        async with (
            hostile_env(tmp_path, [free], forged, marks_refusals=marked) as env,
            env.session() as session,
        ):
            assert bound_of((await shown(session))["lookup"], CAP) == 0
            answer, payments = await measured(env, session, "lookup")
            assert answer.is_error
            assert payments == []
            assert env.bot.marks == []
            await assert_books(env)


async def test_tool_shown_free_but_charged_is_never_paid(tmp_path: Path) -> None:
    """A tool listed without a price whose bot refuses it (honestly, by its
    own books) for 50 atoms: the agent was shown it free, nothing is paid."""
    sneaky = HostileTool("sneaky", 50, listing="unpriced")
    with anyio.fail_after(30):
        async with hostile_env(tmp_path, [sneaky], Honest()) as env, env.session() as session:
            assert bound_of((await shown(session))["sneaky"], CAP) == 0
            answer, payments = await measured(env, session, "sneaky")
            assert payments == []
            assert answer.is_error
            await assert_books(env)


async def test_refusal_shaped_output_of_a_charged_call_is_not_paid(tmp_path: Path) -> None:
    """The bot charges the call (its receipt says so) and its output is a
    payment_required-shaped error: tool output, never a request for money."""
    strategy = by_tool({"fortune": ForgedRefusal(price_atoms=500, charge=True)})
    with anyio.fail_after(30):
        async with (
            hostile_env(tmp_path, [FORTUNE, WARM], strategy, opening=OPENING) as env,
            env.session() as session,
        ):
            await prime(env, session)
            answer, payments = await measured(env, session, "fortune")
            assert env.bot.ledger.charged == 1 + 500
            assert payments == []
            assert answer.is_error
            await assert_books(env)


# -- refusals that must not be paid (again) --------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("primed", [False, True], ids=["alongside", "after-refusal"])
async def test_refusal_loop_pays_once_at_most_the_price(tmp_path: Path, primed: bool) -> None:
    """The bot asks again after every payment: one payment, ≤ the price
    (made alongside the call, or after the first refusal), and the agent is
    told what was paid."""
    strategy = by_tool({"fortune": RefusalLoop()})
    with anyio.fail_after(60):
        async with (
            hostile_env(tmp_path, [FORTUNE, WARM], strategy, opening=OPENING) as env,
            env.session() as session,
        ):
            if primed:
                await prime(env, session)
            answer, payments = await measured(env, session, "fortune")
            assert len(payments) == 1, f"payments {payments}"
            assert_within(payments, 500, "refusal loop")
            assert answer.is_error
            assert answer.tells_payment, answer.text
            await assert_books(env)


@pytest.mark.anyio
@pytest.mark.parametrize("primed", [True, False], ids=["after-refusal", "alongside"])
async def test_price_switch_is_not_paid_and_names_both_prices(tmp_path: Path, primed: bool) -> None:
    """Listed at 10, the refusal asks 9,000: not paid (beyond the 10 a
    payment made alongside the call may have sent); the error names both."""
    cheap = HostileTool("cheap", 10)
    strategy = by_tool({"cheap": PriceSwitch(ask_atoms=9_000)})
    with anyio.fail_after(30):
        async with (
            hostile_env(tmp_path, [cheap, WARM], strategy, opening={CLIENT: 23}) as env,
            env.session() as session,
        ):
            if primed:
                await prime(env, session)  # 22 atoms known there: the listed 10 is covered
            answer, payments = await measured(env, session, "cheap")
            assert_within(payments, 10, "price switch")
            if primed:
                assert payments == []
            assert answer.is_error
            assert answer.names(10), answer.note
            assert answer.names(9_000), answer.note
            await assert_books(env)


@pytest.mark.anyio
@pytest.mark.parametrize("primed", [True, False], ids=["after-refusal", "alongside"])
async def test_refusal_for_another_tool_is_not_paid(tmp_path: Path, primed: bool) -> None:
    """A refusal naming another tool (``other``, 700) for a call of
    ``fortune`` (500): not paid; the error names both prices."""
    other = HostileTool("other", 700)
    strategy = by_tool({"fortune": OtherToolRefusal("other")})
    with anyio.fail_after(30):
        async with (
            hostile_env(tmp_path, [FORTUNE, other, WARM], strategy, opening=OPENING) as env,
            env.session() as session,
        ):
            if primed:
                await prime(env, session)
            answer, payments = await measured(env, session, "fortune")
            assert_within(payments, 500, "another tool's refusal")
            if primed:
                assert payments == []
            assert answer.is_error
            assert answer.names(500), answer.note
            assert answer.names(700), answer.note
            await assert_books(env)


@pytest.mark.anyio
@pytest.mark.parametrize("times", [None, 2], ids=["for-ever", "twice"])
async def test_replayed_refusal_on_reissue_is_not_paid_again(tmp_path: Path, times: int | None) -> None:
    """The bot answers the reissue of a paid call's callKey with its first
    refusal again (for ever, or twice and then charges): one payment."""
    with anyio.fail_after(60):
        async with hostile_env(tmp_path, [FORTUNE], ReplayRefusal(times=times)) as env:
            async with env.session() as session:
                answer, payments = await measured(env, session, "fortune")
            assert_within(payments, 500, "replayed refusal")
            assert len(env.bot.call_keys) == 1
            assert len(env.bot.calls) >= 2  # reissued under the same key
            if times is not None:
                assert not answer.is_error, answer.text
                assert env.bot.ledger.charged == 500
            await assert_books(env)


@pytest.mark.anyio
@pytest.mark.parametrize("price", [500, 6_000])
@pytest.mark.paced  # the flood/funding timing it bounds is the paced one
async def test_concurrent_calls_of_a_refusal_loop_are_bounded(tmp_path: Path, price: int) -> None:
    """20 concurrent calls of a refusal-looping tool: at most one payment
    each, in all ≤ 20 times the price and ≤ the day cap (20 calls of 6,000
    would pass it)."""
    looping = HostileTool("fortune", price)
    with anyio.fail_after(120):
        async with hostile_env(tmp_path, [looping], RefusalLoop()) as env, env.session() as session:
            answers: list[Answer] = []

            async def one(n: int) -> None:
                answers.append(await ask(session, "fortune", {"n": n}))

            async with anyio.create_task_group() as tg:
                for n in range(20):
                    tg.start_soon(one, n)
            await quiet(env)
            payments = [atoms for _, atoms in env.payer.calls]
            assert len(answers) == 20
            # The virtual clock advances whenever every task waits, so on a
            # loaded machine a call's deadline can pass while it queues behind
            # another call's payment (or its own prepayment) and it never
            # reaches the bot; the money bounds hold either way.
            assert 1 <= len(env.bot.call_keys) <= 20
            assert all(a.is_error for a in answers), [a.text for a in answers if not a.is_error]
            assert len(payments) <= 20, f"{len(payments)} payments for 20 calls"
            assert all(atoms <= price for atoms in payments), payments
            assert sum(payments) <= min(20 * price, DAY_CAP), sum(payments)
            await assert_books(env)


# -- lying receipts ---------------------------------------------------------------------------


LIES: dict[str, list[Behaviour]] = {
    "claims-charged-and-empty": [LyingReceipt(charged_claim=500, balance_claim=0)] * 5,
    "claims-rich-then-refuses": [LyingReceipt(balance_claim=1_000_000), RefusalLoop()] * 3,
    "claims-9000-charged": [LyingReceipt(charged_claim=9_000, balance_claim=0), Honest()] * 3,
}


@pytest.mark.anyio
@pytest.mark.parametrize("lie", list(LIES))
async def test_lying_receipts_cannot_make_the_bridge_pay_more(tmp_path: Path, lie: str) -> None:
    """Receipts that claim charges never made, balances that are not there:
    each call still pays at most once, at most the price."""
    script = LIES[lie]
    with anyio.fail_after(120):
        async with (
            hostile_env(tmp_path, [FORTUNE], scripted(*script)) as env,
            env.session() as session,
        ):
            total = 0
            for n in range(len(script)):
                answer, payments = await measured(env, session, "fortune", {"n": n})
                assert_within(payments, 500, f"call {n} ({script[n].name})")
                if payments:
                    assert answer.tells_payment, answer.text
                total += sum(payments)
            assert total <= 500 * len(script)
            await assert_books(env)


# -- transport-level attacks ----------------------------------------------------------------


async def test_an_answer_under_a_wrong_id_is_recovered_by_a_resend(tmp_path: Path) -> None:
    """The first answer goes out under an id the bridge never used; the
    re-sent copy (same callKey) is answered: one charge, one payment."""
    with anyio.fail_after(30):
        async with hostile_env(tmp_path, [FORTUNE], WrongId(Honest(), times=1)) as env:
            async with env.session() as session:
                answer, payments = await measured(env, session, "fortune")
            assert env.bot.calls[0].outcome == "wrong-id"
            assert_within(payments, 500, "wrong id once")
            assert not answer.is_error, answer.text
            assert env.bot.ledger.charged <= 500
            await assert_books(env)


async def test_answers_always_under_wrong_ids_end_at_the_deadline(tmp_path: Path) -> None:
    """No answer ever matches: the call ends with an error at its deadline,
    having paid at most once, at most the price, and saying what it paid."""
    with anyio.fail_after(60):
        async with hostile_env(tmp_path, [FORTUNE], WrongId(RefusalLoop(), times=None)) as env:
            async with env.session() as session:
                answer, payments = await measured(env, session, "fortune")
            assert answer.is_error
            assert_within(payments, 500, "wrong ids for ever")
            if payments:
                assert answer.tells_payment, answer.text
            await assert_books(env)


FLOODS = {
    "fits-honest": (Honest(), 100),
    "fits-refusal-loop": (RefusalLoop(), 100),
    "overflows-honest": (Honest(), 150),
}


@pytest.mark.anyio
@pytest.mark.parametrize("flood", list(FLOODS))
async def test_a_notification_flood_changes_nothing_paid(tmp_path: Path, flood: str) -> None:
    """Many notifications (logs, forged progress, unknown methods,
    tools/list_changed) before each answer: the bound holds. A flood the
    bridge's session inbox (128 messages) takes leaves an honest call
    working; a larger one may cost the call, never more than the price."""
    inner, count = FLOODS[flood]
    strategy = Flood(inner, count=count, list_changed=count <= 100)
    with anyio.fail_after(60):
        async with hostile_env(tmp_path, [FORTUNE], strategy) as env, env.session() as session:
            answer, payments = await measured(env, session, "fortune")
            assert env.bot.notifications_sent >= count
            assert_within(payments, 500, "flood")
            if payments:
                assert answer.tells_payment, answer.text
            if flood == "fits-honest":
                assert not answer.is_error, answer.text
            await assert_books(env)


#: (tools in the list, tools per page, endless cursor): 40 pages within the
#: bridge's bounds, 2,001 tools past them, a cursor that never ends.
LISTS = {"40-pages": (1_000, 25, False), "2001-tools": (2_001, 50, False), "endless-cursor": (100, 10, True)}


@pytest.mark.anyio
@pytest.mark.parametrize("shape", list(LISTS))
async def test_a_huge_tool_list_keeps_the_bound(tmp_path: Path, shape: str) -> None:
    """A many-page list with the priced tool (700) last: whether the bridge
    serves the list or refuses it, a call pays at most the price the agent
    was shown (nothing when it was shown none)."""
    count, size, endless = LISTS[shape]
    tools = [*(HostileTool(f"t{n:04}") for n in range(count - 1)), HostileTool("fortune", 700)]
    listed: dict[str, Tool] = {}
    answer: Answer | None = None
    with anyio.fail_after(60):
        async with hostile_env(tmp_path, tools, Honest(), page_size=size, endless_pages=endless) as env:
            failure: Exception | None = None
            try:
                async with env.session() as session:
                    listed = await shown(session)
                    answer = await ask(session, "fortune")
            except Exception as exc:  # the bridge may refuse the bot's list as a whole
                failure = exc
            assert failure is None or not listed, f"listed, then failed: {failure!r}"
            await quiet(env)
            bound = bound_of(listed.get("fortune"), CAP)
            if shape == "40-pages":
                assert env.bot.list_requests >= 40
                assert bound == 700
            payments = [atoms for _, atoms in env.payer.calls]
            assert_within(payments, bound, "huge list")
            if payments:
                assert answer is not None
                assert answer.tells_payment, answer.text
            await assert_books(env)


async def test_a_bot_that_charges_then_dies_costs_at_most_the_price(tmp_path: Path) -> None:
    """The bot charges the call and never answers: an error at the deadline
    that says what was paid; one payment at most, ≤ the price."""
    with anyio.fail_after(60):
        async with hostile_env(tmp_path, [FORTUNE], Die(after_charge=True)) as env:
            async with env.session() as session:
                answer, payments = await measured(env, session, "fortune")
            assert answer.is_error
            assert {c.outcome for c in env.bot.calls} == {"hung"}
            assert_within(payments, 500, "died after charging")
            if payments:
                assert answer.tells_payment, answer.text
            await assert_books(env)


async def test_a_bot_that_goes_offline_mid_call_and_returns(tmp_path: Path) -> None:
    """The bot goes offline on the first copy; back before the deadline, it
    answers a held re-sent copy: one payment at most, ≤ the price."""
    with anyio.fail_after(60):
        async with hostile_env(tmp_path, [FORTUNE], Die(offline=True, times=1)) as env:
            async with env.session() as session, anyio.create_task_group() as tg:
                got: list[tuple[Answer, list[int]]] = []

                async def one() -> None:
                    got.append(await measured(env, session, "fortune"))

                tg.start_soon(one)
                await until(lambda: env.bot.silent)
                env.bot.revive()
            ((answer, payments),) = got
            assert env.bot.calls[0].outcome == "offline"
            assert_within(payments, 500, "offline and back")
            assert not answer.is_error, answer.text
            assert env.bot.ledger.charged == 500
            await assert_books(env)


# -- dynamic prices ---------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("ask_atoms", [9_000, 20_000])
async def test_a_dynamic_price_is_bounded_by_the_per_call_cap(tmp_path: Path, ask_atoms: int) -> None:
    """No price is shown for a dynamic tool: the per-call cap (10,000) alone
    bounds it; 20,000 is not paid at all."""
    dynamic = HostileTool("quote", 7, listing="dynamic")
    with anyio.fail_after(60):
        async with hostile_env(tmp_path, [dynamic], PriceSwitch(ask_atoms=ask_atoms)) as env:
            async with env.session() as session:
                assert bound_of((await shown(session))["quote"], CAP) == CAP
                answer, payments = await measured(env, session, "quote")
            assert_within(payments, CAP, "dynamic price")
            if ask_atoms > CAP:
                assert payments == []
                assert answer.is_error
            await assert_books(env)


# -- approval mode -------------------------------------------------------------------------------


def decide_parked(bridge: Bridge, approve: Callable[[int], bool]) -> list[bool]:
    """Decide every payment as soon as it is parked: ``approve(n)`` for the
    n-th (from 0). Returns the decisions, in order."""
    decisions: list[bool] = []
    seen: set[str] = set()

    def listener() -> None:
        for pending in bridge.pending_payments():
            if pending.id not in seen:
                seen.add(pending.id)
                decisions.append(approve(len(decisions)))
                bridge.resolve_payment(pending.id, decisions[-1])

    bridge.watch(listener)
    return decisions


@pytest.mark.anyio
@pytest.mark.parametrize("approve_all", [True, False], ids=["approve-every-one", "approve-the-first"])
async def test_approval_mode_pays_only_what_the_user_approved(tmp_path: Path, approve_all: bool) -> None:
    """Approval mode, a refusal loop: every payment is one the user
    approved, each ≤ the price; nothing is paid alongside the call."""
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(60):
        async with (
            hostile_env(tmp_path, [FORTUNE], RefusalLoop(), settings=settings) as env,
            env.session() as session,
        ):
            decisions = decide_parked(env.bridge, lambda n: approve_all or n == 0)
            answer, payments = await measured(env, session, "fortune")
            assert env.bot.marks == []
            assert decisions[:1] == [True]
            assert len(payments) == decisions.count(True), (payments, decisions)
            assert all(atoms <= 500 for atoms in payments)
            assert sum(payments) <= 500 * decisions.count(True)
            assert answer.is_error
            assert answer.tells_payment, answer.text
            await assert_books(env)
