"""CPU and memory of our harness and transport against the Go reference's, in
one run and in the same conditions.

Usage: ``python bench/cpu_vs_go.py [--quick] [--runs N] [--baseline DIR]
[--profile DIR]`` (about five minutes; ``--quick`` about two).

Both servers run as a separate process attached to the same in-memory
fabric through the same JSON-lines pipe (:class:`brmcp.testing.pipe.PipePeer`;
the protocol of ``interop/go``'s ``harness`` command): the Go reference's
harness (``brmcp-goref harness``) and ours (this file run with ``--peer``: a
:class:`brmcp.server.Harness` with the example's ``echo`` and ``fortune``,
both sides reporting each execution on an ``exec`` line). Neither paces its
PMs (ours with ``pm_interval=0``; the reference never paces). The client is
the same for both: our client-role :class:`brmcp.Router` on the fabric,
writing raw JSON-RPC messages to its sessions (no SDK client session), so
the client's own cost is as small as it can be and the same on both sides.

Measured, per run, each implementation in turn (Go first in odd runs, ours
first in even ones, so drifting load on a shared machine hits both alike):

1. free tool calls/s: ``tools/call echo`` at concurrency 1 and 8 (8
   sessions of one caller, each making sequential calls) for a fixed wall
   time, and the server process's CPU (user + system, from
   ``/proc/<pid>/stat``) per call;
2. transport round trips/s: MCP ``ping`` (a bare request/response that both
   SDKs answer without tool logic) on one session, sequentially;
3. memory per idle SDK session: in a fresh server process, after a warm-up
   of 32 sessions, N more sessions (one per caller uid, each sent
   ``initialize`` and ``notifications/initialized``, every initialize
   answered) and the growth of the process's RSS (``VmRSS``) divided by N.

``--baseline DIR`` measures a third server alongside, our peer from another
checkout that holds this bench (a copy taken before a change), so a change
is judged within one run rather than across runs on a loaded machine;
``--profile DIR`` runs our peers under cProfile, one file per process.

Prints the median of ``--runs`` runs (default 3) per figure, the ratio
ours/reference and PASS/MISS per target: free calls/s >= 1x the
reference's at both concurrencies, round trips/s >= 1x, idle session
memory <= 2x. Linux only (``/proc``). Exits 2 with the reason when the Go
reference cannot be built (docs/interop.md), 0 otherwise: a report, not a
test. Figures are for this machine and run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mcp.shared.message import SessionMessage  # noqa: E402
from mcp.types import (  # noqa: E402
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
)

from brmcp import Conn, RouterOptions, SenderFunc, wire  # noqa: E402
from brmcp.testing import Fabric, goref  # noqa: E402
from brmcp.testing.pipe import PipePeer  # noqa: E402

BOT = "1" * 64
CLIENT = "2" * 64
KIB = 1024
PROTOCOL = "2025-06-18"
WARM_SESSIONS = 32
CALLS_TARGET = 1.0
TRIPS_TARGET = 1.0
MEMORY_TARGET = 2.0
_TICKS = os.sysconf("SC_CLK_TCK")
_SELF = Path(__file__).resolve()
#: Set by ``--profile DIR``: our peer processes run under cProfile, one file each.
PROFILE_DIR: Path | None = None
#: Set by ``--baseline DIR``: another checkout whose peer is measured alongside.
BASELINE: Path | None = None


def idle_uid(n: int) -> str:
    """The caller uid of idle session ``n`` (64 lowercase hex)."""
    return f"{0xA << 60 | n:064x}"


# -- the Python peer (``--peer``): our harness speaking interop/go's lines ------------


class _Lines:
    """JSON lines on this process's stdin and stdout, without blocking the
    event loop (non-blocking descriptors, anyio readiness waits)."""

    def __init__(self) -> None:
        self._in = sys.stdin.fileno()
        self._out = sys.stdout.fileno()
        os.set_blocking(self._in, False)
        os.set_blocking(self._out, False)
        self._pending = bytearray()
        # Without a checkpoint when free: a line written at once costs no
        # event-loop round (the Go harness's writes cost none either).
        self._lock = anyio.Lock(fast_acquire=True)

    async def emit(self, line: dict[str, Any]) -> None:
        data = json.dumps(line, separators=(",", ":")).encode() + b"\n"
        async with self._lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self._out, view)
                except BlockingIOError:
                    await anyio.wait_writable(self._out)
                    continue
                view = view[n:]

    async def lines(self) -> AsyncIterator[dict[str, Any]]:
        buf = self._pending
        while True:
            try:
                chunk = os.read(self._in, 1 << 20)
            except BlockingIOError:
                await anyio.wait_readable(self._in)
                continue
            if not chunk:
                return
            buf += chunk
            start = 0
            while (end := buf.find(b"\n", start)) >= 0:
                yield json.loads(buf[start:end])
                start = end + 1
            del buf[:start]


async def _peer_main(data_dir: str, allow: list[str]) -> None:
    from brmcp.serve.tools import register_tools
    from brmcp.server import CallContext, Harness, HarnessConfig

    io = _Lines()
    harness = Harness(
        HarnessConfig(
            data_dir=data_dir,
            allowed_peers=set(allow),
            calls_per_minute=100_000_000,
            name="brmcp-example",
            version="0.1.0",
            router_options=RouterOptions(pm_interval=0),
        )
    )
    register_tools(harness)
    for spec in harness.tools():
        inner = spec.handler

        async def handler(
            ctx: CallContext, args: dict[str, Any], _inner: Any = inner, _name: str = spec.name
        ) -> Any:
            await io.emit({"exec": {"tool": _name, "peer": ctx.peer}})
            return await _inner(ctx, args)

        spec.handler = handler

    async def send_pm(peer: str, text: str) -> None:
        await io.emit({"pm": {"to": peer, "text": text}})

    async with harness:
        router = await harness.start(SenderFunc(send_pm))
        await io.emit({"ready": {"role": "harness"}})
        async for line in io.lines():
            pm = line.get("pm")
            if pm is not None:
                router.handle_pm(pm["from"], pm["text"])


# -- the client ----------------------------------------------------------------------


class RawSession:
    """One client session driven with raw JSON-RPC messages, one request at
    a time (no SDK ``ClientSession``)."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self._next = 0

    async def request(self, method: str, params: dict[str, Any] | None = None) -> JSONRPCResponse:
        self._next += 1
        await self.conn.write_stream.send(
            SessionMessage(JSONRPCRequest(jsonrpc="2.0", id=self._next, method=method, params=params))
        )
        while True:
            item = await self.conn.read_stream.receive()
            if isinstance(item, Exception):
                raise item
            message = item.message
            if isinstance(message, JSONRPCError):
                raise RuntimeError(f"{method}: {message.error.message}")
            if isinstance(message, JSONRPCResponse) and message.id == self._next:
                return message

    async def initialize(self) -> None:
        await self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "cpu-vs-go", "version": "1.0"},
            },
        )
        await self.conn.write_stream.send(
            SessionMessage(JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized"))
        )


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def _pid(peer: PipePeer) -> int:
    proc = peer._proc
    assert proc is not None
    return proc.pid


@asynccontextmanager
async def server(
    kind: str, fabric: Fabric, binary: Path, tmp: Path, allow: list[str]
) -> AsyncIterator[PipePeer]:
    """The ``kind`` harness at BOT, allowing ``allow``: "go" (the
    reference), "py" (ours) or "base" (ours from :data:`BASELINE`)."""
    data_dir = tmp / f"{kind}-{time.monotonic_ns()}"
    data_dir.mkdir()
    if kind == "go":
        argv = [str(binary), "harness", "-datadir", str(data_dir), "-allow", ",".join(allow)]
        argv += ["-calls-per-minute", "100000000"]
    else:
        script = _SELF if kind == "py" or BASELINE is None else BASELINE / "bench" / "cpu_vs_go.py"
        argv = [sys.executable, str(script), "--peer", str(data_dir), *allow]
        if PROFILE_DIR is not None:
            out = PROFILE_DIR / f"py-{data_dir.name}.prof"
            argv[1:1] = ["-m", "cProfile", "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT if kind != "base" or BASELINE is None else BASELINE)}
    async with PipePeer(fabric, BOT, argv, env=env) as peer:
        await peer.next("ready", limit=60)
        yield peer


@dataclass
class Figures:
    """One run of one implementation."""

    calls: dict[int, float] = field(default_factory=dict)  #: concurrency -> calls/s
    cpu_us: dict[int, float] = field(default_factory=dict)  #: concurrency -> server CPU µs per call
    trips: float = 0.0  #: ping round trips/s
    trip_cpu_us: float = 0.0
    idle_kib: float = 0.0  #: RSS growth per idle session, one session per caller
    idle8_kib: float = 0.0  #: the same, 8 sessions per caller (the per-caller cap)


async def _timed(sessions: list[RawSession], seconds: float, call: Callable[[RawSession], Any]) -> int:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(session: RawSession) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call(session)
            done += 1

    async with anyio.create_task_group() as tg:
        for session in sessions:
            tg.start_soon(worker, session)
    return done


async def _echo(session: RawSession) -> None:
    response = await session.request("tools/call", {"name": "echo", "arguments": {"text": "hello"}})
    if response.result.get("isError"):
        raise RuntimeError(f"echo failed: {response.result}")


async def _ping(session: RawSession) -> None:
    await session.request("ping")


async def measure_calls(kind: str, binary: Path, tmp: Path, seconds: float, figures: Figures) -> None:
    async with Fabric() as fabric, server(kind, fabric, binary, tmp, [CLIENT]) as peer:
        pid = _pid(peer)
        client = fabric.router(CLIENT, pm_interval=0)
        async with client:
            sessions = [RawSession(client.dial(BOT)) for _ in range(8)]
            for session in sessions:
                await session.initialize()
            await _timed(sessions, seconds / 4, _echo)  # warm up every session
            for concurrency in (1, 8):
                cpu = _cpu_seconds(pid)
                start = time.perf_counter()
                n = await _timed(sessions[:concurrency], seconds, _echo)
                figures.calls[concurrency] = n / (time.perf_counter() - start)
                figures.cpu_us[concurrency] = (_cpu_seconds(pid) - cpu) / n * 1e6
            cpu = _cpu_seconds(pid)
            start = time.perf_counter()
            n = await _timed(sessions[:1], seconds, _ping)
            figures.trips = n / (time.perf_counter() - start)
            figures.trip_cpu_us = (_cpu_seconds(pid) - cpu) / n * 1e6


_INITIALIZE = {
    "protocolVersion": PROTOCOL,
    "capabilities": {},
    "clientInfo": {"name": "cpu-vs-go", "version": "1.0"},
}


class _Answers:
    """PMs received per caller uid (each initialize answer is one PM)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._changed = anyio.Event()

    def endpoint(self, uid: str) -> Callable[[str, str], None]:
        """The fabric endpoint of caller ``uid``: counts what it receives."""

        def deliver(from_uid: str, text: str) -> None:
            self.counts[uid] = self.counts.get(uid, 0) + 1
            self._changed.set()

        return deliver

    async def wait(self, uids: list[str], per_caller: int) -> None:
        """Return once every uid of ``uids`` received ``per_caller`` PMs."""
        while any(self.counts.get(u, 0) < per_caller for u in uids):
            self._changed = anyio.Event()
            await self._changed.wait()


async def _open_idle(fabric: Fabric, uids: list[str], per_caller: int, answered: _Answers) -> None:
    """Open ``per_caller`` sessions per uid with raw PMs (``initialize`` then
    ``notifications/initialized``); return once every initialize was answered."""
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": _INITIALIZE}).encode()
    note = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
    sent = 0
    for u in uids:
        sender = fabric.sender(u)
        for _ in range(per_caller):
            sid = wire.new_id()
            await sender.send_pm(BOT, wire.encode(init, sid=sid)[0])
            await sender.send_pm(BOT, wire.encode(note, sid=sid)[0])
            sent += 1
            if sent % 16 == 0:
                await anyio.lowlevel.checkpoint()
    with anyio.fail_after(300):
        await answered.wait(uids, per_caller)


async def measure_idle(kind: str, binary: Path, tmp: Path, n: int, per_caller: int) -> float:
    """KiB of RSS the ``kind`` server process grows by per idle session,
    with ``n`` sessions opened ``per_caller`` per caller uid."""
    callers = max(1, n // per_caller)
    warm = [idle_uid(i) for i in range(max(1, WARM_SESSIONS // per_caller))]
    measured = [idle_uid(len(warm) + i) for i in range(callers)]
    answered = _Answers()
    async with Fabric() as fabric:
        for u in (*warm, *measured):
            fabric.attach(u, answered.endpoint(u))
        async with server(kind, fabric, binary, tmp, [*warm, *measured]) as peer:
            pid = _pid(peer)
            await _open_idle(fabric, warm, per_caller, answered)
            await anyio.sleep(1.0)
            before = _rss_kib(pid)
            await _open_idle(fabric, measured, per_caller, answered)
            await anyio.sleep(1.0)
            after = _rss_kib(pid)
    return (after - before) / (callers * per_caller)


# -- the report ----------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values)


def report(runs: dict[str, list[Figures]]) -> None:
    go, py, base = runs["go"], runs["py"], runs.get("base")
    rows: list[tuple[str, Callable[[Figures], float], str, float | None, bool]] = [
        ("free calls/s, concurrency 1", lambda f: f.calls[1], ">=", CALLS_TARGET, True),
        ("free calls/s, concurrency 8", lambda f: f.calls[8], ">=", CALLS_TARGET, True),
        ("server CPU µs per call, c=1", lambda f: f.cpu_us[1], "", None, False),
        ("server CPU µs per call, c=8", lambda f: f.cpu_us[8], "", None, False),
        ("ping round trips/s", lambda f: f.trips, ">=", TRIPS_TARGET, True),
        ("server CPU µs per round trip", lambda f: f.trip_cpu_us, "", None, False),
        ("idle session KiB, 1 per caller", lambda f: f.idle_kib, "<=", MEMORY_TARGET, False),
        ("idle session KiB, 8 per caller", lambda f: f.idle8_kib, "<=", MEMORY_TARGET, False),
    ]
    print(f"medians of {len(py)} runs (ratio = ours / the reference's)")
    extra = f" {'baseline':>10} {'ours/base':>9}" if base else ""
    print(f"  {'figure':<30} {'ours':>10} {'Go':>10} {'ratio':>7}{extra}  target")
    verdicts: list[str] = []
    for label, get, op, target, higher in rows:
        ours = _median([get(f) for f in py])
        ref = _median([get(f) for f in go])
        ratio = ours / ref if ref else float("inf")
        line = f"  {label:<30} {ours:>10.1f} {ref:>10.1f} {ratio:>7.2f}"
        if base:
            was = _median([get(f) for f in base])
            line += f" {was:>10.1f} {ours / was if was else float('inf'):>9.2f}"
        if target is not None:
            ok = ratio >= target if higher else ratio <= target
            line += f"  {op} {target:.0f}x  {'PASS' if ok else 'MISS'}"
            verdicts.append(f"{label} {'PASS' if ok else 'MISS'}")
        print(line)
    for label, get in (("calls/s c=1", lambda f: f.calls[1]), ("idle KiB 8/caller", lambda f: f.idle8_kib)):
        line = f"  per run, {label}:"
        for kind, figures in runs.items():
            line += f" {kind} " + " ".join(f"{get(f):.1f}" for f in figures) + ";"
        print(line.rstrip(";"))
    print("summary: " + ", ".join(verdicts))


async def _main(binary: Path, quick: bool, runs: int) -> None:
    seconds = 1.5 if quick else 4.0
    sessions = 200 if quick else 1000
    results: dict[str, list[Figures]] = {"go": [], "py": []}
    if BASELINE is not None:
        results["base"] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for run in range(runs):
            order = [*results] if run % 2 == 0 else [*results][::-1]
            for kind in order:
                figures = Figures()
                await measure_calls(kind, binary, tmp, seconds, figures)
                figures.idle_kib = await measure_idle(kind, binary, tmp, sessions, 1)
                figures.idle8_kib = await measure_idle(kind, binary, tmp, sessions, 8)
                results[kind].append(figures)
                print(
                    f"run {run + 1} {kind}: calls/s c=1 {figures.calls[1]:.0f}, c=8 {figures.calls[8]:.0f};"
                    f" pings/s {figures.trips:.0f}; idle {figures.idle_kib:.1f} and"
                    f" {figures.idle8_kib:.1f} KiB/session",
                    flush=True,
                )
    print()
    report(results)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows and 200 idle sessions")
    parser.add_argument("--runs", type=int, default=3, help="runs per implementation (the median is printed)")
    parser.add_argument("--peer", nargs="+", metavar=("DATADIR", "UID"), help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=Path, metavar="DIR", help="run our peers under cProfile into DIR")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="also measure our peer from another checkout holding this bench (e.g. before a change)",
    )
    args = parser.parse_args()
    if args.peer:
        anyio.run(_peer_main, args.peer[0], args.peer[1:])
        return 0
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    reason = goref.unavailable_reason()
    if reason is not None:
        print(f"cpu_vs_go: {reason}", file=sys.stderr)
        return 2
    try:
        binary = goref.build()
    except goref.GoRefError as exc:
        print(f"cpu_vs_go: {exc}", file=sys.stderr)
        return 2
    global BASELINE, PROFILE_DIR
    if args.baseline is not None:
        if not (args.baseline / "bench" / "cpu_vs_go.py").is_file():
            parser.error(f"--baseline {args.baseline}: no bench/cpu_vs_go.py there")
        BASELINE = args.baseline.resolve()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        PROFILE_DIR = args.profile.resolve()
    commit = goref.pinned_commit()
    print(f"Go reference at {commit} ({binary.name}); Python {sys.version.split()[0]}; shared machine\n")
    anyio.run(_main, binary, args.quick, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- Profile notes (cProfile and tracemalloc on this machine, Python 3.11) -----------
#
# Free-call path, both routers in one process over the fabric (a raw client
# and a server answering each request at once, no SDK), CPU per round trip:
# about 350 µs before the transport changes, about 170 µs after. The top
# costs before them:
#   * the outbox's unpaced path: every write built an _Item with an anyio
#     Event, took the lane lock through two checkpoints and read the clock
#     twice (about 40% of the transport's time); a lone part with nothing
#     queued now goes to the sender directly (Outbox._send_direct);
#   * the batch mark: marked_payload ran model_dump(mode="json") and
#     json.dumps (11-22 µs a message) where the unmarked message costs one
#     model_dump_json (3-9 µs); the mark is now spliced into that JSON text
#     (byte-identical to the old construction, property-tested);
#   * what remains, per message: pydantic's validate_json of the inbound
#     message, envelope parse and encode (about 10 µs together), three
#     memory-stream statistics() calls, message_cost's byte scans.
# Through the harness (tools/call echo) the transport is now a small part of
# the server's CPU: most of it is the MCP SDK's dispatch (a task and an
# OpenTelemetry span per request, the runner's wrappers) and the harness's
# pipeline (the guard decoding tool output as a refusal, argument
# validation), neither of which the transport controls; the Go reference
# spends about a third as much CPU per call in total.
#
# Idle session, 8 per caller, harness in one process (tracemalloc, 400
# sessions): 40.9 KiB traced per session before, 40.2 KiB after. Of that,
# 26.5 KiB is held under the accept call (the SDK's server.run: its
# dispatcher's task groups, streams and events, plus the harness's
# per-session tasks), 3.1 KiB the session task itself, 1.3 KiB the decoded
# initialize the SDK keeps, 1.3 KiB the inbox memory stream and 0.8 KiB the
# inbox's cost deque, now a list allocated only while messages wait. The
# transport's share is about 6 KiB; the rest is the SDK's and the harness's.
