"""A hostile but allowed peer ("Bad input"): random parts, huge
totals, floods of new sids, malformed JSON in valid envelopes and JSON that
is not JSON-RPC. The router must not crash, must stay inside its configured
bounds, must not disturb other peers' sessions, and must log drops at debug
level with the peer and the reason but never the payload."""

from __future__ import annotations

import base64
import json
import logging
import random
import time

import anyio
import pytest

from brmcp import Router, wire
from brmcp.testing import Fabric
from tests.kit.transport import ALICE, BOT, MALLORY, Bot, call, echoed, session

SECRET = "s3cr3t-payload-marker"
CAP = 3
ASSEMBLY = wire.AssemblerConfig(
    max_pending_per_peer=4, max_message_bytes=48 * 1024, max_total_bytes=128 * 1024, timeout=30.0
)


def _envelope(sid: str, mid: str, seq: int, total: int, exp: int, chunk: bytes) -> str:
    body = base64.b64encode(chunk).decode()
    return f"--mcp[v=1,sid={sid},mid={mid},seq={seq}/{total},exp={exp}]--{body}"


def _not_jsonrpc(rng: random.Random) -> bytes:
    """Valid JSON, or almost-JSON, that is not a JSON-RPC message."""
    options: list[bytes] = [
        json.dumps({"secret": SECRET}).encode(),
        json.dumps([{"jsonrpc": "2.0", "method": SECRET}]).encode(),  # batches are not accepted
        json.dumps(SECRET).encode(),
        json.dumps({"jsonrpc": "1.0", "method": SECRET}).encode(),
        json.dumps({"jsonrpc": "2.0", "id": 1}).encode(),  # neither method nor result
        json.dumps({"jsonrpc": "2.0", "id": 1.5, "result": SECRET}).encode(),
        json.dumps({"jsonrpc": "2.0", "id": {"x": SECRET}, "method": "m"}).encode(),
        json.dumps({"jsonrpc": "2.0", "method": 7, "params": SECRET}).encode(),
        b'{"jsonrpc":"2.0","method":"' + SECRET.encode(),  # truncated
        b"{" + SECRET.encode() + b"}",
        b"[" * 5000 + SECRET.encode(),
        b"\xff\xfe" + SECRET.encode(),
        b"null",
    ]
    return rng.choice(options)


def _valid_jsonrpc(rng: random.Random) -> bytes:
    options = [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": rng.randrange(1000), "method": "ping"},
        {"jsonrpc": "2.0", "id": rng.randrange(1000), "method": "tools/call", "params": {"name": SECRET}},
        {"jsonrpc": "2.0", "id": rng.randrange(1000), "result": {"secret": SECRET}},
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": SECRET}},
        },
    ]
    return json.dumps(rng.choice(options)).encode()


