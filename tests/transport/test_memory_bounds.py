"""Memory bounds as memory (WIRE.md §Inboxes, §Reassembly bounds; SECURITY.md
"A hostile peer"): the inbox byte bounds per session and per peer, the cost
estimate against what decoding really holds, and a hostile allowed peer's
flood measured as peak RSS in a subprocess (brmcp.testing.memattack)."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from typing import Any

import anyio
import pytest
from mcp.types import jsonrpc_message_adapter

from brmcp import wire
from brmcp.transport._inbox import message_cost
from brmcp.transport.conn import Conn
from brmcp.transport.router import Router, RouterOptions
from tests.kit import until

PEER = "cd" * 32
OTHER = "ef" * 32


class _Null:
    async def send_pm(self, peer: str, text: str) -> None:
        return None


def _note(size: int) -> bytes:
    head = b'{"jsonrpc":"2.0","method":"notifications/x","params":{"t":"'
    return head + b"a" * (size - len(head) - 4) + b'"}}'


def _feed(router: Router, peer: str, sid: str, payload: bytes) -> None:
    for text in wire.encode(payload, sid=sid, chunk_size=64 * 1024):
        router.handle_pm(peer, text)


async def test_inbox_bytes_bound_each_session_and_each_peer() -> None:
    accepted: list[Conn] = []

    async def idle(conn: Conn) -> None:  # never reads
        accepted.append(conn)
        await anyio.sleep_forever()

    options = RouterOptions(inbox_bytes=310_000, peer_inbox_bytes=500_000)
    async with Router(_Null(), accept=idle, allow=lambda p: True, options=options) as router:
        one = _note(100_000)
        cost = message_cost(one)
        assert 100_000 <= cost < 101_000
        sid_a, sid_b, sid_c = "a" * 16, "b" * 16, "c" * 16
        for _ in range(2):
            _feed(router, PEER, sid_a, one)
        assert router.session(PEER, sid_a).queued_bytes == 2 * cost  # type: ignore[union-attr]
        assert router.queued_bytes(PEER) == 2 * cost
        _feed(router, PEER, sid_a, one)
        _feed(router, PEER, sid_a, one)  # the fourth passes 310 000 bytes: the session closes
        assert router.stats.inbox_overflows == 1
        assert router.stats.dropped_unread == 3
        assert router.session(PEER, sid_a) is None
        assert router.queued_bytes(PEER) == 0
        # Per peer: two sessions of 2 messages each fit (4 x ~100 kB < 500 000), a fifth does not.
        for sid in (sid_b, sid_c):
            for _ in range(2):
                _feed(router, PEER, sid, one)
        assert router.queued_bytes(PEER) == 4 * cost
        _feed(router, PEER, sid_b, one)
        assert router.stats.inbox_overflows == 2
        assert router.session(PEER, sid_b) is None
        assert router.queued_bytes(PEER) == 2 * cost  # sid_c's messages stay
        # Another peer has its own budget.
        _feed(router, OTHER, sid_a, one)
        assert router.queued_bytes(OTHER) == cost
        # A message whose decoded form alone passes the session bound is
        # refused before decoding, and closes its session.
        decoded_before = router.stats.messages_delivered
        _feed(
            router, PEER, sid_c, b'{"jsonrpc":"2.0","method":"x","params":{"l":[' + b"[]," * 5000 + b"[]]}}"
        )
        assert router.stats.messages_delivered == decoded_before
        assert router.stats.dropped_too_large == 1
        assert router.session(PEER, sid_c) is None


async def test_read_messages_leave_the_tally() -> None:
    got: list[Any] = []

    async def reader(conn: Conn) -> None:
        async for message in conn.read_stream:
            got.append(message)

    options = RouterOptions(inbox_bytes=300_000, peer_inbox_bytes=300_000)
    async with Router(_Null(), accept=reader, allow=lambda p: True, options=options) as router:
        for sent in range(1, 21):  # 2 MB in total, each read before the next arrives
            _feed(router, PEER, "d" * 16, _note(100_000))
            await until(lambda n=sent: len(got) == n)
        assert len(got) == 20
        assert router.stats.inbox_overflows == 0
        assert router.queued_bytes(PEER) == 0


def _request(params: Any) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "x", "params": params}, ensure_ascii=False
    ).encode()


@pytest.mark.parametrize(
    "params",
    [
        {"t": "a" * 400_000},
        {"t": "\U0001f600" + "a" * 400_000},
        {"t": "\u65e5" + "a" * 400_000},
        {"l": [[] for _ in range(50_000)]},
        {"l": [{} for _ in range(50_000)]},
        {"l": [123456789012] * 50_000},
        {"l": [1.5] * 50_000},
        {"l": [str(i) for i in range(50_000)]},
        {"d": {str(i): i for i in range(50_000)}},
        {"l": [{"a": None} for _ in range(50_000)]},
    ],
    ids=["ascii", "astral", "bmp", "lists", "dicts", "ints", "floats", "strs", "keys", "objects"],
)
def test_cost_estimate_covers_what_decoding_holds(params: Any) -> None:
    payload = _request(params)
    tracemalloc.start()
    try:
        message = jsonrpc_message_adapter.validate_json(payload, by_name=False)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message is not None
    assert held <= message_cost(payload)
    # \\u escapes of an astral character count as wide too.
    escaped = json.dumps({"t": "\U0001f600" + "a" * 1000}).encode()
    assert message_cost(escaped) >= 4 * len(escaped)


def _attack(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "brmcp.testing.memattack", "--json", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS from /proc/self/status")
@pytest.mark.parametrize("mode", ["--no-yield", "--yield"])
def test_hostile_peer_flood_peak_rss_stays_within_the_bounds(mode: str) -> None:
    """A hostile allowed peer sends thousands of complete and incomplete
    messages of up to 16 MiB across 40+ sids (and 16 MiB that decode to ~350 MiB);
    the peak RSS growth stays within reassembly bound + peer inbox bound + the
    documented constant (64 + 64 + 112 MiB with the defaults)."""
    report = _attack("--big", "12", "--small", "1500", *(["--yield"] if mode == "--yield" else []))
    assert report["messages_sent"] > 3000
    assert report["dropped_too_large"] > 0  # the ~350 MiB decoders were refused
    assert report["peak_growth_mib"] <= report["bound_mib"], report
