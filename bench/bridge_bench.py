"""Bridge benchmark: the client bridge's relay cost (PMs per call) and overhead.

Run: ``python bench/bridge_bench.py`` (about half a minute) or ``--quick``.

1. Relay PMs per agent-visible call. An SDK client talks streamable HTTP to
   the bridge's own listener; the bridge relays over the in-memory fabric to
   a ``brmcp.server.Harness`` bot. The PMs on the BR link (both directions)
   are counted per agent-visible request:
   * warm-up (first request: initialize + initialized + tools/list snapshot);
   * ``tools/list`` after warm-up: target 0 (served from the snapshot);
   * a free ``tools/call`` after warm-up: target exactly 2 (one round trip);
   * a first paid call with no balance (call → payment_required, tip,
     reissue → result) and a paid call after a top-up, printed next to the
     Go reference's flow (docs/interop.md §PMs per agent-visible call: 4 and
     2 PMs; the tip itself is not a PM).
2. Local overhead. Sequential free calls per second for (x) a direct SDK
   streamable-HTTP client against a plain SDK ``Server`` with the same tool
   served by its ``streamable_http_app`` on uvicorn, and (y) agent → bridge
   → fabric (zero latency) → harness. Both clients stay open and run short
   batches in alternation, so machine noise hits both alike; the median of
   the per-batch ratios y/x is compared with the 0.5 target.

Prints PASS/MISS per target. Figures are for this machine and run only.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server, ServerRequestContext
from mcp.server.transport_security import TransportSecuritySettings

from brmcp.bridge import Bridge, BridgeConfig, Settings
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, uid

BOT = uid(1)
CLIENT = uid(2)
TOKEN = "bench-token-0123456789abcdef"
OVERHEAD_TARGET = 0.5
FREE_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}}}


# -- the bot: a harness over the fabric --------------------------------------------


def _harness(data_dir: Path) -> Harness:
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir, allowed_peers={CLIENT}, calls_per_minute=10_000_000, name="bench-bot"
        )
    )

    async def free(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"echo": args.get("text", "")}

    async def paid(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"paid": True}

    harness.add_tool("free", free, description="Echo", input_schema=FREE_SCHEMA)
    harness.add_tool("paid", paid, description="Paid", input_schema={"type": "object"}, price_atoms=500)
    return harness


class _CreditingPayer:
    """Pays by crediting the bot's ledger, as a confirmed tip would."""

    def __init__(self) -> None:
        self.harness: Harness | None = None
        self.calls = 0

    async def pay(self, payee_uid: str, atoms: int) -> None:
        assert self.harness is not None
        self.calls += 1
        await self.harness.credit(CLIENT, atoms)


# -- the baseline: a plain SDK server with the same tool over HTTP -----------------


def _plain_server() -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tool = types.Tool(
            name="free", description="Echo", input_schema=FREE_SCHEMA, _meta={"brmcp/priceAtoms": 0}
        )
        return types.ListToolsResult(tools=[tool])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        value = {"echo": (params.arguments or {}).get("text", "")}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(value, separators=(",", ":")))],
            structured_content=value,
        )

    return Server("plain", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


@asynccontextmanager
async def _serve_plain() -> AsyncIterator[str]:
    server = _plain_server()
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        host="127.0.0.1",
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="on", log_config=None, access_log=False, http="h11", ws="none")
    web = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: web.serve(sockets=[sock]))
        while not web.started:  # noqa: ASYNC110  (uvicorn offers only a flag)
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            web.should_exit = True


