"""The official MCP SDK client and server, unmodified, over Router + Conn +
Fabric: the handshake flow, caller identity, a multi-part result,
concurrency and both protocol eras (WIRE.md §Sessions, §Eras)."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client, ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from brmcp import Conn, Router, wire
from brmcp.testing import Fabric, uid
from tests.kit.transport import ALICE, BOT, Bot, big_text, bot_and_alice, call, echoed, session, until


async def test_initialize_list_and_call_with_caller_identity() -> None:
    async with bot_and_alice() as (_fabric, bot, server, client):
        conn = client.dial(BOT)
        assert conn.peer == BOT
        assert len(conn.sid) == 16
        assert conn.session_id == f"{BOT}/{conn.sid}"
        async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=10) as s:
            init = await s.initialize()
            # The handshake era is what our client speaks over BR (WIRE.md §Eras).
            assert init.protocol_version == "2025-11-25"
            assert init.server_info.name == "brmcp-test-bot"
            listed = await s.list_tools()
            assert [t.name for t in listed.tools] == ["echo", "big", "sleep"]
            result = await s.call_tool("echo", {"token": "t1"})
            assert isinstance(result.content[0], types.TextContent)
            assert echoed(result.content[0].text) == {"caller": ALICE, "args": {"token": "t1"}}
        assert bot.calls == [(ALICE, "echo", {"token": "t1"})]
        assert bot.accepts == 1
        # The server side sees one session keyed by the caller and the client's sid.
        assert server.stats.sessions_opened == 1
        assert server.stats.dropped_invalid_jsonrpc == 0
        # Leaving the ClientSession closed the client Conn (no close frame goes out).
        assert conn.closed
        assert client.session_count == 0


async def test_outgoing_pms_are_compact_envelopes_with_ttl_deadline() -> None:
    captured: list[tuple[str, str]] = []
    bot = Bot()
    async with Fabric() as fabric:
        server = fabric.router(BOT, accept=bot.accept)

        def tap(from_uid: str, text: str) -> None:
            captured.append((from_uid, text))
            server.handle_pm(from_uid, text)

        fabric.attach(BOT, tap)
        start = time.time()
        # Unpaced, each write is its own PM (paced, later ones would share a batch).
        async with server, fabric.router(ALICE, ttl=30.0, pm_interval=0) as client, session(client, BOT) as s:
            await call(s, "echo", {"token": "x"})
        end = time.time()
    # initialize, notifications/initialized, tools/call: one single-part PM each.
    assert len(captured) == 3
    for _, text in captured:
        part = wire.parse(text)
        assert part is not None
        # exp = floor(now + ttl), never 0 (WIRE.md §Deadlines).
        assert math.floor(start + 30.0) <= part.exp <= math.floor(end + 30.0)
        # Compact JSON: no whitespace after separators.
        assert b'": ' not in part.chunk
        assert b'", "' not in part.chunk


@pytest.mark.parametrize("batch", [True, False], ids=["batch-peers", "v1-peers"])
async def test_five_mib_result_crosses_as_many_parts(batch: bool) -> None:
    n = 5 * 1024 * 1024
    async with (
        bot_and_alice(batch=batch) as (fabric, _bot, server, client),
        session(client, BOT, read_timeout=30) as s,
    ):
        before = fabric.link(BOT, ALICE).pms
        sent_before = server.stats.pms_sent
        text = await call(s, "big", {"n": n})
        parts = fabric.link(BOT, ALICE).pms - before
    assert text == big_text(n)
    if batch:
        # Both routers take batches (WIRE.md §Batches): each part fills one
        # batch PM, ceil(5 MiB / 1,117,299) = 5 parts.
        chunk = (wire.MAX_BATCH_BYTES - 256) // 4 * 3
        assert parts == math.ceil(n / chunk) == 5
    else:
        # The JSON-RPC response is a little over 5 MiB: ceil(5 MiB / 204800) = 26 parts.
        assert parts == math.ceil(n / wire.DEFAULT_CHUNK_SIZE) == 26
    assert server.stats.pms_sent - sent_before == parts
    # Every part fits BR's message limit (default max_pm_bytes).
    assert fabric.stats.pms_refused == 0
    assert client.assembler.pending_messages == 0
    assert client.assembler.buffered_bytes == 0


async def test_twenty_concurrent_sessions_between_two_peers() -> None:
    async with bot_and_alice(max_sessions_per_peer=32) as (_fabric, bot, server, client):
        results: dict[int, dict[str, object]] = {}
        ready = 0
        all_ready = anyio.Event()

        async def one(i: int) -> None:
            nonlocal ready
            async with session(client, BOT) as s:
                # Barrier: every session is initialized and open before any call is made.
                ready += 1
                if ready == 20:
                    assert client.sessions_of(BOT) == 20
                    all_ready.set()
                await all_ready.wait()
                for j in range(3):
                    results[i * 10 + j] = echoed(await call(s, "echo", {"token": f"{i}-{j}"}))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(one, i)
        assert server.stats.sessions_opened == 20
        assert server.sessions_of(ALICE) == 20  # no close frame: the server still holds them
        assert client.sessions_of(BOT) == 0
        assert bot.accepts == 20
    assert len(results) == 60
    for key, value in results.items():
        assert value == {"caller": ALICE, "args": {"token": f"{key // 10}-{key % 10}"}}
    assert sorted(bot.executions().values()) == [1] * 60


async def test_twenty_sessions_across_ten_peers() -> None:
    bot = Bot()
    peers = [uid(n) for n in range(2, 12)]
    async with Fabric() as fabric, fabric.router(BOT, accept=bot.accept) as server:
        clients = [fabric.router(peer) for peer in peers]
        async with AsyncExitStack() as stack:
            for client in clients:
                await stack.enter_async_context(client)
            seen: list[dict[str, Any]] = []

            async def one(peer: str, client: Router, k: int) -> None:
                async with session(client, BOT) as s:
                    seen.append(echoed(await call(s, "echo", {"token": k})))
                    # The server counts sessions per peer.
                    assert 1 <= server.sessions_of(peer) <= 2

            async with anyio.create_task_group() as tg:
                for peer, client in zip(peers, clients, strict=True):
                    for k in range(2):
                        tg.start_soon(one, peer, client, k)
        assert server.stats.sessions_opened == 20
    assert sorted((v["caller"], v["args"]["token"]) for v in seen) == sorted(
        (peer, k) for peer in peers for k in range(2)
    )
    # Each handler saw exactly its caller's uid as ctx.request.
    assert sorted(caller for caller, _, _ in bot.calls) == sorted(peer for peer in peers for _ in range(2))


@asynccontextmanager
async def _conn_transport(conn: Conn) -> AsyncIterator[tuple[object, object]]:
    """What ``mcp.Client`` wants: an async context manager yielding (read, write)."""
    try:
        yield conn.streams
    finally:
        conn.close()


async def test_server_accepts_a_2026_07_28_client() -> None:
    async with bot_and_alice() as (_fabric, bot, server, client):
        conn = client.dial(BOT)
        async with Client(_conn_transport(conn), mode="2026-07-28", read_timeout_seconds=10) as c:  # type: ignore[arg-type]
            assert c.session.protocol_version == "2026-07-28"
            listed = await c.list_tools()
            assert "echo" in [t.name for t in listed.tools]
            result = await c.call_tool("echo", {"token": "modern"})
            block = result.content[0]
            assert isinstance(block, types.TextContent)
            assert echoed(block.text) == {"caller": ALICE, "args": {"token": "modern"}}
        assert bot.calls == [(ALICE, "echo", {"token": "modern"})]
        assert server.stats.sessions_opened == 1
        # A handshake-era session on the same router still works next to it.
        async with session(client, BOT) as s:
            assert echoed(await call(s, "echo", {"token": "legacy"}))["caller"] == ALICE


async def test_legacy_mode_client_wrapper_also_works() -> None:
    async with bot_and_alice() as (_fabric, _bot, _server, client):
        conn = client.dial(BOT)
        async with Client(_conn_transport(conn), mode="legacy", read_timeout_seconds=10) as c:  # type: ignore[arg-type]
            assert c.session.protocol_version == "2025-11-25"
            result = await c.call_tool("echo", {"token": "l"})
            assert not result.is_error


async def test_inbound_messages_carry_the_peer_as_request_context() -> None:
    async with Fabric() as fabric:
        got: list[SessionMessage | Exception] = []

        async def accept(conn: Conn) -> None:
            got.append(await conn.read_stream.receive())

        async with fabric.router(BOT, accept=accept) as server, fabric.router(ALICE) as client:
            conn = client.dial(BOT)
            note = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized")
            await conn.write_stream.send(SessionMessage(note))
            await until(lambda: bool(got))
            assert server.stats.messages_delivered == 1
    message = got[0]
    assert isinstance(message, SessionMessage)
    assert message.message == note
    assert message.metadata is not None
    assert message.metadata.request_context == ALICE  # type: ignore[union-attr]


async def test_oversize_result_becomes_an_error_response() -> None:
    # 64 parts x 1 KiB = 64 KiB is the most one message can carry at this
    # chunk size (between v1 peers: a batch peer gets larger parts).
    async with (
        bot_and_alice(chunk_size=1024, batch=False) as (_fabric, _bot, _server, client),
        session(client, BOT) as s,
    ):
        with pytest.raises(MCPError, match="exceeds the transport limit of 65536 bytes"):
            await call(s, "big", {"n": 70_000})
        # The session survives; smaller results still flow (as several parts).
        assert await call(s, "big", {"n": 5000}) == big_text(5000)
