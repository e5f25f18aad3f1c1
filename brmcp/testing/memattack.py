"""A hostile allowed peer against a server-role Router, measured in peak RSS
(WIRE.md §Inboxes, SECURITY.md "A hostile peer").

    python -m brmcp.testing.memattack [--yield] [--big N] [--small N] [--json]

The peer sends, across many sids: complete messages of 16 MiB, 4 MiB and
1 MiB (tools/call requests carrying one large string argument), the same
sizes with their last part missing (they stay in reassembly), and thousands
of small complete and incomplete messages, plus 16 MiB messages built to
decode into far more memory than their text (``[[],[],…]``), which must be
refused before decoding. Without ``--yield`` the PMs are fed in one
synchronous run, so no session reader gets to run (inboxes fill up);
with it the feeder yields after every PM and each session's reader drains
its inbox. The process prints its peak RSS growth over the baseline taken
once the attack's own data was built, next to the configured bounds.
Linux only (``/proc/self/status``).
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import anyio
import anyio.lowlevel

from ..transport.conn import Conn
from ..transport.router import Router, RouterOptions

__all__ = ["AttackReport", "main", "run_attack"]

_MIB = 1 << 20
_PEER = "ab" * 32
#: The largest chunk that keeps a 16 MiB message within 64 parts.
_CHUNK = 256 * 1024
#: What the process may hold on top of the configured bounds: the text of the
#: one message being handled (16 MiB), its decoded form while pydantic
#: validates it (at most about 2.5 x the 32 MiB session bound), and allocator
#: slack. Documented in WIRE.md §Inboxes and SECURITY.md.
CONSTANT_MIB = 112


@dataclass
class AttackReport:
    """Figures in MiB unless named otherwise."""

    mode: str
    baseline_mib: float
    peak_growth_mib: float
    bound_mib: float
    assembler_bound_mib: float
    peer_inbox_bound_mib: float
    constant_mib: float
    messages_sent: int
    pms_sent: int
    delivered: int
    inbox_overflows: int
    dropped_too_large: int
    dropped_buffer_full: int
    dropped_session_cap: int
    seconds: float


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


class _NullSender:
    async def send_pm(self, peer: str, text: str) -> None:
        return None


def _request(size: int, n: int) -> bytes:
    head = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":"' % n
    tail = b'"}}}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def _lists(size: int) -> bytes:
    head = b'{"jsonrpc":"2.0","method":"notifications/x","params":{"l":['
    tail = b"[]]}}"
    count = (size - len(head) - len(tail)) // 3
    return head + b"[]," * count + tail


class _Message:
    """The base64 bodies of one payload's parts; PM texts are made per sid/mid."""

    def __init__(self, payload: bytes, chunk: int = _CHUNK) -> None:
        self.size = len(payload)
        view = memoryview(payload)
        self.bodies = [
            base64.b64encode(view[i : i + chunk]).decode("ascii") for i in range(0, len(payload), chunk)
        ]

    def texts(self, sid: str, mid: str, *, drop_last: bool = False) -> list[str]:
        total = len(self.bodies)
        bodies = self.bodies[:-1] if drop_last and total > 1 else self.bodies
        return [f"--mcp[v=1,sid={sid},mid={mid},seq={i}/{total},exp=0]--{b}" for i, b in enumerate(bodies, 1)]


def _sid(n: int) -> str:
    return f"{n:016x}"


