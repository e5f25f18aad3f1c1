"""Bridge building blocks without a network: Go duration text, the test
clock, TipMatcher, the payment_required parser, the Go-compatible JSON and
the spend log file (WIRE.md §Payments; BRIDGE.md §The payment flow, §Spend log
and approvals, §Embedding the library in another daemon; docs/interop.md §Go's JSON rules)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp.types import CallToolResult, ImageContent, TextContent

from brmcp import CALL_KEY, PRICE_ATOMS_KEY, PRICING_KEY, PaymentRequired, parse_payment_required
from brmcp import payment_required_text as pr_text
from brmcp._ops.gojson import dumps
from brmcp.bridge import ManualClock, TipMatcher, go_duration
from brmcp.bridge.base import Settings
from brmcp.bridge.pay import SpendEntry, SpendLog, cap_refusal
from tests.kit.bridge import until

A = "a" * 64
B = "b" * 64
GO_EXAMPLE = (
    '{"error":"payment_required","tool":"fortune","priceAtoms":10000,"balanceAtoms":0,'
    '"shortfallAtoms":10000,"acceptedRails":["tip"]}'
)


# -- go_duration ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (120, "2m0s"),
        (90, "1m30s"),
        (30, "30s"),
        (3600, "1h0m0s"),
        (1, "1s"),
        (0, "0s"),
        (180, "3m0s"),
        (86400, "24h0m0s"),
        (3661, "1h1m1s"),
        (1.5, "1.5s"),
        (0.25, "250ms"),
        (0.0000015, "1.5µs"),
        (-90, "-1m30s"),
    ],
)
def test_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


# -- ManualClock -----------------------------------------------------------------


async def test_manual_clock_wakes_due_sleepers_only() -> None:
    clock = ManualClock(100.0)
    woke: list[float] = []

    async def sleeper(d: float) -> None:
        await clock.sleep(d)
        woke.append(d)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper, 10)
            tg.start_soon(sleeper, 5)
            await until(lambda: clock.sleepers == 2)
            clock.advance(5)
            await until(lambda: woke == [5])
            assert clock.sleepers == 1
            clock.advance(5)
    assert woke == [5, 10]
    assert clock.now() == 110.0
    with pytest.raises(ValueError, match="back"):
        clock.set(50)
    auto = ManualClock(0, auto=True)
    await auto.sleep(3)
    assert (auto.now(), auto.sleeps) == (3.0, [3])


# -- TipMatcher (tipmatcher_test.go) ------------------------------------------------


async def test_tip_matcher() -> None:
    m = TipMatcher()
    assert not m.resolve(A, 1000, None)
    first = m.expect(A, 500_000)
    second = m.expect(A.upper(), 500_000)
    other_amount = m.expect(A, 1_000)
    cancelled = m.expect(B, 7_000)
    cancelled.cancel()
    cancelled.cancel()
    assert not m.resolve(B, 7_000, None)  # a cancelled waiter is never matched
    assert not m.resolve(A, 499_000, None)  # amount mismatch
    assert m.resolve(A.upper(), 500_000, None)
    assert m.resolve(A, 500_000, "no route")
    with anyio.fail_after(1):
        assert await first.wait() is None
        assert await second.wait() == "no route"
    assert first.done
    assert second.error == "no route"
    assert not other_amount.done
    assert m.waiting() == 1
    assert not m.resolve(A, 500_000, None)
    other_amount.cancel()
    assert m.waiting() == 0


# -- payment_required parsing (payment_test.go) ---------------------------------------


def _result(*texts: str, is_error: bool = True) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=t) for t in texts], is_error=is_error)


def test_parse_payment_required_go_cases() -> None:
    assert parse_payment_required(None) is None
    assert parse_payment_required(_result(GO_EXAMPLE, is_error=False)) is None
    found = parse_payment_required(_result(GO_EXAMPLE))
    assert found == PaymentRequired("payment_required", "fortune", 10000, 0, 10000, ("tip",))
    assert parse_payment_required(_result("plain text refusal")) is None
    assert parse_payment_required(_result('{"error":"rate_limited"}')) is None
    after_junk = parse_payment_required(_result("junk", '{"error":"other"}', GO_EXAMPLE))
    assert after_junk is not None
    assert after_junk.tool == "fortune"


def test_parse_payment_required_go_decoding_quirks() -> None:
    folded = parse_payment_required(_result('{"ERROR":"payment_required","PriceAtoms":5,"x":[1]}'))
    assert folded is not None
    assert folded.price_atoms == 5
    assert folded.accepted_rails == ()
    # A non-integer number or a wrong type means "does not decode".
    assert parse_payment_required(_result('{"error":"payment_required","priceAtoms":5.0}')) is None
    assert parse_payment_required(_result('{"error":"payment_required","priceAtoms":5e2}')) is None
    assert parse_payment_required(_result('{"error":"payment_required","tool":7}')) is None
    assert parse_payment_required(_result('{"error":"payment_required","acceptedRails":"tip"}')) is None
    assert (
        parse_payment_required(_result('{"error":"payment_required","priceAtoms":9223372036854775808}'))
        is None
    )
    assert parse_payment_required(_result('{"error":"payment_required"} trailing')) is None
    assert parse_payment_required(_result('{"error":"payment_required","priceAtoms":NaN}')) is None
    # null leaves a field at its zero value; the last duplicate key wins.
    nulls = parse_payment_required(
        _result('{"error":"payment_required","priceAtoms":null,"tool":"a","TOOL":"b"}')
    )
    assert nulls is not None
    assert (nulls.price_atoms, nulls.tool) == (0, "b")
    image = CallToolResult(
        content=[
            ImageContent(type="image", data="", mime_type="image/png"),
            TextContent(type="text", text=GO_EXAMPLE),
        ],
        is_error=True,
    )
    assert parse_payment_required(image) is not None


def test_payment_required_text_is_byte_identical_to_go() -> None:
    assert pr_text("fortune", 10000, 0) == GO_EXAMPLE
    assert pr_text("paid", 500, 200) == (
        '{"error":"payment_required","tool":"paid","priceAtoms":500,"balanceAtoms":200,'
        '"shortfallAtoms":300,"acceptedRails":["tip"]}'
    )
    assert pr_text("a<b>&c", 1, 0, shortfall_atoms=1).startswith(
        '{"error":"payment_required","tool":"a\\u003cb\\u003e\\u0026c",'
    )
    assert (PRICE_ATOMS_KEY, PRICING_KEY, CALL_KEY) == ("brmcp/priceAtoms", "brmcp/pricing", "brmcp/callKey")


@given(
    tool=st.text(max_size=40),
    price=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    balance=st.integers(min_value=-(2**40), max_value=2**40),
)
def test_payment_required_round_trip(tool: str, price: int, balance: int) -> None:
    shortfall = max(-(2**63), min(2**63 - 1, price - balance))
    text = pr_text(tool, price, balance, shortfall_atoms=shortfall)
    parsed = parse_payment_required(_result(text))
    assert parsed is not None
    clean_tool = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in tool)
    assert (parsed.tool, parsed.price_atoms, parsed.balance_atoms, parsed.shortfall_atoms) == (
        clean_tool,
        price,
        balance,
        shortfall,
    )
    assert json.loads(text)["acceptedRails"] == ["tip"]


def test_go_json_escaping() -> None:
    assert (
        dumps({"s": "<&>\u2028\u2029\x01\n\x7f é"})
        == '{"s":"\\u003c\\u0026\\u003e\\u2028\\u2029\\u0001\\n\x7f é"}'
    )
    assert dumps(["\ud800"]) == '["\ufffd"]'


# -- caps and the spend log ------------------------------------------------------------


def test_cap_refusal_texts() -> None:
    s = Settings(per_call_cap_atoms=500, per_day_cap_atoms=1000)
    assert cap_refusal(s, 500, 500) is None  # exact fill
    assert cap_refusal(s, 501, 0) == "501 atoms exceeds the per-call cap (500)"
    assert cap_refusal(s, 500, 1000) == "500 atoms would exceed the daily cap (1000 spent of 1000)"
    assert cap_refusal(Settings(per_call_cap_atoms=0, per_day_cap_atoms=10), 1, 0) == (
        "1 atoms exceeds the per-call cap (0)"
    )
    assert cap_refusal(Settings(per_call_cap_atoms=10, per_day_cap_atoms=-1), 1, 0) == (
        "1 atoms would exceed the daily cap (0 spent of -1)"
    )


def test_spend_log_file_format_and_window(tmp_path: Path) -> None:
    path = tmp_path / "mcpspend.json"
    log = SpendLog(path)
    now = 1_800_000_000
    paid = log.launch(ts=now, bot=A, tool="t", atoms=5)
    log.finish(paid, "paid")
    failed = log.launch(ts=now, bot=A, tool="t", atoms=7)
    log.finish(failed, "failed", "no route")
    log.write(log.prepare(now))
    assert path.read_text() == (
        "[\n"
        "  {\n"
        f'    "ts": {now},\n'
        f'    "bot": "{A}",\n'
        '    "tool": "t",\n'
        '    "rail": "tip",\n'
        '    "atoms": 5,\n'
        '    "status": "paid"\n'
        "  },\n"
        "  {\n"
        f'    "ts": {now},\n'
        f'    "bot": "{A}",\n'
        '    "tool": "t",\n'
        '    "rail": "tip",\n'
        '    "atoms": 7,\n'
        '    "status": "failed",\n'
        '    "err": "no route"\n'
        "  }\n"
        "]"
    )
    assert path.stat().st_mode & 0o777 == 0o600
    reloaded = SpendLog.load(path)
    assert reloaded.entries == log.entries
    assert reloaded.day_total(now) == 5
    assert reloaded.day_total(now + 86400) == 5  # ts >= now - 24h is inside
    assert reloaded.day_total(now + 86401) == 0
    legacy = SpendLog(path, [SpendEntry(ts=now, bot=A, tool="t", atoms=3)])
    assert legacy.day_total(now) == 3
    assert not legacy.resolve(A, 3, None)
    live = legacy.launch(ts=now, bot=A, tool="t", atoms=4)
    assert not legacy.resolve(A, 4, None)  # still being paid by this process
    legacy.finish(live, "pending")
    assert legacy.resolve(A, 4, None)


def test_spend_log_loads_null_and_missing(tmp_path: Path) -> None:
    assert SpendLog.load(tmp_path / "missing.json").entries == ()
    (tmp_path / "null.json").write_text("null")
    assert SpendLog.load(tmp_path / "null.json").entries == ()


def test_strip_reserved_meta() -> None:
    from brmcp.bridge.links import strip_reserved_meta

    meta = {
        "io.modelcontextprotocol/serverInfo": {"name": "x"},
        "progress_token": 7,
        "brmcp/priceAtoms": 5,
        "vendor/key": [1],
    }
    assert strip_reserved_meta(meta) == {"brmcp/priceAtoms": 5, "vendor/key": [1]}
    assert strip_reserved_meta({"progress_token": 1}) is None
    assert strip_reserved_meta(None) is None
