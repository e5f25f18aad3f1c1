"""Hostile providers never make the directory pay beyond the cap, and the
books stay exact to the atom (brmcp/directory/payer/_client.py,
docs/directory.md §Money): the provider's balance at the directory, the
spend journal, what the payer sent and what the provider was credited
always agree, whatever the provider answers and whatever the rail does."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_

from brmcp.directory import Timeouts
from brmcp.directory.model import STATE_PENDING_REVIEW, RegisterIn
from brmcp.testing.hostile import (
    Behaviour,
    Die,
    Flood,
    ForgedRefusal,
    Honest,
    HostileBot,
    HostileTool,
    OtherToolRefusal,
    PriceSwitch,
    RefusalLoop,
    WrongId,
)
from tests.kit import until

from .stack import BUDGET, DIRECTORY, FEE, PROVIDER, Stack, directory_stack, register_args

QUICK = Timeouts(dial=2.0, crawl=2.0, call=0.5, pay=2.0, credit_polls=2, credit_poll_delay=3.0)
TIPPED = FEE + BUDGET


async def run_against(
    st: Stack, bot: HostileBot, *, max_atoms: int = BUDGET, tool: str = "fortune"
) -> tuple[str, int]:
    """Register the hostile PROVIDER, fund it, wait for the verdict; returns
    the parked error and the atoms the payer sent it. Checks the books."""
    st.payer.hooks[PROVIDER] = bot.tip_from(DIRECTORY)
    application = RegisterIn.from_json(register_args(tool=tool, max_atoms=max_atoms))
    await st.directory.pipeline.register(PROVIDER, application)
    await st.directory.credit_tip(PROVIDER, TIPPED * 1000, 1)

    async def judged() -> bool:
        return (await st.directory.pipeline.status(PROVIDER)).state == STATE_PENDING_REVIEW

    await until(judged, limit=60)
    reg = await st.directory.store.registration(PROVIDER)
    assert reg is not None
    sent = sum(atoms for payee, atoms in st.payer.sent if payee == PROVIDER)
    spends = await st.directory.store.spends(PROVIDER)
    journaled = sum(s.atoms for s in spends)
    # Every atom that may have left is journaled; nothing else is.
    assert journaled == sent
    # The escrow paid exactly what was journaled, and the fee once.
    assert await st.directory.harness.balance(PROVIDER) == TIPPED - FEE - journaled
    assert reg.paid_atoms == journaled
    # Never beyond the nominated budget, never more than one payment per logical call.
    assert sent <= max_atoms
    assert len(spends) <= 1
    # The provider was credited exactly what was sent.
    assert bot.ledger.credited == sent
    return reg.test_err, sent


async def hostile_case(
    tmp_path: Path, tools: list[HostileTool], behaviour: Behaviour, **kw: object
) -> tuple[str, int]:
    async with AsyncExitStack() as stack:
        st = await stack.enter_async_context(directory_stack(tmp_path, timeouts=QUICK))
        bot = await stack.enter_async_context(HostileBot(st.fabric, PROVIDER, tools, strategy=behaviour))
        return await run_against(st, bot, **kw)  # type: ignore[arg-type]


FORTUNE = HostileTool("fortune", 500)


async def test_honest_hostile_bot_is_paid_once(tmp_path: Path) -> None:
    err, sent = await hostile_case(tmp_path, [FORTUNE], Honest())
    assert (err, sent) == ("", 500)


async def test_asks_more_than_listed(tmp_path: Path) -> None:
    err, sent = await hostile_case(tmp_path, [FORTUNE], PriceSwitch(ask_atoms=900))
    assert sent == 0
    assert "listed at 500 atoms" in err


async def test_quote_above_max_atoms(tmp_path: Path) -> None:
    err, sent = await hostile_case(tmp_path, [HostileTool("fortune", BUDGET + 1)], Honest())
    assert sent == 0
    assert f"exceeds the {BUDGET} atom budget" in err


async def test_lies_about_a_free_tool(tmp_path: Path) -> None:
    err, sent = await hostile_case(
        tmp_path, [HostileTool("fortune", 500, listing="unpriced")], ForgedRefusal(price_atoms=500)
    )
    assert sent == 0
    assert "listed as free" in err


async def test_refusal_for_another_tool(tmp_path: Path) -> None:
    err, sent = await hostile_case(tmp_path, [FORTUNE, HostileTool("other", 10)], OtherToolRefusal())
    assert sent == 0
    assert "never paid" in err


async def test_refuses_after_payment_forever(tmp_path: Path) -> None:
    err, sent = await hostile_case(tmp_path, [FORTUNE], RefusalLoop())
    assert sent == 500
    assert "credit did not land" in err


async def test_never_answers(tmp_path: Path) -> None:
    err, sent = await hostile_case(tmp_path, [FORTUNE], Die())
    assert sent == 0
    assert "no answer" in err


async def test_answers_under_wrong_ids(tmp_path: Path) -> None:
    err, sent = await hostile_case(tmp_path, [FORTUNE], WrongId(times=None))
    assert sent == 0
    assert "no answer" in err


async def test_floods_notifications(tmp_path: Path) -> None:
    err, sent = await hostile_case(tmp_path, [FORTUNE], Flood(count=300))
    assert sent == 500 if not err else sent <= 500


async def test_dynamic_price_within_the_cap(tmp_path: Path) -> None:
    err, sent = await hostile_case(tmp_path, [HostileTool("fortune", 700, listing="dynamic")], Honest())
    assert (err, sent) == ("", 700)


async def test_definitive_rail_failure_returns_the_escrow(tmp_path: Path) -> None:
    async with directory_stack(tmp_path, timeouts=QUICK) as st:
        st.payer.fail.append("fail")
        async with HostileBot(st.fabric, PROVIDER, [FORTUNE]) as bot:
            err, sent = await run_against(st, bot)
        assert sent == 0
        assert "no route" in err
        assert await st.directory.store.spends() == []
        kinds = [e.kind for e in await st.directory.harness.statement(PROVIDER)]
        assert kinds == ["tip", "directory_fee", "directory_test", "directory_refund"]


async def test_payment_in_doubt_stays_journaled(tmp_path: Path) -> None:
    async with directory_stack(tmp_path, timeouts=QUICK) as st:
        st.payer.fail.append("doubt")
        async with HostileBot(st.fabric, PROVIDER, [FORTUNE]) as bot:
            err, sent = await run_against(st, bot)
        assert sent == 500
        assert "in doubt" in err
        [entry] = await st.directory.store.spends()
        assert entry.state == "launched"


BEHAVIOURS = st_.sampled_from(
    [
        Honest(),
        PriceSwitch(ask_atoms=900),
        PriceSwitch(ask_atoms=300),
        RefusalLoop(),
        RefusalLoop(price_atoms=BUDGET * 3),
        OtherToolRefusal(),
        ForgedRefusal(price_atoms=BUDGET + 5),
        ForgedRefusal(price_atoms=400, charge=True),
        WrongId(times=1),
        Flood(count=50),
        Die(times=1),
    ]
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    behaviour=BEHAVIOURS,
    listing=st_.sampled_from(["fixed", "dynamic", "unpriced"]),
    price=st_.integers(min_value=1, max_value=BUDGET * 2),
    max_atoms=st_.integers(min_value=1, max_value=BUDGET),
    rail=st_.lists(st_.sampled_from(["", "fail", "doubt"]), max_size=2),
)
async def test_books_exact_under_any_fault_schedule(
    tmp_path_factory: object,
    behaviour: Behaviour,
    listing: str,
    price: int,
    max_atoms: int,
    rail: list[str],
) -> None:
    data = tmp_path_factory.mktemp("hostile")  # type: ignore[attr-defined]
    tool = HostileTool("fortune", price, listing=listing)  # type: ignore[arg-type]
    async with directory_stack(data, timeouts=QUICK) as st:
        st.payer.fail.extend(rail)
        async with HostileBot(st.fabric, PROVIDER, [tool], strategy=behaviour) as bot:
            with anyio.fail_after(60):
                await run_against(st, bot, max_atoms=max_atoms)


async def test_endless_catalog_pages_are_bounded(tmp_path: Path) -> None:
    from brmcp.directory.payer import MAX_CATALOG_PAGES

    async with directory_stack(tmp_path, timeouts=QUICK) as st:
        tools = [FORTUNE, HostileTool("other", 1)]
        async with HostileBot(st.fabric, PROVIDER, tools, page_size=1, endless_pages=True) as bot:
            err, sent = await run_against(st, bot)
        assert (err, sent) == ("", 500)
        reg = await st.directory.store.registration(PROVIDER)
        assert reg is not None
        assert reg.catalog.count('"name"') == MAX_CATALOG_PAGES