def _hostile_pms(rng: random.Random, now: int) -> list[str]:
    def hexid() -> str:
        return format(rng.getrandbits(64), "016x")

    kind = rng.randrange(7)
    if kind == 0:  # random part of a random multi-part message, random deadline
        total = rng.randint(2, wire.MAX_PARTS)
        chunk = (SECRET.encode() + rng.randbytes(rng.randint(1, 3000)))[: rng.randint(1, 3000)]
        exp = rng.choice([0, -5, now - 100, now + 600, 2**62])
        return [_envelope(hexid(), hexid(), rng.randint(1, total), total, exp, chunk)]
    if kind == 1:  # huge totals: first parts of maximal messages, big chunks
        mid = hexid()
        return [_envelope("a1", mid, seq, wire.MAX_PARTS, 0, SECRET.encode() * 1500) for seq in (1, 2)]
    if kind == 2:  # the same message with a conflicting total
        mid = "77"
        return [_envelope("a1", mid, rng.randint(1, 3), rng.choice([3, 4]), 0, SECRET.encode())]
    if kind == 3:  # a flood of new sids carrying valid JSON-RPC
        return wire.encode(_valid_jsonrpc(rng), sid=hexid())
    if kind == 4:  # malformed or non-JSON-RPC payloads in valid envelopes, single- or multi-part
        payload = _not_jsonrpc(rng)
        chunk_size = max(rng.choice([7, 300, 204800]), -(-len(payload) // wire.MAX_PARTS))
        return wire.encode(payload, sid=hexid(), chunk_size=chunk_size)
    if kind == 5:  # broken envelopes and chat
        return [
            rng.choice(
                [
                    f"--mcp[v=1,sid=zz,mid=1,seq=1/1,exp=0]--{SECRET}",
                    f"--mcp[v=1,sid=a,mid=b,seq=1/999,exp=0]--{base64.b64encode(SECRET.encode()).decode()}",
                    f"--mcp[v=2,sid=a,mid=b,seq=1/1,exp=0]--{base64.b64encode(SECRET.encode()).decode()}",
                    SECRET,
                ]
            )
        ]
    # kind 6: many messages on one session to overflow its inbox
    return wire.encode(_valid_jsonrpc(rng), sid="bad5e55")


def _assert_bounded(router: Router) -> None:
    assert router.sessions_of(MALLORY) <= CAP
    assert router.assembler.pending(MALLORY) <= ASSEMBLY.max_pending_per_peer
    assert router.assembler.buffered_bytes <= ASSEMBLY.max_total_bytes


async def test_hostile_peer_cannot_crash_grow_or_disturb(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="brmcp")
    bot = Bot()
    rng = random.Random(20260729)
    async with Fabric() as fabric:
        server = fabric.router(
            BOT,
            accept=bot.accept,
            max_sessions_per_peer=CAP,
            assembler=ASSEMBLY,
            inbox_size=4,
            idle_timeout=30,
        )
        hostile = fabric.sender(MALLORY)
        async with server, fabric.router(ALICE) as client, session(client, BOT) as s:
            for round_ in range(6):
                now = int(time.time())
                for _ in range(500):
                    for text in _hostile_pms(rng, now):
                        await hostile.send_pm(BOT, text)
                        _assert_bounded(server)
                # Let the hostile sessions' servers run until they all wait, then
                # check the bystander.
                await anyio.wait_all_tasks_blocked()
                _assert_bounded(server)
                reply = echoed(await call(s, "echo", {"token": round_}, read_timeout=5))
                assert reply == {"caller": ALICE, "args": {"token": round_}}
            stats = server.stats
            assert stats.pms_received >= 3000
            # Every refusal path was exercised.
            assert stats.dropped_invalid_jsonrpc > 0
            assert stats.dropped_session_cap > 0
            assert stats.dropped_buffer_full > 0
            assert stats.dropped_too_large > 0
            assert stats.dropped_part_count > 0
            assert stats.dropped_expired > 0
            assert stats.inbox_overflows > 0
            assert stats.pms_ignored > 0
            assert stats.dropped_denied == 0
            # ALICE's one session was never touched.
            assert server.sessions_of(ALICE) == 1
            assert bot.executions() == dict.fromkeys(range(6), 1)
            assert [c for c, _, _ in bot.calls if c != ALICE] == []

    ours = [r for r in caplog.records if r.name.startswith("brmcp")]
    drops = [r for r in ours if r.getMessage().startswith("drop ")]
    assert drops
    assert all(r.levelno == logging.DEBUG for r in drops)
    assert all(MALLORY in r.getMessage() for r in drops)
    reasons = " ".join(r.getMessage() for r in drops)
    for reason in (
        "not JSON-RPC",
        "session cap",
        "deadline passed",
        "buffer full",
        "size bounds",
        "part count",
    ):
        assert reason in reasons, reason
    forbidden = [SECRET, *(base64.b64encode(b"x" * k + SECRET.encode()).decode()[4:20] for k in range(3))]
    for record in ours:
        text = record.getMessage()
        for needle in forbidden:
            assert needle not in text, (record.name, text)


async def test_large_multi_part_flood_is_refused_by_byte_bounds() -> None:
    bot = Bot()
    async with Fabric() as fabric:
        server = fabric.router(BOT, accept=bot.accept, assembler=ASSEMBLY)
        async with server:
            pm = fabric.sender(MALLORY)
            # A message that would decode to more than max_message_bytes.
            big = b"{" + b"x" * (64 * 1024)
            for text in wire.encode(big, sid="b1", chunk_size=8 * 1024):
                await pm.send_pm(BOT, text)
                _assert_bounded(server)
            assert server.stats.dropped_too_large >= 1
            assert server.assembler.pending_messages <= 1
            # Several half-finished messages from many sids hit the per-peer pending bound.
            for i in range(10):
                first = wire.encode(b"y" * 100, sid=f"c{i}", chunk_size=10)[0]
                await pm.send_pm(BOT, first)
                _assert_bounded(server)
            assert server.stats.dropped_buffer_full >= 1
            assert server.session_count == 0
            assert bot.accepts == 0