@asynccontextmanager
async def _client(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def _call(session: ClientSession, tool: str, args: dict[str, Any]) -> types.CallToolResult:
    request = types.CallToolRequest(params=types.CallToolRequestParams(name=tool, arguments=args))
    return await session.send_request(request, types.CallToolResult)


# -- measurements --------------------------------------------------------------------


def _pms(fabric: Fabric) -> int:
    return fabric.link(CLIENT, BOT).pms + fabric.link(BOT, CLIENT).pms


async def _rate(session: ClientSession, calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        result = await _call(session, "free", {"text": f"m{i}"})
        assert not result.is_error
    return calls / (time.perf_counter() - start)


async def main(quick: bool) -> int:
    batches = 6 if quick else 16
    per_batch = 40 if quick else 80
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        payer = _CreditingPayer()
        async with AsyncExitStack() as stack:
            fabric = await stack.enter_async_context(Fabric())
            harness = _harness(root / "bot")
            await stack.enter_async_context(harness)
            bot_router = await harness.start(fabric.sender(BOT))
            fabric.attach(BOT, bot_router.handle_pm)
            payer.harness = harness
            data_dir = root / "bridge"
            settings = Settings(
                enabled=True,
                token=TOKEN,
                mode="autopay",
                per_call_cap_atoms=10_000,
                per_day_cap_atoms=1_000_000,
                allowed_bots=(BOT,),
            )
            data_dir.mkdir()
            (data_dir / "mcpclient.json").write_text(settings.to_json())
            bridge = Bridge(
                BridgeConfig(
                    data_dir=data_dir, sender=fabric.sender(CLIENT), payer=payer, listen="127.0.0.1:0"
                )
            )
            fabric.attach(CLIENT, bridge.handle_pm)
            await stack.enter_async_context(bridge)
            address = bridge.listen_address
            assert address is not None
            url = f"http://{address[0]}:{address[1]}/mcp/{BOT}"

            # 1. PMs per agent-visible request.
            before = _pms(fabric)
            session = await stack.enter_async_context(_client(url, TOKEN))
            warmup = _pms(fabric) - before
            before = _pms(fabric)
            await session.list_tools()
            await session.list_tools()
            list_pms = (_pms(fabric) - before) / 2
            before = _pms(fabric)
            assert not (await _call(session, "free", {"text": "x"})).is_error
            free_pms = _pms(fabric) - before
            before = _pms(fabric)
            assert not (await _call(session, "paid", {})).is_error
            first_paid = _pms(fabric) - before
            await harness.credit(CLIENT, 500)  # a top-up before the call
            paid_before = payer.calls
            before = _pms(fabric)
            assert not (await _call(session, "paid", {})).is_error
            topped_up = _pms(fabric) - before
            assert payer.calls == paid_before

            print("Relay PMs per agent-visible request (both directions on the BR link)")
            print(f"  warm-up (initialize, initialized, tools/list snapshot): {warmup} PMs")
            rows = [
                ("tools/list after warm-up", list_pms, 0, "0 (snapshot)"),
                ("free tools/call after warm-up", free_pms, 2, "2 (one round trip)"),
                (
                    "first paid call, no balance",
                    first_paid,
                    None,
                    "4 (call, payment_required, reissue, result)",
                ),
                ("paid call after a top-up", topped_up, None, "2 (call, result)"),
            ]
            for label, got, target, reference in rows:
                verdict = "" if target is None else ("  PASS" if got == target else "  MISS")
                ok &= target is None or got == target
                print(f"  {label:<32} {got:>4g} PMs   reference: {reference}{verdict}")

            # 2. Local overhead: alternate batches against the two servers.
            plain_url = await stack.enter_async_context(_serve_plain())
            direct = await stack.enter_async_context(_client(plain_url))
            await _rate(direct, 20)
            await _rate(session, 20)
            ratios: list[float] = []
            direct_rates: list[float] = []
            bridge_rates: list[float] = []
            for _ in range(batches):
                x = await _rate(direct, per_batch)
                y = await _rate(session, per_batch)
                direct_rates.append(x)
                bridge_rates.append(y)
                ratios.append(y / x)
            ratio = statistics.median(ratios)
            verdict = "PASS" if ratio >= OVERHEAD_TARGET else "MISS"
            ok &= ratio >= OVERHEAD_TARGET
            print()
            print(f"Sequential free calls/s ({batches} alternating batches of {per_batch})")
            direct_median, bridge_median = statistics.median(direct_rates), statistics.median(bridge_rates)
            print(f"  direct SDK streamable HTTP -> plain SDK Server : {direct_median:8.0f} calls/s")
            print(f"  agent -> bridge -> fabric -> harness           : {bridge_median:8.0f} calls/s")
            print(
                f"  ratio (median of per-batch ratios): {ratio:.2f}  target >= {OVERHEAD_TARGET}  {verdict}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter batches")
    args = parser.parse_args()
    sys.exit(anyio.run(main, args.quick))
