"""The paid tool gate and the per-call pipeline, through the official SDK
client over the fabric (WIRE.md §Payments; the Go reference's
``server/harness_test.go`` TestPaidToolGate, ``server/ratelimit_test.go``
TestRateLimit, ``server/visibility_test.go`` TestToolVisibility)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import pytest
from mcp.shared.exceptions import MCPError
from pydantic import Field

from brmcp import parse_payment_required, wire
from brmcp.server import RATE_LIMITED_TEXT, CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric
from tests.kit import is_internal_error, until
from tests.kit.harness import (
    ADMIN,
    ALICE,
    BOB,
    BOT,
    Counter,
    call,
    err_text,
    ok_text,
    payment_required_json,
    served,
    standard_harness,
)


async def test_tools_list_advertises_prices_in_meta(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)

    async def quote(ctx: CallContext, args: dict[str, Any]) -> int:
        return 7

    @harness.tool(price=quote, description="Priced per call")
    async def dynamic(ctx: CallContext) -> dict[str, Any]:
        return {}

    async with served(harness) as srv, srv.client(ALICE) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
    assert tools["paid"].meta == {"brmcp/priceAtoms": 500}
    # Free tools advertise 0 rather than looking dynamic (WIRE.md §Payments).
    assert tools["free"].meta == {"brmcp/priceAtoms": 0}
    assert tools["dynamic"].meta == {"brmcp/pricing": "dynamic"}
    assert tools["paid"].input_schema == {"type": "object", "additionalProperties": False}
    assert tools["free"].input_schema["properties"] == {"text": {"default": "", "type": "string"}}


async def test_unfunded_call_gets_exact_payment_required(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        result = await call(s, "paid")
        assert result.is_error
        assert result.structured_content is None
        assert err_text(result) == (
            '{"error":"payment_required","tool":"paid","priceAtoms":500,"balanceAtoms":0,'
            '"shortfallAtoms":500,"acceptedRails":["tip"]}'
        )
        refusal = parse_payment_required(result)
        assert refusal is not None
        assert (refusal.tool, refusal.price_atoms, refusal.shortfall_atoms) == ("paid", 500, 500)
        assert refusal.accepted_rails == ("tip",)
        assert runs.n == 0
        assert await harness.statement(ALICE) == []


async def test_partial_balance_reports_balance_and_shortfall(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 123)
        assert err_text(await call(s, "paid")) == payment_required_json("paid", 500, 123)
        assert await harness.balance(ALICE) == 123
        assert runs.n == 0


async def test_funded_call_succeeds_and_debits(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 600)
        result = await call(s, "paid")
        assert json.loads(ok_text(result)) == {"n": 1}
        assert result.structured_content == {"n": 1}
        assert await harness.balance(ALICE) == 100
        assert runs.contexts[0].charged_atoms == 500
        assert runs.contexts[0].peer == ALICE
        assert runs.contexts[0].tool == "paid"
        assert runs.contexts[0].call_key is None


async def test_failing_handler_is_error_and_refunded(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 500)
        result = await call(s, "failing")
        assert is_internal_error("failing", err_text(result))
        assert result.structured_content is None
        assert runs.n == 1
        assert await harness.balance(ALICE) == 500
        kinds = [(e.kind, e.atoms, e.balance_after) for e in await harness.statement(ALICE)]
        assert kinds == [("credit", 500, 500), ("charge", -500, 0), ("refund", 500, 500)]


async def test_free_tool_never_touches_the_ledger(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        assert json.loads(ok_text(await call(s, "free", {"text": "hi"}))) == {"text": "hi"}
        assert runs.contexts[0].charged_atoms == 0
        assert await harness.statement(ALICE) == []


async def test_dynamic_price_is_charged_and_seen_by_handler(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    runs = Counter()
    quotes: list[tuple[CallContext, dict[str, Any]]] = []

    async def per_word(ctx: CallContext, args: dict[str, Any]) -> int:
        quotes.append((ctx, args))
        return 10 * len(str(args["text"]).split())

    @harness.tool(price=per_word, description="10 atoms per word")
    async def shout(ctx: CallContext, text: str) -> dict[str, Any]:
        runs(ctx)
        return {"text": text.upper(), "paid": ctx.charged_atoms}

    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 45)
        assert json.loads(ok_text(await call(s, "shout", {"text": "a b c"}))) == {"text": "A B C", "paid": 30}
        # 15 left: a 2-word call (20) is refused with the dynamic price in the JSON.
        assert err_text(await call(s, "shout", {"text": "x y"})) == payment_required_json("shout", 20, 15)
        # An empty text costs 0: the free path (no debit, no journal).
        assert json.loads(ok_text(await call(s, "shout", {"text": ""}))) == {"text": "", "paid": 0}
        assert await harness.balance(ALICE) == 15
    # The price function sees the JSON arguments and a context without a charge.
    assert [q[1] for q in quotes] == [{"text": "a b c"}, {"text": "x y"}, {"text": ""}]
    assert all(q[0].charged_atoms == 0 and q[0].peer == ALICE for q in quotes)
    assert [c.charged_atoms for c in runs.contexts] == [30, 0]


async def test_price_function_errors_are_tool_errors_without_charge(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    runs = Counter()
    mode = {"value": "raise"}

    def quote(ctx: CallContext, args: dict[str, Any]) -> Any:
        if mode["value"] == "raise":
            raise LookupError("no quote for this request")
        if mode["value"] == "silent":
            raise LookupError()
        if mode["value"] == "text":
            return "12"
        return 12

    @harness.tool(price=quote)
    async def quoted(ctx: CallContext) -> dict[str, Any]:
        return {"n": runs(ctx)}

    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 100)
        key = "price-key-0001"
        assert is_internal_error("quoted", err_text(await call(s, "quoted", key=key)))
        mode["value"] = "silent"
        assert is_internal_error("quoted", err_text(await call(s, "quoted", key=key)))
        mode["value"] = "text"
        assert err_text(await call(s, "quoted", key=key)) == (
            "price function returned str, not an integer number of atoms"
        )
        assert runs.n == 0
        assert await harness.balance(ALICE) == 100
        # Each refusal released the key: the same key now runs for real.
        mode["value"] = "ok"
        assert json.loads(ok_text(await call(s, "quoted", key=key))) == {"n": 1}
        assert await harness.balance(ALICE) == 88


async def test_invalid_arguments_never_charge_nor_consume_tokens(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}, calls_per_minute=1))
    runs = Counter()
    priced = Counter()

    def price(ctx: CallContext, args: dict[str, Any]) -> int:
        priced(ctx)
        return 50

    @harness.tool(price=price)
    async def lookup(ctx: CallContext, n: int, tag: str = "") -> dict[str, Any]:
        return {"n": n, "runs": runs(ctx)}

    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 1000)
        bad: list[tuple[dict[str, Any], str]] = [
            ({}, "validating \"arguments\": 'n' is a required property"),
            ({"n": "7"}, "validating \"arguments\" at /n: '7' is not of type 'integer'"),
            ({"n": 1.5}, "validating \"arguments\" at /n: 1.5 is not of type 'integer'"),
            ({"n": True}, "validating \"arguments\" at /n: True is not of type 'integer'"),
            ({"n": 1, "tag": 5}, "validating \"arguments\" at /tag: 5 is not of type 'string'"),
            (
                {"n": 1, "extra": 1},
                "validating \"arguments\": Additional properties are not allowed ('extra' was unexpected)",
            ),
        ]
        for args, expected in bad:
            # Keyed or not: validation comes before the key claim too.
            assert err_text(await call(s, "lookup", args, key="bad-args-key")) == expected
        assert priced.n == 0
        assert runs.n == 0
        assert [e.kind for e in await harness.statement(ALICE)] == ["credit"]
        # The single token (CPM 1) is still there.
        assert json.loads(ok_text(await call(s, "lookup", {"n": 3}, key="bad-args-key"))) == {
            "n": 3,
            "runs": 1,
        }
        assert err_text(await call(s, "lookup", {"n": 4})) == RATE_LIMITED_TEXT
        assert await harness.balance(ALICE) == 950


async def test_hostile_arguments_get_readable_errors(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    runs = Counter()

    @harness.tool(price_atoms=5)
    async def bounded(
        ctx: CallContext, text: Annotated[str, Field(max_length=64)], counts: dict[str, int] | None = None
    ) -> dict[str, Any]:
        return {"n": runs(ctx)}

    tree_schema = {
        "type": "object",
        "properties": {"tree": {"$ref": "#/$defs/node"}},
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"a": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/node"}]}},
                "additionalProperties": False,
            }
        },
        "additionalProperties": False,
    }

    async def tree_handler(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"n": runs(ctx)}

    harness.add_tool(
        "tree", tree_handler, description="nested input", input_schema=tree_schema, price_atoms=5
    )

    def nested(depth: int, leaf: Any) -> dict[str, Any]:
        value: Any = leaf
        for _ in range(depth):
            value = {"a": value}
        return value  # type: ignore[no-any-return]

    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 100)
        huge = "A" * 300_000
        message = err_text(await call(s, "bounded", {"text": huge}))
        assert message.startswith('validating "arguments" at /text: \'AAAA')
        assert message.endswith("is too long") or "…" in message
        assert len(message) < 1000
        # A long key in a wrong place: the message stays short.
        message = err_text(await call(s, "bounded", {"text": "ok", "k" * 100_000: 1}))
        assert message.startswith('validating "arguments": Additional properties are not allowed')
        assert len(message) < 1000
        # A long key inside the error's path: the path is shortened too.
        message = err_text(await call(s, "bounded", {"text": "ok", "counts": {"k" * 100_000: "x"}}))
        assert message.startswith('validating "arguments" at /counts/kkkk')
        assert message.endswith(": 'x' is not of type 'integer'")
        assert len(message) < 1000
        # Deep nesting with a bad leaf: readable, bounded, never a crash.
        for depth in (5, 120, 180):
            message = err_text(await call(s, "tree", {"tree": nested(depth, "leaf")}))
            assert message.startswith('validating "arguments"'), message
            assert len(message) < 1000
        assert json.loads(ok_text(await call(s, "tree", {"tree": nested(20, 1)}))) == {"n": 1}
        assert runs.n == 1
        assert await harness.balance(ALICE) == 95


async def test_handler_exceptions_leak_only_their_message(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    secret = "/srv/secret/path.py"

    def deep_failure() -> None:
        local_secret = secret  # visible in a traceback, never in the result
        raise ValueError(f"upstream refused ({len(local_secret)})")

    @harness.tool(price_atoms=10)
    async def fragile(ctx: CallContext, kind: str) -> dict[str, Any]:
        if kind == "value":
            deep_failure()
        if kind == "empty":
            raise KeyError
        if kind == "not-json":
            return {"when": object()}
        return {"ok": True}

    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 100)
        texts = [err_text(await call(s, "fragile", {"kind": k})) for k in ("value", "empty", "not-json")]
        assert texts[0] == f"upstream refused ({len(secret)})"
        assert is_internal_error("fragile", texts[1])
        assert is_internal_error("fragile", texts[2])
        for text in texts:
            assert "Traceback" not in text
            assert secret not in text
            assert ".py" not in text
        # Every failure was refunded.
        assert await harness.balance(ALICE) == 100


async def test_output_schema_violation_is_a_refunded_error(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))

    @harness.tool(
        price_atoms=10,
        output_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    )
    async def typed(ctx: CallContext, good: bool) -> dict[str, Any]:
        return {"n": 1} if good else {"n": "one"}

    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 100)
        assert ok_text(await call(s, "typed", {"good": True})) == '{"n":1}'
        text = err_text(await call(s, "typed", {"good": False}))
        assert text.startswith("tool output does not match its output schema")
        assert await harness.balance(ALICE) == 90


async def test_rate_limit_per_peer(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, calls_per_minute=2)
    async with served(harness) as srv, srv.client(ALICE) as a, srv.client(BOB) as b:
        assert not (await call(a, "free")).is_error
        assert not (await call(a, "free")).is_error
        third = await call(a, "free")
        assert err_text(third) == "rate limited; retry later"
        assert third.structured_content is None
        # Another peer has its own bucket.
        assert not (await call(b, "free")).is_error
        assert not (await call(b, "free")).is_error
        assert err_text(await call(b, "free")) == RATE_LIMITED_TEXT
        # tools/list and initialize do not consume tokens.
        await a.list_tools()
        assert runs.n == 4


async def test_rate_limit_before_price_and_charge(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, calls_per_minute=1)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 1000)
        assert not (await call(s, "paid")).is_error
        assert err_text(await call(s, "paid")) == RATE_LIMITED_TEXT
        assert await harness.balance(ALICE) == 500
        assert runs.n == 1


async def test_keyed_duplicates_do_not_consume_tokens(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, calls_per_minute=2)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 5000)
        first = ok_text(await call(s, "paid", key="dup-token-key"))
        for _ in range(5):
            assert ok_text(await call(s, "paid", key="dup-token-key")) == first
        # The duplicates were free of tokens: one more call fits, then the limit.
        assert not (await call(s, "paid", key="second-token-key")).is_error
        assert err_text(await call(s, "paid", key="third-token-key")) == RATE_LIMITED_TEXT
        assert runs.n == 2
        assert await harness.balance(ALICE) == 4000


async def test_rate_limit_refusal_releases_the_key(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, calls_per_minute=1)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 5000)
        assert not (await call(s, "paid")).is_error
        assert err_text(await call(s, "paid", key="limited-key-01")) == RATE_LIMITED_TEXT
        # Hot reload: a fast refill gives tokens back within milliseconds.
        harness.set_calls_per_minute(60_000)
        assert harness.calls_per_minute == 60_000
        answers: list[Any] = []

        async def runs_now() -> bool:
            result = await call(s, "paid", key="limited-key-01")
            if result.is_error:
                assert err_text(result) == RATE_LIMITED_TEXT
                return False
            answers.append(result)
            return True

        await until(runs_now, limit=10)
        # The refused attempt was not pinned to the key: it executed now.
        assert json.loads(text := ok_text(answers[0])) == {"n": 2}
        assert ok_text(await call(s, "paid", key="limited-key-01")) == text
        assert runs.n == 2


async def test_hot_reload_lowers_the_rate_limit(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        assert harness.calls_per_minute == 30
        assert not (await call(s, "free")).is_error
        harness.set_calls_per_minute(1)
        # Existing buckets are capped to the new capacity: one more call, then refused.
        assert not (await call(s, "free")).is_error
        assert err_text(await call(s, "free")) == RATE_LIMITED_TEXT
        harness.set_calls_per_minute(0)  # <= 0 selects the default
        assert harness.calls_per_minute == 30
        assert runs.n == 2


async def test_hot_reload_of_allowed_peers(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, allowed_peers={ALICE})
    async with served(harness) as srv:
        # Bob is not allowed: his PMs are dropped and his tips held, not credited.
        assert await harness.credit_tip(BOB, 5000, 1) == 0
        assert [t.atoms for t in await harness.held_tips(BOB)] == [5]
        denied = False
        try:
            async with srv.client(BOB, read_timeout=0.5):
                pass
        except* MCPError as group:
            denied = all("timed out" in str(e) for e in group.exceptions)
        assert denied
        assert srv.router.stats.dropped_denied > 0
        harness.set_allowed_peers({ALICE, BOB})
        assert harness.allowed(BOB)
        # His next tip credits itself, and the held one once.
        assert await harness.credit_tip(BOB, 5000, 2) == 5
        assert await harness.held_tips(BOB) == []
        async with srv.client(BOB) as b:
            assert not (await call(b, "free")).is_error
        # Removing Alice takes effect for her next PM.
        async with srv.client(ALICE) as a:
            assert not (await call(a, "free")).is_error
            harness.set_allowed_peers({BOB})
            assert await harness.credit_tip(ALICE, 5000, 3) == 0
            with pytest.raises(MCPError, match="timed out"):
                await a.call_tool("free", {}, read_timeout_seconds=0.5)
        assert runs.n == 2
        assert await harness.balance(ALICE) == 0
        assert [t.atoms for t in await harness.held_tips(ALICE)] == [5]
        assert await harness.balance(BOB) == 10


async def test_allow_function_replaces_the_allowlist(tmp_path: Path) -> None:
    seen: list[str] = []

    def allow(peer: str) -> bool:
        seen.append(peer)
        return peer != BOB

    harness, runs = standard_harness(tmp_path, allowed_peers=set(), allow=allow)
    harness.set_allowed_peers({BOB})  # ignored while allow is set
    assert harness.allowed(ALICE)
    assert harness.allowed(ADMIN)
    assert not harness.allowed(BOB)
    async with served(harness) as srv, srv.client(ALICE) as s:
        assert not (await call(s, "free")).is_error
        assert await harness.credit_tip(ADMIN, 2000, 1) == 2
        assert await harness.credit_tip(BOB, 2000, 2) == 0
    assert ALICE in seen
    assert runs.n == 1


async def test_visibility_hides_admin_tool(tmp_path: Path) -> None:
    def visible(peer: str, tool: str) -> bool:
        return tool != "admin_only" or peer == ADMIN

    harness = Harness(HarnessConfig(data_dir=tmp_path, allow=lambda peer: True, tool_visible=visible))
    runs = Counter()

    @harness.tool(description="operators only")
    async def admin_only(ctx: CallContext) -> dict[str, Any]:
        return {"n": runs(ctx)}

    @harness.tool(description="everyone")
    async def public(ctx: CallContext) -> dict[str, Any]:
        return {"ok": True}

    async with served(harness) as srv, srv.client(ADMIN) as admin, srv.client(ALICE) as user:
        assert sorted(t.name for t in (await admin.list_tools()).tools) == ["admin_only", "public"]
        assert json.loads(ok_text(await call(admin, "admin_only"))) == {"n": 1}
        assert [t.name for t in (await user.list_tools()).tools] == ["public"]
        with pytest.raises(MCPError) as info:
            await call(user, "admin_only")
        assert info.value.error.code == -32602
        assert info.value.error.message == 'unknown tool "admin_only"'
        with pytest.raises(MCPError) as info:
            await call(user, "no_such_tool")
        assert info.value.error.message == 'unknown tool "no_such_tool"'
        assert runs.n == 1


async def test_refused_caller_is_logged_once_not_per_part(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller outside the allowlist gets no answer, so the operator is told
    (once per peer, not per PM) who is being ignored."""
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    caplog.set_level(logging.WARNING, logger="brmcp.server")
    async with Fabric() as fabric, harness:
        router = await harness.start(fabric.sender(BOT))
        for _ in range(5):
            for text in wire.encode(b'{"jsonrpc":"2.0","id":1,"method":"ping"}', sid="ab", exp=0):
                router.handle_pm(BOB, text)
        assert router.stats.dropped_denied == 5
        assert router.session_count == 0
    warnings = [r for r in caplog.records if "not an allowed caller" in r.getMessage()]
    assert len(warnings) == 1
    assert BOB in warnings[0].getMessage()