async def run_attack(*, yielding: bool, big: int = 24, small: int = 3000) -> AttackReport:
    """Run the attack in this process (see the module doc) and report."""
    options = RouterOptions()
    messages = {
        "16M": _Message(_request(16 * _MIB - 64, 1)),
        "4M": _Message(_request(4 * _MIB, 2)),
        "1M": _Message(_request(1 * _MIB, 3)),
        "lists": _Message(_lists(16 * _MIB - 64)),
        "small": _Message(_request(2048, 4), chunk=1024),
    }

    async def reader(conn: Conn) -> None:
        async for _ in conn.read_stream:
            await anyio.lowlevel.checkpoint()

    async def idle(conn: Conn) -> None:
        await anyio.sleep_forever()

    router = Router(
        _NullSender(), accept=reader if yielding else idle, allow=lambda peer: True, options=options
    )
    plan: list[tuple[str, int, bool]] = []  # (kind, sid number, incomplete)

    def flood(rounds: int, smalls: int) -> None:
        for i in range(rounds):
            plan.append(("16M", i % 40, False))
            plan.append(("4M", (i * 7) % 40, False))
            plan.append(("1M", (i * 11) % 40, False))
            if i % 4 == 0:
                plan.append(("lists", (i * 13) % 40, False))
            for j in range(smalls // max(rounds, 1)):
                plan.append(("small", (i + j) % 40, False))

    # Complete messages of every size across 40 sids; then messages left
    # incomplete (two 16 MiB, three 4 MiB, two small: 7 of the 8 pending
    # slots, 44 MiB), which stay in reassembly; then the complete flood again
    # on top of them; then thousands of small incomplete messages, refused
    # once the last pending slot is taken.
    flood(big, small)
    plan += [("16M", 100, True), ("16M", 101, True)] + [("4M", 102 + k, True) for k in range(3)]
    plan += [("small", 110 + k, True) for k in range(2)]  # 7 of the peer's 8 pending slots
    flood(big, small)
    plan += [("small", 120 + (k % 30), True) for k in range(small)]  # refused: no slot left
    gc.collect()
    baseline = _status("VmRSS")
    reset = _reset_peak()
    started = time.perf_counter()
    pms = 0
    async with router:
        for n, (kind, sid, incomplete) in enumerate(plan):
            for text in messages[kind].texts(_sid(sid), _sid(n + 1), drop_last=incomplete):
                router.handle_pm(_PEER, text)
                pms += 1
                if yielding:
                    await anyio.lowlevel.checkpoint()
        if yielding:
            for _ in range(200):
                await anyio.lowlevel.checkpoint()
        seconds = time.perf_counter() - started
        peak = _status("VmHWM")
        growth = peak - (baseline if reset else 0) if reset else peak - baseline
        stats = router.stats
        cfg = options.assembler.resolved()
        peer_inbox = getattr(options, "peer_inbox_bytes", 64 * _MIB)
        bound = cfg.max_total_bytes + peer_inbox + CONSTANT_MIB * _MIB
        report = AttackReport(
            mode="reader yielding" if yielding else "reader not yielding",
            baseline_mib=baseline / _MIB,
            peak_growth_mib=max(growth, 0) / _MIB,
            bound_mib=bound / _MIB,
            assembler_bound_mib=cfg.max_total_bytes / _MIB,
            peer_inbox_bound_mib=peer_inbox / _MIB,
            constant_mib=CONSTANT_MIB,
            messages_sent=len(plan),
            pms_sent=pms,
            delivered=stats.messages_delivered,
            inbox_overflows=stats.inbox_overflows,
            dropped_too_large=stats.dropped_too_large,
            dropped_buffer_full=stats.dropped_buffer_full,
            dropped_session_cap=stats.dropped_session_cap,
            seconds=seconds,
        )
        router.close()
    return report


def main(argv: list[str] | None = None) -> int:
    """Console entry point: prints the report (text, or one JSON object)."""
    parser = argparse.ArgumentParser(prog="python -m brmcp.testing.memattack")
    parser.add_argument("--yield", dest="yielding", action="store_true", help="let session readers run")
    parser.add_argument("--big", type=int, default=24, help="rounds of large messages (default 24)")
    parser.add_argument("--small", type=int, default=3000, help="small messages (default 3000)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report = anyio.run(lambda: run_attack(yielding=args.yielding, big=args.big, small=args.small))
    data: dict[str, Any] = asdict(report)
    if args.json:
        print(json.dumps(data))
    else:
        for key, value in data.items():
            print(f"{key:22s} {value:.1f}" if isinstance(value, float) else f"{key:22s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
