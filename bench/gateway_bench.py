"""Gateway benchmark: the latency a brmcp gateway adds to a tool
call, against a native tool on the same fabric.

Run: ``python bench/gateway_bench.py`` (about half a minute) or ``--quick``.

Two bots on one in-memory fabric (no simulated latency), each called by its
own SDK client session over BR-style PM sessions:

* ``native``: a Harness whose tool ``get_current_time`` computes the same
  answer as mcp-server-time's, in-process;
* ``gateway``: a Harness + :class:`~brmcp.gateway.Gateway` in front of
  ``mcp-server-time`` (stdio subprocess, official SDK on both sides), whose
  tool of the same name is forwarded to it.

Both tools are free (so the ledger is not part of the comparison; a paid
call adds the same two durable commits on either path). Calls alternate in
short batches so load on a shared machine hits both alike. Also timed: the
same call made directly to the upstream over its stdio session (the hop the
gateway adds). Prints the medians, the added milliseconds and the ratio
gateway/native. Figures are for this machine and run only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import mcp.types as types
from mcp import ClientSession

from brmcp.gateway import Gateway, PriceTable, UpstreamConfig
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, uid

NATIVE = uid(1)
GATEWAY = uid(2)
CALLER = uid(3)


def _time_server() -> list[str]:
    search = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    exe = shutil.which("mcp-server-time", path=search)
    if exe is None:
        raise SystemExit("mcp-server-time is not installed (pip install -e '.[test]')")
    return [exe, "--local-timezone", "UTC"]


def _native_harness(data_dir: Path) -> Harness:
    harness = Harness(HarnessConfig(data_dir=data_dir, allowed_peers={CALLER}, calls_per_minute=10**9))

    @harness.tool(description="Get current time in a specific timezone")
    async def get_current_time(ctx: CallContext, timezone: str) -> dict[str, Any]:
        now = datetime.now(ZoneInfo(timezone))
        return {
            "timezone": timezone,
            "datetime": now.isoformat(timespec="seconds"),
            "day_of_week": now.strftime("%A"),
            "is_dst": bool(now.dst()),
        }

    return harness


async def _call(session: ClientSession) -> float:
    request = types.CallToolRequest(
        params=types.CallToolRequestParams(name="get_current_time", arguments={"timezone": "Europe/Paris"})
    )
    started = time.perf_counter()
    result = await session.send_request(request, types.CallToolResult)
    elapsed = time.perf_counter() - started
    if result.is_error:
        raise RuntimeError(f"call failed: {result}")
    return elapsed


async def run(calls: int, batch: int) -> None:
    with tempfile.TemporaryDirectory(prefix="brmcp-gateway-bench-") as tmp:
        root = Path(tmp)
        async with AsyncExitStack() as stack:
            fabric = await stack.enter_async_context(Fabric())
            native = _native_harness(root / "native")
            gated = Harness(
                HarnessConfig(
                    data_dir=root / "gateway",
                    allowed_peers={CALLER},
                    calls_per_minute=10**9,
                    tools_list_changed=True,
                )
            )
            errlog = stack.enter_context(open(os.devnull, "w"))  # noqa: SIM115, ASYNC230
            gateway = Gateway(
                gated, UpstreamConfig(command=tuple(_time_server())), PriceTable(), errlog=errlog
            )
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            await tg.start(gateway.run)
            for bot, harness in ((NATIVE, native), (GATEWAY, gated)):
                await stack.enter_async_context(harness)
                router = await harness.start(fabric.sender(bot))
                fabric.attach(bot, router.handle_pm)
            caller = await stack.enter_async_context(fabric.router(CALLER))
            sessions: dict[str, ClientSession] = {}
            for name, bot in (("native", NATIVE), ("gateway", GATEWAY)):
                conn = caller.dial(bot)
                session = await stack.enter_async_context(ClientSession(conn.read_stream, conn.write_stream))
                await session.initialize()
                sessions[name] = session
            upstream, _ = await gateway.upstream.ready()
            times: dict[str, list[float]] = {"native": [], "gateway": [], "upstream direct": []}

            async def direct() -> float:
                started = time.perf_counter()
                await upstream.send_request(
                    types.CallToolRequest(
                        params=types.CallToolRequestParams(
                            name="get_current_time", arguments={"timezone": "Europe/Paris"}
                        )
                    ),
                    types.CallToolResult,
                )
                return time.perf_counter() - started

            for _ in range(5):  # warm up every path
                await _call(sessions["native"])
                await _call(sessions["gateway"])
                await direct()
            done = 0
            while done < calls:
                for _ in range(batch):
                    times["native"].append(await _call(sessions["native"]))
                for _ in range(batch):
                    times["gateway"].append(await _call(sessions["gateway"]))
                for _ in range(batch):
                    times["upstream direct"].append(await direct())
                done += batch
            tg.cancel_scope.cancel()

    print(f"{calls} calls per path, batches of {batch}, free tool get_current_time, fabric without latency")
    print(f"{'path':<18} {'median ms':>10} {'p90 ms':>8} {'min ms':>8}")
    medians: dict[str, float] = {}
    for name, samples in times.items():
        samples.sort()
        medians[name] = statistics.median(samples)
        p90 = samples[int(len(samples) * 0.9) - 1]
        print(f"{name:<18} {medians[name] * 1000:>10.2f} {p90 * 1000:>8.2f} {samples[0] * 1000:>8.2f}")
    added = medians["gateway"] - medians["native"]
    print()
    print(f"added by the gateway: {added * 1000:.2f} ms per call (median)")
    print(f"ratio gateway/native: {medians['gateway'] / medians['native']:.2f}")
    hop = medians["upstream direct"] * 1000
    print(f"upstream hop alone (stdio, SDK client to mcp-server-time): {hop:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 calls per path instead of 300")
    args = parser.parse_args()
    anyio.run(run, 60 if args.quick else 300, 10)


if __name__ == "__main__":
    main()
