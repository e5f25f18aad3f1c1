"""callKey idempotency and concurrency through the SDK client over the
fabric (WIRE.md §callKey; the Go reference's ``server/harness_test.go``
TestCallKeyIdempotency)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from brmcp import parse_payment_required
from brmcp.server import CallContext, Harness, HarnessConfig
from tests.kit import until
from tests.kit.harness import (
    ALICE,
    BOB,
    Counter,
    call,
    err_text,
    ok_text,
    payment_required_json,
    query,
    served,
    standard_harness,
    text_of,
)
from tests.server.test_epoch import waiting_on


async def test_call_key_idempotency_sequence(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    key = "idem-key-00000001"
    async with served(harness) as srv, srv.client(ALICE) as s:
        # Unfunded: refused, and the refusal is not pinned to the key.
        assert err_text(await call(s, "paid", key=key)) == payment_required_json("paid", 500, 0)
        await harness.credit(ALICE, 1200)
        first = await call(s, "paid", key=key)
        assert json.loads(ok_text(first)) == {"n": 1}
        assert await harness.balance(ALICE) == 700
        assert runs.contexts[0].call_key == key
        # A duplicate: same text, no execution, no debit.
        again = await call(s, "paid", key=key)
        assert text_of(again) == text_of(first)
        assert again.structured_content == first.structured_content
        assert runs.n == 1
        assert await harness.balance(ALICE) == 700
        # A new key executes and charges again.
        assert json.loads(ok_text(await call(s, "paid", key="idem-key-00000002"))) == {"n": 2}
        assert runs.n == 2
        assert await harness.balance(ALICE) == 200
        charges = [e for e in await harness.statement(ALICE) if e.kind == "charge"]
        assert [(e.atoms, e.call_key) for e in charges] == [(-500, key), (-500, "idem-key-00000002")]


async def test_failed_outcome_is_recorded_and_replayed(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 500)
        first = err_text(await call(s, "failing", key="fail-key-0001"))
        # An unexpected exception's own text never reaches the peer.
        assert re.fullmatch(
            r"internal error in tool failing; the operator's log has the details \(ref [0-9a-f]{8}\)", first
        )
        # The error is the outcome: a duplicate replays it without running or charging.
        assert err_text(await call(s, "failing", key="fail-key-0001")) == first
        assert runs.n == 1
        assert await harness.balance(ALICE) == 500


async def test_key_is_scoped_per_peer_not_per_tool(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    key = "shared-key-0001"
    async with served(harness) as srv, srv.client(ALICE) as a, srv.client(BOB) as b:
        await harness.credit(ALICE, 500)
        await harness.credit(BOB, 500)
        alice_text = ok_text(await call(a, "paid", key=key))
        # The same key from another peer is another call.
        bob_text = ok_text(await call(b, "paid", key=key))
        assert json.loads(alice_text) == {"n": 1}
        assert json.loads(bob_text) == {"n": 2}
        # A reused key on another tool replays the first tool's outcome (WIRE.md §callKey).
        assert ok_text(await call(a, "free", {"text": "other"}, key=key)) == alice_text
        assert runs.n == 2


async def test_invalid_call_keys_run_unkeyed(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    invalid: list[Any] = ["short", "x" * 129, "é" * 65, 12345678, ["abcdefgh"], {"k": "abcdefgh"}, True]
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 500 * 2 * len(invalid))
        for key in invalid:
            first = ok_text(await call(s, "paid", key=key))
            second = ok_text(await call(s, "paid", key=key))
            assert first != second  # both executed
        assert runs.n == 2 * len(invalid)
        assert all(c.call_key is None for c in runs.contexts)
        assert await harness.balance(ALICE) == 0
        # Bounds are inclusive and in UTF-8 bytes: 8 and 128 bytes are honoured.
        await harness.credit(ALICE, 1000)
        for key in ("k" * 8, "é" * 64):
            assert ok_text(await call(s, "paid", key=key)) == ok_text(await call(s, "paid", key=key))
        assert runs.n == 2 * len(invalid) + 2


async def test_duplicate_of_refused_call_gets_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Go answers a duplicate of a refused original with an empty success;
    we answer with a tool error that says what happened."""
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    gate = anyio.Event()
    quoted = anyio.Event()
    duplicate_waiting = anyio.Event()
    runs = Counter()
    # Internal hook, only to know when the duplicate waits on the claim.
    registry = harness._calls
    registry_wait = registry.wait

    async def observed_wait(claim: Any) -> types.CallToolResult:
        duplicate_waiting.set()
        return await registry_wait(claim)

    monkeypatch.setattr(registry, "wait", observed_wait)

    async def slow_quote(ctx: CallContext, args: dict[str, Any]) -> int:
        quoted.set()
        await gate.wait()
        return 500

    @harness.tool(price=slow_quote)
    async def pricey(ctx: CallContext) -> dict[str, Any]:
        return {"n": runs(ctx)}

    key = "refused-key-0001"
    results: dict[str, types.CallToolResult] = {}
    async with served(harness) as srv, srv.client(ALICE) as s:

        async def original() -> None:
            results["original"] = await call(s, "pricey", key=key)

        async def duplicate() -> None:
            results["duplicate"] = await call(s, "pricey", key=key)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(original)
                await quoted.wait()  # the original holds the claim, waiting on its price
                tg.start_soon(duplicate)
                # Once the duplicate waits on the claim, refuse the original.
                await duplicate_waiting.wait()
                gate.set()
        assert parse_payment_required(results["original"]) is not None
        # The duplicate delivery is answered exactly as the original: the
        # same payment_required (a caller acts alike on either copy).
        assert results["duplicate"].model_dump() == results["original"].model_dump()
        # The key was released: after a top-up the same key runs for real.
        await harness.credit(ALICE, 500)
        assert json.loads(ok_text(await call(s, "pricey", key=key))) == {"n": 1}
        assert runs.n == 1


