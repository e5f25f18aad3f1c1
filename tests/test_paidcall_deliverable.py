"""Issue 11 §5: the harness's deliverability check uses the real JSON-RPC
response overhead, so small chunk sizes still serve keyed calls, and every
result it charges for fits the transport (it is received, not replaced by
the transport's "exceeds the transport limit" error)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from harness_kit import ALICE, call, err_text, served
from mcp.shared.exceptions import MCPError

from brmcp import RouterOptions
from brmcp.server import CallContext, Harness, HarnessConfig


def _harness(data_dir: Path, chunk_size: int) -> Harness:
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir,
            allowed_peers={ALICE},
            calls_per_minute=100_000,
            router_options=RouterOptions(chunk_size=chunk_size),
        )
    )

    async def echo(ctx: CallContext, args: dict[str, Any]) -> str:
        return "x" * int(args["n"])

    harness.add_tool("echo", echo, description="n x's", input_schema={"type": "object"}, price_atoms=5)
    return harness


@pytest.mark.parametrize("chunk_size", [8, 16])
async def test_tiny_chunk_sizes_serve_keyed_paid_calls(tmp_path: Path, chunk_size: int) -> None:
    """At 16 bytes or less the fixed 1,024-byte allowance refused every keyed call."""
    harness = _harness(tmp_path, chunk_size)
    with anyio.fail_after(30):
        async with served(harness) as srv, srv.client(ALICE) as s:
            await harness.credit(ALICE, 100)
            result = await call(s, "echo", {"n": 3}, key="deliverable-key-01")
            assert not result.is_error, err_text(result)
            assert await harness.balance(ALICE) == 95


@pytest.mark.parametrize("chunk_size", [8, 100])
async def test_the_boundary_is_exact(tmp_path: Path, chunk_size: int) -> None:
    """Around the limit every answer is either the charged result, received
    whole, or a refunded "transport limit" error; the largest delivered
    result comes within a few bytes of 64 x chunk_size."""
    harness = _harness(tmp_path, chunk_size)
    limit = 64 * chunk_size
    delivered: list[int] = []
    refused = 0
    with anyio.fail_after(60):
        async with served(harness) as srv, srv.client(ALICE) as s:
            await harness.credit(ALICE, 10_000)
            # The response wraps the text in about 100 bytes of JSON.
            for n in range(limit - 140, limit - 40):
                balance = await harness.balance(ALICE)
                try:
                    result = await call(s, "echo", {"n": n}, key=f"boundary-key-{n:06d}")
                except MCPError as exc:  # the transport's replacement error: charged for nothing
                    pytest.fail(f"n={n}: result charged but not delivered: {exc}")
                if result.is_error:
                    assert "transport limit" in err_text(result)
                    assert await harness.balance(ALICE) == balance  # refunded
                    refused += 1
                else:
                    assert len(result.content[0].text) == n  # type: ignore[union-attr]
                    assert await harness.balance(ALICE) == balance - 5
                    delivered.append(n)
    assert delivered
    assert refused
    assert max(delivered) + 1 == min(n for n in range(limit - 140, limit - 40) if n not in delivered)
