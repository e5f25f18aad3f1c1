"""Python and the Go reference side by side: PMs per agent-visible call, and
the wire codec's throughput.

Usage: ``python bench/interop_bench.py [--quick]``

Part 1 runs the same agent session (a stock MCP client on the bridge's HTTP
endpoint: initialize + tools/list, ``echo``, a paid ``fortune``, a paid
``dyn``, a 1.3 MB ``blob``) through four pairings on the in-memory fabric:
Python bridge → Go harness, Go bridge → Python harness, Python → Python and
Go → Go, and prints the Bison Relay PMs each agent-visible call cost (both
directions, counted by the fabric). Part 2 times the reference's
``wire.Parse``/``wire.Encode`` (inside the Go process, so no pipe time) and
ours on the same payloads (200 B, 16 KiB, 1 MiB, 12 MiB) and prints MB/s and
the ratio ours/Go. Every timing is the best of several repetitions; MB =
10**6 bytes. Needs the Go reference (see docs/interop.md); exits 2 with the
reason when it is unavailable, 0 otherwise: a report, not a test.
"""

from __future__ import annotations

import argparse
import base64
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from brmcp import wire  # noqa: E402
from brmcp.testing import Fabric, goref  # noqa: E402
from tests.interop.live import (  # noqa: E402
    agent,
    go_bridge,
    go_harness,
    py_bridge,
    py_harness,
)

SID = "0123456789abcdef"
MID = "fedcba9876543210"
EXP = 1783000600
KIB = 1024
MIB = 1024 * KIB
SIZES = [("200 B", 200), ("16 KiB", 16 * KIB), ("1 MiB", MIB), ("12 MiB", 12 * MIB)]
BLOB = 1_300_000
PAIRINGS = [
    ("Python→Go", "py", "go"),
    ("Go→Python", "go", "py"),
    ("Python→Python", "py", "py"),
    ("Go→Go", "go", "go"),
]
CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("initialize + tools/list", "", {}),
    ("echo (free)", "echo", {"text": "hello"}),
    ("fortune (paid, 10,000 atoms)", "fortune", {}),
    ("dyn (paid, priced per call)", "dyn", {"units": 3}),
    ("blob (1.3 MB result)", "blob", {"bytes": BLOB}),
]


async def _pairing(bridge_kind: str, harness_kind: str, binary: Path, tmp: Path) -> list[int]:
    counts: list[int] = []
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric())
        harness_cm: AbstractAsyncContextManager[Any] = (
            go_harness(fabric, binary, tmp / "bot")
            if harness_kind == "go"
            else py_harness(fabric, tmp / "bot")
        )
        harness = await stack.enter_async_context(harness_cm)
        bridge_cm: AbstractAsyncContextManager[Any] = (
            go_bridge(fabric, binary, tmp / "bridge", harness)
            if bridge_kind == "go"
            else py_bridge(fabric, tmp / "bridge", harness)
        )
        bridge = await stack.enter_async_context(bridge_cm)
        before = fabric.stats.pms_delivered
        session = await stack.enter_async_context(agent(bridge.url))
        await session.list_tools()
        counts.append(fabric.stats.pms_delivered - before)
        for _label, tool, args in CALLS[1:]:
            before = fabric.stats.pms_delivered
            result = await session.call_tool(tool, args)
            if result.is_error:
                raise RuntimeError(f"{tool} failed: {result.content}")
            counts.append(fabric.stats.pms_delivered - before)
    return counts


def pm_table(binary: Path) -> None:
    columns: list[list[int]] = []
    for _name, bridge_kind, harness_kind in PAIRINGS:
        with tempfile.TemporaryDirectory() as tmp:
            columns.append(anyio.run(_pairing, bridge_kind, harness_kind, binary, Path(tmp)))
    names = [name for name, _, _ in PAIRINGS]
    width = max(len(label) for label, _, _ in CALLS)
    print("PMs per agent-visible call (bridge → harness, both directions)")
    print(f"  {'call':<{width}}  " + "  ".join(f"{n:>13}" for n in names))
    for i, (label, _, _) in enumerate(CALLS):
        print(f"  {label:<{width}}  " + "  ".join(f"{col[i]:>13}" for col in columns))
    totals = [sum(col) for col in columns]
    print(f"  {'total':<{width}}  " + "  ".join(f"{t:>13}" for t in totals))
    print()


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def codec_table(binary: Path, quick: bool) -> None:
    repeat = 3 if quick else 7
    print("Wire codec throughput, MB/s (ours / the reference; Go timed in-process)")
    heads = "  ".join(f"{h:>10}" for h in ("encode py", "encode go")) + f"  {'ratio':>6}  "
    heads += "  ".join(f"{h:>10}" for h in ("parse py", "parse go")) + f"  {'ratio':>6}"
    print(f"  {'payload':<8}  {heads}")
    with goref.GoWire(binary) as go:
        for label, size in SIZES:
            payload = bytes((i * 131 + 7) & 0xFF for i in range(size))
            parts = wire.encode(payload, sid=SID, exp=EXP, mid=MID)
            rounds = max(1, (4 * MIB) // size) if not quick else max(1, MIB // size)
            case = {
                "sid": SID,
                "payload_b64": base64.b64encode(payload).decode(),
                "exp": EXP,
                "chunk_size": 0,
            }

            def py_encode(payload: bytes = payload, rounds: int = rounds) -> None:
                for _ in range(rounds):
                    wire.encode(payload, sid=SID, exp=EXP)

            def py_parse(parts: list[str] = parts, rounds: int = rounds) -> None:
                for _ in range(rounds):
                    for text in parts:
                        wire.parse(text)

            enc_py = _best(py_encode, repeat)
            par_py = _best(py_parse, repeat)
            enc_go = (
                min(go.request("bench_encode", cases=[case], rounds=rounds)["ns"] for _ in range(repeat))
                / 1e9
            )
            par_go = (
                min(go.request("bench_parse", texts=parts, rounds=rounds)["ns"] for _ in range(repeat)) / 1e9
            )
            mb = size * rounds / 1e6
            print(
                f"  {label:<8}  {mb / enc_py:>10.0f}  {mb / enc_go:>10.0f}  {enc_go / enc_py:>6.2f}"
                f"  {mb / par_py:>10.0f}  {mb / par_go:>10.0f}  {par_go / par_py:>6.2f}"
            )
    print("  ratio = our throughput / the reference's (above 1: ours is faster)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    reason = goref.unavailable_reason()
    if reason is not None:
        print(f"interop bench: {reason}", file=sys.stderr)
        return 2
    binary = goref.build()
    print(f"Go reference at {goref.pinned_commit()} ({binary.name})\n")
    pm_table(binary)
    codec_table(binary, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
