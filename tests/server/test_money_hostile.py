"""The harness's money paths under hostile input and odd handler behaviour:
each test's docstring names the failure it rules out (a double execution, a
lost refund, a charge for an answer the caller never gets).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from brmcp import RouterOptions
from brmcp.server import CallContext, Harness, HarnessConfig
from tests.kit import is_internal_error, until
from tests.kit.harness import ALICE, call, err_text, served


def _unserializable_harness(data_dir: Path, runs: list[str]) -> Harness:
    harness = Harness(HarnessConfig(data_dir=data_dir, allowed_peers={ALICE}))

    async def odd(ctx: CallContext, args: dict[str, Any]) -> types.CallToolResult:
        runs.append(ctx.call_key or "")
        # Valid as a model, but its JSON cannot be written (bytes that are not UTF-8).
        return types.CallToolResult(content=[], structured_content={"blob": b"\xff\xfe"})

    harness.add_tool(
        "odd", odd, description="paid, returns junk", input_schema={"type": "object"}, price_atoms=500
    )
    harness.add_tool("odd_free", odd, description="free, returns junk", input_schema={"type": "object"})
    return harness


async def test_unserializable_paid_result_is_refunded_and_replayed(tmp_path: Path) -> None:
    """A handler result whose JSON cannot be written used to escape the
    pipeline after the charge: the debit stayed pending until the next
    restart, the key was released, and the caller got an internal error.
    It must be a handler failure: refunded now, recorded as the key's
    outcome, and a retry with the same key must not run again."""
    runs: list[str] = []
    harness = _unserializable_harness(tmp_path, runs)
    with anyio.fail_after(20):
        async with served(harness) as srv, srv.client(ALICE) as s:
            await harness.credit(ALICE, 1_000)
            first = await call(s, "odd", key="hostile-key-0001")
            assert is_internal_error("odd", err_text(first))
            assert await harness.balance(ALICE) == 1_000
            again = await call(s, "odd", key="hostile-key-0001")
            assert again.is_error
            assert runs == ["hostile-key-0001"]
            kinds = [e.kind for e in await harness.statement(ALICE)]
            assert kinds == ["credit", "charge", "refund"]


async def test_unserializable_free_keyed_result_runs_once(tmp_path: Path) -> None:
    """Same for a free keyed call: at most one execution per key."""
    runs: list[str] = []
    harness = _unserializable_harness(tmp_path, runs)
    with anyio.fail_after(20):
        async with served(harness) as srv, srv.client(ALICE) as s:
            first = await call(s, "odd_free", key="hostile-key-0002")
            assert first.is_error
            second = await call(s, "odd_free", key="hostile-key-0002")
            assert second.is_error
            assert runs == ["hostile-key-0002"]


async def test_client_cancel_mid_call_refunds_once_and_never_reruns(tmp_path: Path) -> None:
    """The caller abandons a paid keyed call while the handler runs (the SDK
    sends notifications/cancelled): the charge is refunded exactly once and a
    retry with the same key does not execute the handler a second time."""
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    entered = anyio.Event()
    runs: list[str] = []

    async def slow(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        runs.append(ctx.call_key or "")
        entered.set()
        await anyio.sleep_forever()
        return {}

    harness.add_tool("slow", slow, description="never ends", input_schema={"type": "object"}, price_atoms=300)
    with anyio.fail_after(20):
        async with served(harness) as srv, srv.client(ALICE) as s:
            await harness.credit(ALICE, 1_000)
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, s, "slow", None, "hostile-key-0003")
                await entered.wait()
                assert await harness.balance(ALICE) == 700
                tg.cancel_scope.cancel()

            async def refunded() -> bool:  # once the bot has seen the cancellation
                return [e.kind for e in await harness.statement(ALICE)] == ["credit", "charge", "refund"]

            await until(refunded)
            assert await harness.balance(ALICE) == 1_000
            again = await call(s, "slow", key="hostile-key-0003")
            assert again.is_error
            assert runs == ["hostile-key-0003"]
            assert await harness.balance(ALICE) == 1_000


async def test_result_too_large_for_the_transport_is_refunded(tmp_path: Path) -> None:
    """A paid result larger than the wire can carry (64 parts of chunk_size
    bytes) never reaches the caller: the transport replaces it with an error
    response. It used to be charged (and replayed as the same undeliverable
    result to every retry), so the caller paid for nothing. It must be a
    refunded tool error that names the limit."""
    harness = Harness(
        HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}, router_options=RouterOptions(chunk_size=1024))
    )
    runs: list[str] = []

    async def big(ctx: CallContext, args: dict[str, Any]) -> str:
        runs.append(ctx.call_key or "")
        return "x" * 100_000  # > 64 * 1024 bytes

    harness.add_tool("big", big, description="too big", input_schema={"type": "object"}, price_atoms=200)
    with anyio.fail_after(20):
        async with served(harness) as srv, srv.client(ALICE) as s:
            await harness.credit(ALICE, 1_000)
            result = await call(s, "big", key="hostile-key-0004")
            assert "transport limit" in err_text(result)
            assert await harness.balance(ALICE) == 1_000
            assert [e.kind for e in await harness.statement(ALICE)] == ["credit", "charge", "refund"]
            again = await call(s, "big", key="hostile-key-0004")
            assert "transport limit" in err_text(again)
            assert runs == ["hostile-key-0004"]


def test_fractional_or_non_integer_fixed_price_is_refused(tmp_path: Path) -> None:
    """A fixed price of 1.5 (say, from a JSON config) was accepted: it was
    advertised as ``priceAtoms: 1.5`` (which no Go bridge can decode) and
    debited as a REAL, after which balances read back truncated. Prices are
    whole atoms, as the price-function path already insists."""
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))

    async def handler(ctx: CallContext, args: dict[str, Any]) -> str:
        return "ok"

    for bad in (1.5, 10.0, "10", None):
        with pytest.raises(ValueError, match="price_atoms"):
            harness.add_tool("t", handler, description="", input_schema={"type": "object"}, price_atoms=bad)  # type: ignore[arg-type]
    assert harness.tools() == []
