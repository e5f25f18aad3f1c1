"""brmcp.testing.pipe: a subprocess attached to the fabric as a peer, with
PMs and control lines as JSON lines (a small Python peer stands in for the
Go reference's commands, so this runs everywhere)."""

from __future__ import annotations

import sys

import anyio
import pytest

from brmcp.testing import Fabric, uid
from brmcp.testing.pipe import PipePeer, PipePeerError

PEER = r"""
import json, sys
def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
out({"ready": {"role": "echo"}})
for raw in sys.stdin:
    line = json.loads(raw)
    if "pm" in line:
        pm = line["pm"]
        if pm["text"] == "die":
            sys.exit(3)
        out({"pm": {"to": pm["from"], "text": pm["text"].upper()}})
        out({"seen": {"from": pm["from"], "size": len(pm["text"])}})
    elif "ping" in line:
        print("log line for stderr", file=sys.stderr, flush=True)
        out({"pong": {"id": line["ping"]["id"], "n": line["ping"]["n"] * 2}})
"""

A = uid(1)
B = uid(2)


def _argv() -> list[str]:
    return [sys.executable, "-c", PEER]


async def test_pms_cross_both_ways_and_control_lines_route() -> None:
    got: list[tuple[str, str]] = []
    handled: list[dict[str, object]] = []
    done = anyio.Event()

    def check() -> None:
        if len(got) >= 2 and len(handled) >= 2:
            done.set()

    async def on_seen(body: dict[str, object]) -> None:
        handled.append(body)
        check()

    def on_pm(frm: str, text: str) -> None:
        got.append((frm, text))
        check()

    async with Fabric() as fabric:
        fabric.attach(A, on_pm)
        async with PipePeer(fabric, B, _argv(), handlers={"seen": on_seen}) as peer:
            assert await peer.next("ready") == {"role": "echo"}
            big = "x" * 300_000  # larger than a pipe buffer
            await fabric.sender(A).send_pm(B, "hello")
            await fabric.sender(A).send_pm(B, big)
            assert await peer.next("seen") == {"from": A, "size": 5}
            assert await peer.next("seen") == {"from": A, "size": 300_000}
            assert (await peer.request("ping", {"n": 21}, reply="pong"))["n"] == 42
            with anyio.fail_after(10):
                await done.wait()
            assert got == [(B, "HELLO"), (B, big.upper())]
            assert peer.count("seen") == 2
            assert fabric.link(B, A).pms == 2
            assert any("log line for stderr" in line for line in peer.stderr_tail)
        assert peer.returncode == 0
        # Detached on exit: a PM to B is now undeliverable.
        await fabric.sender(A).send_pm(B, "late")
        assert fabric.stats.pms_undeliverable == 1


async def test_a_dead_process_fails_waits_with_its_stderr() -> None:
    async with Fabric() as fabric, PipePeer(fabric, B, _argv()) as peer:
        await peer.next("ready")
        await fabric.sender(A).send_pm(B, "die")
        with pytest.raises(PipePeerError, match="exited 3"):
            await peer.next("seen", limit=10)
        with pytest.raises(PipePeerError):
            await peer.request("ping", {"n": 1}, reply="pong", limit=10)


async def test_a_missing_reply_times_out() -> None:
    async with Fabric() as fabric, PipePeer(fabric, B, _argv()) as peer:
        with pytest.raises(PipePeerError, match="no 'nothing' line"):
            await peer.next("nothing", limit=0.2)
