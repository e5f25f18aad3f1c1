"""The harness's deliverability check uses the real JSON-RPC
response overhead, so small chunk sizes still serve keyed calls, and every
result it charges for fits the transport (it is received, not replaced by
the transport's "exceeds the transport limit" error)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from brmcp import RouterOptions
from brmcp.server import CallContext, Harness, HarnessConfig
from tests.kit import pm_parts
from tests.kit.harness import ALICE, BOT, call, err_text, served


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
    """Every answer is either the charged result, received whole, or a
    refunded "transport limit" error; the largest delivered result's
    response fills the 64 parts to within a few bytes (the allowance is the
    real wrapper, not a 1,024-byte guess)."""
    harness = _harness(tmp_path, chunk_size)
    limit = 64 * chunk_size
    sizes: dict[str, int] = {}

    def measure(sender: str, to: str, text: str) -> None:
        for part in pm_parts(text):
            if sender == BOT:
                sizes[part.mid] = sizes.get(part.mid, 0) + len(part.chunk)

    with anyio.fail_after(60):
        async with served(harness) as srv, srv.client(ALICE) as s:
            srv.fabric.add_tap(measure)
            await harness.credit(ALICE, 100_000)

            keys = iter(range(1_000_000))

            async def delivers(n: int) -> tuple[bool, int]:
                balance = await harness.balance(ALICE)
                sizes.clear()
                try:
                    result = await call(s, "echo", {"n": n}, key=f"boundary-key-{next(keys):06d}")
                except MCPError as exc:  # the transport's replacement error: charged for nothing
                    pytest.fail(f"n={n}: result charged but not delivered: {exc}")
                size = max(sizes.values())
                if result.is_error:
                    assert "transport limit" in err_text(result)
                    assert await harness.balance(ALICE) == balance  # refunded
                    return False, size
                assert len(result.content[0].text) == n  # type: ignore[union-attr]
                assert await harness.balance(ALICE) == balance - 5
                return True, size

            low, high = 1, limit  # delivers(low) holds, delivers(high) does not
            assert (await delivers(low))[0]
            assert not (await delivers(high))[0]
            while high - low > 1:
                mid = (low + high) // 2
                if (await delivers(mid))[0]:
                    low = mid
                else:
                    high = mid
            ok, size = await delivers(low)
            assert ok
            # The check measures the harness's JSON of the result, which
            # carries ``"resultType":"complete"`` (24 bytes) that the SDK drops
            # on the wire: it errs on the safe side by that much, no more.
            assert limit - 32 <= size <= limit
