"""Hypothesis drives a hostile bot (brmcp/testing/hostile.py) against the
bridge: random tools and prices, random caps, a random behaviour per call
(honest, forged refusals, refusal loops, price switches, refusals for other
tools, replayed refusals, wrong JSON-RPC ids, notification floods, a bot
that dies once, lying receipts), calls in random order, some of them
concurrent. The bridge's spending policy must hold after every step
(BRIDGE.md §The payment flow, §Pay alongside and prepay, §Failures; WIRE.md
§Payments): each logical call pays at most once (autopay), at most
min(per-call cap, the price the agent was shown), a dynamic price at most
the cap, a tool shown free nothing; an unpayable refusal (another tool's,
or above the shown price) ends with an error naming both prices; a call
after which atoms moved says so; the rolling day total stays within the day
cap; and the books agree to the atom (payer == spend log paid + pending ==
bot credited).

Each example is a fresh fabric, bot and bridge. ``EXAMPLES`` random plans
run (well under a minute), and the :data:`EXPLICIT` plans run as tests of
their own; the database is off, so a run never writes files.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from mcp.types import Tool

from brmcp.protocol.payment import parse_payment_required, parse_receipt
from brmcp.testing.hostile import (
    Behaviour,
    Die,
    Flood,
    ForgedRefusal,
    Honest,
    HostileCall,
    HostileTool,
    LyingReceipt,
    OtherToolRefusal,
    PriceSwitch,
    RefusalLoop,
    ReplayRefusal,
    WrongId,
)
from tests.bridge.test_hostile_bots import Answer, HostileEnv, ask, books, bound_of, hostile_env, quiet, shown
from tests.kit.bridge import CLIENT, fixture_settings

#: Examples per run: sized so the file runs in well under a minute.
EXAMPLES = 40
NAMES = ("alpha", "beta", "gamma")

_amounts = st.integers(min_value=1, max_value=20_000)
_simple = st.sampled_from([Honest(), RefusalLoop()])
_behaviours: st.SearchStrategy[Behaviour] = st.one_of(
    st.just(Honest()),
    st.builds(ForgedRefusal, price_atoms=_amounts, charge=st.booleans()),
    st.builds(RefusalLoop, price_atoms=st.none() | _amounts),
    st.builds(PriceSwitch, ask_atoms=_amounts),
    st.builds(OtherToolRefusal, other=st.sampled_from([*NAMES, "ghost"]), price_atoms=st.none() | _amounts),
    st.builds(ReplayRefusal, times=st.none() | st.integers(min_value=0, max_value=3)),
    st.builds(WrongId, inner=_simple, times=st.just(1)),
    st.builds(Flood, inner=_simple, count=st.integers(min_value=0, max_value=40), list_changed=st.booleans()),
    st.builds(Die, after_charge=st.booleans(), times=st.just(1)),
    st.builds(
        LyingReceipt,
        charged_claim=st.none() | st.integers(min_value=0, max_value=20_000),
        balance_claim=st.integers(min_value=0, max_value=10**9),
        charge_atoms=st.integers(min_value=0, max_value=2_000),
    ),
)
_tools = st.lists(
    st.builds(
        HostileTool,
        name=st.just(""),
        price_atoms=st.sampled_from([0, 1, 10, 500, 6_000, 12_000]) | st.integers(0, 15_000),
        listing=st.sampled_from(["fixed", "fixed", "dynamic", "unpriced"]),
    ),
    min_size=1,
    max_size=3,
).map(lambda tools: [HostileTool(NAMES[i], t.price_atoms, t.listing) for i, t in enumerate(tools)])


@dataclass(frozen=True)
class Plan:
    """One example: the bot's tools, the caps, the opening balance at the
    bot, and the steps: each a batch of ``(tool index, behaviour)`` calls
    sent at once (one call: sequential)."""

    tools: list[HostileTool]
    per_call_cap: int
    day_cap: int
    opening: int
    steps: list[list[tuple[int, Behaviour]]]


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    tools = draw(_tools)
    call = st.tuples(st.integers(0, len(tools) - 1), _behaviours)
    steps = draw(st.lists(st.lists(call, min_size=1, max_size=3), min_size=1, max_size=4))
    return Plan(
        tools=tools,
        per_call_cap=draw(st.sampled_from([0, 10, 500, 10_000]) | st.integers(0, 15_000)),
        day_cap=draw(st.sampled_from([0, 1_000, 100_000]) | st.integers(0, 40_000)),
        opening=draw(st.sampled_from([0, 0, 5, 2_000])),
        steps=steps,
    )


@dataclass
class _Call:
    n: int
    tool: str
    behaviour: Behaviour
    answer: Answer | None = None


def _copies(env: HostileEnv, n: int) -> list[HostileCall]:
    return [c for c in env.bot.calls if c.arguments.get("n") == n]


def _check_names_both_prices(env: HostileEnv, call: _Call, listed: Tool | None) -> None:
    """An unpayable refusal the bridge was given last (another tool's, or
    asking more than the shown fixed price) ends with both prices named."""
    shown_price = bound_of(listed, 10**12) if listed is not None else 0
    meta = listed.meta if listed is not None else None
    fixed = isinstance(meta, dict) and isinstance(meta.get("brmcp/priceAtoms"), int) and shown_price > 0
    delivered = [c for c in _copies(env, call.n) if c.outcome in ("answered", "refused")]
    if not fixed or not delivered or delivered[-1].answer is None:
        return
    last = delivered[-1].answer
    refusal = parse_payment_required(last)
    if refusal is None or parse_receipt(last.meta) is not None:
        return
    if refusal.tool == call.tool and refusal.price_atoms <= shown_price:
        return
    assert call.answer is not None
    assert call.answer.is_error, call.answer.text
    assert call.answer.names(shown_price), (call.tool, shown_price, call.answer.note)
    assert call.answer.names(refusal.price_atoms), (refusal, call.answer.note)


async def _run(plan: Plan) -> None:
    settings_ = fixture_settings(per_call_cap_atoms=plan.per_call_cap, per_day_cap_atoms=plan.day_cap)
    behaviours: dict[int, Behaviour] = {}

    def strategy(call: HostileCall) -> Behaviour:
        return behaviours.get(int(call.arguments.get("n", -1)), Honest())

    with tempfile.TemporaryDirectory() as tmp, anyio.fail_after(120):
        async with (
            hostile_env(
                Path(tmp), plan.tools, strategy, settings=settings_, opening={CLIENT: plan.opening}
            ) as env,
            env.session() as session,
        ):
            listed = await shown(session)
            cap = max(plan.per_call_cap, 0)
            bounds = {t.name: bound_of(listed.get(t.name), cap) for t in plan.tools}
            n = 0
            for step in plan.steps:
                calls: list[_Call] = []
                for index, behaviour in step:
                    behaviours[n] = behaviour
                    calls.append(_Call(n, plan.tools[index].name, behaviour))
                    n += 1
                entries_before = len(env.bridge.spend_log().entries)
                paid_before = len(env.payer.calls)
                charged_before = env.bot.ledger.charged

                async def one(call: _Call) -> None:
                    call.answer = await ask(session, call.tool, {"n": call.n})

                async with anyio.create_task_group() as tg:
                    for call in calls:
                        tg.start_soon(one, call)
                await quiet(env)

                # What this step paid, per tool (a spend entry names the called tool).
                new = env.bridge.spend_log().entries[entries_before:]
                made = [atoms for _, atoms in env.payer.calls[paid_before:]]
                per_tool: dict[str, list[int]] = defaultdict(list)
                for entry in new:
                    if entry.status != "failed":
                        per_tool[entry.tool].append(entry.atoms)
                called: dict[str, int] = defaultdict(int)
                for call in calls:
                    called[call.tool] += 1
                trace = [(c.tool, c.behaviour, c.answer.text if c.answer else None) for c in calls]
                for tool, payments in per_tool.items():
                    assert tool in called, f"paid {payments} for {tool}, which this step did not call"
                    count, bound = called[tool], bounds[tool]
                    assert len(payments) <= count, f"{tool}: {payments} for {count} call(s) {trace}"
                    assert all(a <= bound for a in payments), f"{tool}: {payments} > {bound} {trace}"
                    assert sum(payments) <= count * bound, f"{tool}: {payments}, bound {bound} {trace}"
                if len(calls) == 1:
                    (call,) = calls
                    assert call.answer is not None
                    charged = env.bot.ledger.charged - charged_before
                    moved = bool(made) or (charged > 0 and not isinstance(call.behaviour, LyingReceipt))
                    if moved:
                        assert call.answer.tells_payment, (made, charged, trace)
                for call in calls:
                    _check_names_both_prices(env, call, listed.get(call.tool))

            await quiet(env)
            paid, logged, credited = books(env)
            assert paid == logged == credited, f"payer {paid}, spend log {logged}, bot credited {credited}"
            assert env.bridge.spend_log().day_total_atoms <= max(plan.day_cap, 0)
            assert paid <= max(plan.day_cap, 0)


def _plan(tools: list[HostileTool], *steps: list[tuple[int, Behaviour]], opening: int = 0) -> Plan:
    return Plan(tools=tools, per_call_cap=10_000, day_cap=100_000, opening=opening, steps=list(steps))


_ALPHA_500 = HostileTool("alpha", 500)
#: The attacks every run covers, whatever the draw: a price switch, another
#: tool's refusal, refusal-shaped output of a charged call, concurrent
#: refusal loops, a forged refusal from a free tool.
EXPLICIT = [
    _plan([HostileTool("alpha", 10)], [(0, PriceSwitch(ask_atoms=9_000))]),
    _plan([_ALPHA_500, HostileTool("beta", 700)], [(0, OtherToolRefusal("beta"))]),
    _plan([_ALPHA_500], [(0, ForgedRefusal(price_atoms=500, charge=True))], opening=2_000),
    _plan([_ALPHA_500], [(0, RefusalLoop()), (0, RefusalLoop()), (0, ReplayRefusal())]),
    _plan([HostileTool("alpha", 0)], [(0, ForgedRefusal(price_atoms=500))]),
]
EXPLICIT_IDS = ["price-switch", "other-tool", "charged-output", "concurrent-loops", "free-forged"]


# No shrink phase: a failing run stays well under a minute, and every
# assertion message carries the step's trace (tool, behaviour, answer).
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=(Phase.generate,),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(plan=plans())
def test_a_hostile_bot_never_breaks_the_spending_policy(plan: Plan) -> None:
    anyio.run(_run, plan)


@pytest.mark.parametrize("plan", EXPLICIT, ids=EXPLICIT_IDS)
def test_the_named_attacks_never_break_the_spending_policy(plan: Plan) -> None:
    """The same checks on the :data:`EXPLICIT` plans."""
    anyio.run(_run, plan)


def test_the_plans_cover_every_behaviour() -> None:
    """The behaviour strategy can draw every kind of hostile bot."""
    kinds: set[str] = set()

    @settings(max_examples=300, deadline=None, database=None)
    @given(behaviour=_behaviours)
    def collect(behaviour: Any) -> None:
        kinds.add(type(behaviour).__name__)

    collect()
    assert kinds == {
        "Honest",
        "ForgedRefusal",
        "RefusalLoop",
        "PriceSwitch",
        "OtherToolRefusal",
        "ReplayRefusal",
        "WrongId",
        "Flood",
        "Die",
        "LyingReceipt",
    }
