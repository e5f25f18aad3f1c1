"""``brmcp.parse_payment_required`` on Go-shaped results (WIRE.md
§Payments, "Recognising a refusal": scan every text content, first match
wins, Go decoding rules)."""

from __future__ import annotations

import pytest
from mcp.types import CallToolResult, ImageContent, TextContent

from brmcp import PaymentRequired, parse_payment_required, payment_required_text

GO_EXAMPLE = (
    '{"error":"payment_required","tool":"fortune","priceAtoms":10000,"balanceAtoms":0,'
    '"shortfallAtoms":10000,"acceptedRails":["tip"]}'
)


def result(*texts: str, is_error: bool = True) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=t) for t in texts], is_error=is_error)


def test_go_example_parses() -> None:
    found = parse_payment_required(result(GO_EXAMPLE))
    assert found == PaymentRequired(
        error="payment_required",
        tool="fortune",
        price_atoms=10000,
        balance_atoms=0,
        shortfall_atoms=10000,
        accepted_rails=("tip",),
    )
    # Our writer produces exactly the Go bytes.
    assert payment_required_text("fortune", 10000, 0) == GO_EXAMPLE
    assert found is not None
    assert found.to_json() == GO_EXAMPLE


def test_payment_after_junk_and_other_content() -> None:
    image = ImageContent(type="image", data="AAAA", mime_type="image/png")
    junk = result("the tool is paid", '{"error":"rate_limited"}', "{not json", GO_EXAMPLE)
    junk.content.insert(0, image)
    found = parse_payment_required(junk)
    assert found is not None
    assert found.tool == "fortune"
    # The first matching text wins.
    second = GO_EXAMPLE.replace("fortune", "second")
    found = parse_payment_required(result("junk", second, GO_EXAMPLE))
    assert found is not None
    assert found.tool == "second"


def test_go_decoding_quirks() -> None:
    # Keys match case-insensitively; unknown keys are ignored; missing fields are zero.
    found = parse_payment_required(result('{"ERROR":"payment_required","Tool":"x","PRICEATOMS":5,"z":[{}]}'))
    assert found == PaymentRequired(tool="x", price_atoms=5, accepted_rails=())
    # A null rail list decodes as empty; surrounding whitespace is fine.
    found = parse_payment_required(result(' {"error":"payment_required","acceptedRails":null} '))
    assert found is not None
    assert found.accepted_rails == ()


@pytest.mark.parametrize(
    "text",
    [
        '{"error":"rate_limited"}',
        "plain text refusal",
        "",
        "null",
        "[1,2]",
        '{"error":"Payment_Required"}',
        '{"error":"payment_required","priceAtoms":1.5}',
        '{"error":"payment_required","priceAtoms":"500"}',
        '{"error":"payment_required","priceAtoms":1e3}',
        '{"error":"payment_required","priceAtoms":9223372036854775808}',
        '{"error":"payment_required","acceptedRails":"tip"}',
        '{"error":"payment_required"} trailing',
    ],
)
def test_not_a_refusal(text: str) -> None:
    assert parse_payment_required(result(text)) is None


def test_refusal_json_in_a_non_error_result_is_not_a_refusal() -> None:
    assert parse_payment_required(result(GO_EXAMPLE, is_error=False)) is None
    assert parse_payment_required(None) is None
    assert parse_payment_required(CallToolResult(content=[], is_error=True)) is None


@pytest.mark.parametrize(
    "text",
    [
        GO_EXAMPLE.replace('"payment_required"', '"\\u0070ayment_required"'),
        GO_EXAMPLE.replace('"payment_required"', '"payment\\u005frequired"'),
        GO_EXAMPLE.replace('"error"', '"\\u0065rror"'),
        ' \n{"ERROR":"payment_required"}\t',
    ],
)
def test_an_escaped_or_folded_refusal_still_parses(text: str) -> None:
    # The value written with escapes is the same refusal; only a text with
    # neither the literal token nor a backslash is answered without parsing.
    found = parse_payment_required(result(text))
    assert found is not None
    assert found.error == "payment_required"


def test_a_near_token_is_no_refusal() -> None:
    for text in ('{"error":"payment_requirede"}', '{"error":"Payment_required"}', '{"echo":"hello"}'):
        assert parse_payment_required(result(text)) is None
