"""The hard bound of one logical call (brmcp/bridge/pay/_budget.py, BRIDGE.md
§The hard bound): what a refusal can make the bridge pay."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from mcp.types import Tool

from brmcp.bridge.pay import CallBudget, Listing, listing_of
from brmcp.protocol.payment import PRICE_ATOMS_KEY, PRICING_DYNAMIC, PRICING_KEY, PaymentRequired


def _tool(meta: dict[str, Any] | None) -> Tool:
    return Tool(name="t", input_schema={"type": "object"}, _meta=meta)


def test_listing_of_reads_the_price_keys() -> None:
    assert listing_of(_tool({PRICE_ATOMS_KEY: 500})) == Listing("fixed", 500)
    assert listing_of(_tool({PRICE_ATOMS_KEY: 500.0})) == Listing("fixed", 500)  # Go writes floats
    assert listing_of(_tool({PRICE_ATOMS_KEY: 0})) == Listing("free")
    assert listing_of(_tool({PRICING_KEY: PRICING_DYNAMIC})) == Listing("dynamic")
    assert listing_of(_tool({PRICE_ATOMS_KEY: 0, PRICING_KEY: PRICING_DYNAMIC})) == Listing("free")
    assert listing_of(_tool({PRICE_ATOMS_KEY: 1.5})) == Listing("free")
    assert listing_of(_tool({PRICE_ATOMS_KEY: True})) == Listing("free")
    assert listing_of(_tool({PRICE_ATOMS_KEY: "500"})) == Listing("free")
    assert listing_of(_tool(None)) == Listing("free")
    assert listing_of(None) == Listing("free")


def _refusal(
    tool: str = "t", price: int = 500, balance: int = 0, shortfall: int | None = None
) -> PaymentRequired:
    return PaymentRequired(
        tool=tool,
        price_atoms=price,
        balance_atoms=balance,
        shortfall_atoms=price - balance if shortfall is None else shortfall,
    )


def test_free_tool_is_never_paid() -> None:
    verdict = CallBudget(Listing("free")).judge("t", _refusal(price=30_000), 10_000)
    assert verdict.amount == 0
    assert verdict.decline == (
        "t is listed as free, but the bot asked for 30000 atoms; a free tool is never paid for"
    )


def test_a_refusal_for_another_tool_is_not_paid() -> None:
    verdict = CallBudget(Listing("fixed", 500)).judge("t", _refusal(tool="other"), 10_000)
    assert verdict.amount == 0
    assert verdict.decline is not None
    assert '"other"' in verdict.decline


def test_a_price_above_the_listing_is_not_paid_and_names_both_prices() -> None:
    verdict = CallBudget(Listing("fixed", 10)).judge("t", _refusal(price=9_000), 10_000)
    assert verdict.amount == 0
    assert verdict.contradicts_listing
    assert (
        verdict.decline
        == "the bot asks 9000 atoms for t, but it was listed at 10 atoms when this call was made"
    )


def test_a_lower_price_and_a_partial_shortfall_are_paid() -> None:
    assert CallBudget(Listing("fixed", 500)).judge("t", _refusal(price=400), 10_000).amount == 400
    assert CallBudget(Listing("fixed", 500)).judge("t", _refusal(balance=100), 10_000).amount == 400
    assert CallBudget(Listing("dynamic")).judge("t", _refusal(price=7), 10_000).amount == 7


def test_inconsistent_and_nonpositive_refusals_are_not_paid() -> None:
    inconsistent = CallBudget(Listing("dynamic")).judge("t", _refusal(price=5, shortfall=9_000), 10_000)
    assert inconsistent.amount == 0
    assert inconsistent.decline is not None
    zero = CallBudget(Listing("fixed", 500)).judge("t", _refusal(price=0, shortfall=0), 10_000)
    assert zero.decline == "bot requested a nonpositive amount"


def test_a_further_payment_counts_what_the_call_already_paid() -> None:
    budget = CallBudget(Listing("dynamic"))
    budget.add(6_000)
    over = budget.judge("t", _refusal(price=5_000), 10_000)
    assert over.amount == 0
    assert over.decline == (
        "5000 atoms would exceed the per-call cap (10000) with 6000 atoms already paid for this call"
    )
    within = budget.judge("t", _refusal(price=4_000), 10_000)
    assert within.amount == 4_000
    assert within.further


_listings = st.one_of(
    st.just(Listing("free")),
    st.just(Listing("dynamic")),
    st.integers(1, 10**6).map(lambda p: Listing("fixed", p)),
)


@given(
    listing=_listings,
    tool=st.sampled_from(["t", "u"]),
    price=st.integers(-(10**7), 10**7),
    balance=st.integers(-(10**7), 10**7),
    shortfall=st.integers(-(10**7), 10**7),
    cap=st.integers(-5, 10**7),
    already=st.lists(st.integers(1, 10**6), max_size=3),
)
def test_no_refusal_is_paid_past_the_listing_or_for_another_tool(
    listing: Listing, tool: str, price: int, balance: int, shortfall: int, cap: int, already: list[int]
) -> None:
    budget = CallBudget(listing)
    for atoms in already:
        budget.add(atoms)
    verdict = budget.judge("t", _refusal(tool=tool, price=price, balance=balance, shortfall=shortfall), cap)
    assert (verdict.amount > 0) == (verdict.decline is None)
    if verdict.amount:
        assert tool == "t"
        assert listing.kind != "free"
        assert verdict.amount <= max(price, 0)
        if listing.kind == "fixed":
            assert verdict.amount <= listing.price_atoms
        if already and cap > 0:
            assert budget.paid_atoms + verdict.amount <= cap
        assert verdict.further == bool(already)