async def test_fifty_concurrent_duplicates_execute_and_charge_once(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}, calls_per_minute=1000))
    runs = Counter()
    release = anyio.Event()

    @harness.tool(price_atoms=500)
    async def paid(ctx: CallContext) -> dict[str, Any]:
        n = runs(ctx)
        await release.wait()
        return {"n": n, "charged": ctx.charged_atoms}

    key = "fifty-dups-key-01"
    texts: list[str] = []
    async with served(harness) as srv:
        await harness.credit(ALICE, 1200)
        async with (
            srv.client(ALICE) as s1,
            srv.client(ALICE) as s2,
            srv.client(ALICE) as s3,
            srv.client(ALICE) as s4,
            srv.client(ALICE) as s5,
        ):
            sessions = [s1, s2, s3, s4, s5]
            before = srv.pms

            async def one(i: int) -> None:
                texts.append(ok_text(await call(sessions[i % 5], "paid", key=key)))

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    for i in range(50):
                        tg.start_soon(one, i)
                    # Hold the original until the other 49 wait on its claim.
                    await srv.wait_pms(before + 50)
                    await until(lambda: waiting_on(harness, key) == 49)
                    release.set()
        assert len(texts) == 50
        assert set(texts) == {'{"n":1,"charged":500}'}
        assert runs.n == 1
        assert await harness.balance(ALICE) == 700
        charges = [e for e in await harness.statement(ALICE) if e.kind == "charge"]
        assert len(charges) == 1
    assert query(tmp_path, "SELECT count(*) FROM calls WHERE call_key = ?", (key,)) == [(1,)]


async def test_concurrent_distinct_calls_race_the_balance(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}, calls_per_minute=1000))
    runs = Counter()
    price, balance, callers = 70, 1000, 40

    @harness.tool(price_atoms=price)
    async def paid(ctx: CallContext, i: int) -> dict[str, Any]:
        runs(ctx)
        return {"i": i}

    results: list[types.CallToolResult] = []
    async with served(harness) as srv:
        await harness.credit(ALICE, balance)
        async with srv.client(ALICE) as s1, srv.client(ALICE) as s2, srv.client(ALICE) as s3:
            sessions = [s1, s2, s3]

            async def one(i: int) -> None:
                key = f"race-key-{i:04d}" if i % 2 else None
                results.append(await call(sessions[i % 3], "paid", {"i": i}, key=key))

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    for i in range(callers):
                        tg.start_soon(one, i)
        won = [r for r in results if not r.is_error]
        refused = [parse_payment_required(r) for r in results if r.is_error]
        assert len(won) == balance // price == 14
        assert len(refused) == callers - 14
        assert all(p is not None and p.price_atoms == price and p.balance_atoms < price for p in refused)
        assert runs.n == 14
        final = await harness.balance(ALICE)
        assert final == balance - 14 * price == 20
        statement = await harness.statement(ALICE)
        assert sum(e.atoms for e in statement) == final
        assert statement[-1].balance_after == final
        running = 0
        for entry in statement:
            running += entry.atoms
            assert entry.balance_after == running


def test_the_call_key_of_a_request_meta_and_its_former_name() -> None:
    """``call_key_from_meta`` reads the callKey of a ``tools/call``
    ``_meta`` (None for an invalid one: the call runs unkeyed);
    ``brmcp.server.valid_call_key`` is its former name, still importable,
    warning that it goes away. ``brmcp.protocol.payment.valid_call_key``
    stays the yes/no check of a value."""
    from brmcp.protocol.payment import valid_call_key as is_valid_key
    from brmcp.server import call_key_from_meta, valid_call_key

    meta = {"brmcp/callKey": "k" * 16}
    assert call_key_from_meta(meta) == "k" * 16
    for bad in ({"brmcp/callKey": "short"}, {"brmcp/callKey": 12345678}, {}, None, ["k" * 16]):
        assert call_key_from_meta(bad) is None
    with pytest.warns(DeprecationWarning, match="call_key_from_meta"):
        assert valid_call_key(meta) == "k" * 16
    assert is_valid_key("k" * 16) is True
    assert is_valid_key("short") is False
