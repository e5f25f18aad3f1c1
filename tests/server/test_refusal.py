"""A refusal before execution is a typed value (reason, tool, price,
balance; brmcp/server/calls/_refusal.py), rendered once at the pipeline's edge:
the bytes are the harness's marked ``payment_required`` text (WIRE.md
§Payments, "Genuine refusals") or a tool error, and what a caller parses
back is what the value carried."""

from __future__ import annotations

from brmcp.protocol.payment import (
    NOT_A_REFUSAL_PREFIX,
    REFUSAL_KEY,
    marked_payment_required_result,
    parse_payment_required,
    payment_required_text,
)
from brmcp.server import RATE_LIMITED_TEXT
from brmcp.server.calls import DROPPED_TEXT, LEDGER_UNAVAILABLE_TEXT, Refusal, RefusalReason, error_result
from tests.kit.harness import payment_required_json, text_of


def _bytes(result: object) -> str:
    return result.model_dump_json(by_alias=True, exclude_none=True)  # type: ignore[attr-defined]


def test_a_payment_refusal_renders_the_marked_go_text() -> None:
    refusal = Refusal.payment_required("paid", 500, 120)
    result = refusal.result()
    assert _bytes(result) == _bytes(marked_payment_required_result("paid", 500, 120))
    assert text_of(result) == payment_required_json("paid", 500, 120)
    assert result.is_error
    assert result.meta == {REFUSAL_KEY: True}
    found = parse_payment_required(result)
    assert found is not None
    assert (found.tool, found.price_atoms, found.balance_atoms) == ("paid", 500, 120)
    assert refusal.reason.metric_outcome == "payment_required"


def test_other_refusals_are_tool_errors() -> None:
    for refusal, text, outcome in (
        (Refusal.rate_limited(), RATE_LIMITED_TEXT, "rate_limited"),
        (Refusal.ledger_unavailable(), LEDGER_UNAVAILABLE_TEXT, "refused"),
        (Refusal.caller_restarted(), DROPPED_TEXT, "refused"),
    ):
        assert _bytes(refusal.result()) == _bytes(error_result(text))
        assert parse_payment_required(refusal.result()) is None
        assert refusal.reason.metric_outcome == outcome
    assert {reason.value for reason in RefusalReason} == {
        "payment required",
        "rate limited",
        "price function failed",
        "ledger unavailable",
        "caller restarted",
        "payment outcome unknown",
    }


def test_a_price_function_s_text_never_renders_as_a_refusal() -> None:
    forged = payment_required_text("paid", 1, 0)
    result = Refusal.price_failed(forged).result()
    assert result.is_error
    assert text_of(result) == NOT_A_REFUSAL_PREFIX + forged
    assert parse_payment_required(result) is None
