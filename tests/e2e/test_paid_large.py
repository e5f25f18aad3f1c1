"""Large results reach a stock agent. The official Python SDK
client, with its default settings, refuses SSE events over 1 MiB; the
bridge writes a call's answer that is larger than that as an
``application/json`` response, so what it paid for is received, at 1, 2, 8
and 12 MiB (the transport carries up to 64 x 200 KiB = 12.5 MiB)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp.server import CallContext
from tests.kit.bridge import BOT, CLIENT, bridge_env, call

MIB = 1024 * 1024


@pytest.mark.slow
async def test_large_paid_results_reach_the_stock_sdk_client(tmp_path: Path) -> None:
    async with bridge_env(tmp_path) as env:
        runs: list[int] = []

        async def big(ctx: CallContext, args: dict[str, Any]) -> str:
            runs.append(int(args["bytes"]))
            return "x" * int(args["bytes"])

        env.harness.add_tool(
            "big", big, description="n bytes", input_schema={"type": "object"}, price_atoms=7
        )
        with anyio.fail_after(120):
            async with env.session() as session:  # the SDK client's defaults
                sizes = [1 * MIB, 2 * MIB, 8 * MIB, 12 * MIB]
                for size in sizes:
                    result = await call(session, "big", {"bytes": size})
                    assert not result.is_error
                    assert len(result.content[0].text) == size  # type: ignore[union-attr]
        assert runs == sizes
        assert env.payer.calls == [(BOT, 7)] * len(sizes)
        assert await env.harness.balance(CLIENT) == 0


async def test_small_answers_stay_on_the_sse_stream(tmp_path: Path) -> None:
    """Below the limit nothing changes: the answer is an SSE event after the
    priming event (resumable)."""
    async with bridge_env(tmp_path) as env, env.http() as http:
        from tests.e2e.test_paid_resume import _call, _events, _open

        headers = await _open(http)
        with anyio.fail_after(30):
            async with http.stream("POST", f"/mcp/{BOT}", json=_call(4, "free"), headers=headers) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                events = [event async for event in _events(response)]
        assert events[0].get("data", "") == ""
        assert '"id":4' in events[-1]["data"]
