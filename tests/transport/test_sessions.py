"""Router session semantics (WIRE.md §Sessions): chat on the same thread,
allow-listing, idle expiry and re-creation, the per-peer cap, inbox
overflow, deadlines, send failures and the router's lifecycle."""

from __future__ import annotations

import asyncio
import logging
import time

import anyio
import mcp.types as types
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from brmcp import Conn, ManualClock, Router, RouterOptions, SendError, wire
from brmcp.testing import Fabric, LinkDownError, PMTooLargeError, uid
from tests.kit.transport import ALICE, BOT, MALLORY, Bot, bot_and_alice, call, echoed, session, until

# Chat bodies from the Go reference's tests: none of them is an envelope.
CHAT = ["hey bot, how are you?", "> **nick:** quoted chat\n\nreply", "--embed[type=image/png,data=QUJD]--"]

INVALID_PARAMS = -32602


def _notification(method: str = "notifications/initialized") -> SessionMessage:
    return SessionMessage(types.JSONRPCNotification(jsonrpc="2.0", method=method))


async def test_chat_on_the_same_thread_never_creates_a_session() -> None:
    async with bot_and_alice() as (fabric, bot, server, client):
        chat = fabric.sender(ALICE)
        for text in CHAT:
            await chat.send_pm(BOT, text)
        assert server.stats.pms_ignored == 3
        assert server.stats.sessions_opened == 0
        assert server.session_count == 0
        assert server.assembler.pending_messages == 0
        async with session(client, BOT) as s:
            # Chat interleaved with a live session does not disturb it.
            for text in CHAT:
                await chat.send_pm(BOT, text)
            assert echoed(await call(s, "echo", {"token": "after chat"}))["args"] == {"token": "after chat"}
        assert server.stats.pms_ignored == 6
        assert server.stats.sessions_opened == 1
        assert server.stats.dropped_invalid_jsonrpc == 0
        assert bot.accepts == 1
    assert not any(wire.is_envelope(text) for text in CHAT)


async def test_non_allowed_peer_creates_no_reassembly_state_and_no_session() -> None:
    bot = Bot()
    async with Fabric() as fabric:
        server = fabric.router(BOT, accept=bot.accept, allow=lambda peer: peer == ALICE)
        async with server, fabric.router(MALLORY) as intruder, fabric.router(ALICE) as friend:
            pm = fabric.sender(MALLORY)
            # The first part of a two-part message would open reassembly state ...
            first, _ = wire.encode(b'{"jsonrpc":"2.0","method":"x"}', sid="ab", chunk_size=16)[:2]
            await pm.send_pm(BOT, first)
            # ... and a whole initialize request would open a session.
            conn = intruder.dial(BOT)
            async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=0.3) as s:
                with pytest.raises(MCPError) as refused:
                    await s.initialize()
            assert refused.value.error.code == REQUEST_TIMEOUT
            stats = server.stats
            assert stats.dropped_denied == 2
            assert server.assembler.pending(MALLORY) == 0
            assert server.assembler.pending_messages == 0
            assert server.assembler.buffered_bytes == 0
            assert server.sessions_of(MALLORY) == 0
            assert server.session_count == 0
            assert stats.sessions_opened == 0
            assert stats.messages_delivered == 0
            assert bot.accepts == 0
            # The allowed peer is served as usual.
            async with session(friend, BOT) as s:
                assert echoed(await call(s, "echo", {}))["caller"] == ALICE
            assert server.stats.dropped_denied == 2


async def test_idle_expiry_then_re_creation_for_a_stale_client() -> None:
    async with bot_and_alice(idle_timeout=0.2) as (_fabric, bot, server, client):
        assert server.idle_timeout == 0.2
        assert client.idle_timeout is None  # client role: no expiry by default
        async with session(client, BOT, read_timeout=5) as s:
            await call(s, "echo", {"token": 1})
            await until(lambda: server.stats.idle_expired == 1)
            assert server.session_count == 0
            assert server.stats.sessions_closed == 1
            # The client never learns (no close frame) and keeps its Conn.
            assert client.session_count == 1
            # Its next request re-creates the session under the same sid; the new
            # server session was never initialized, so the request is refused.
            with pytest.raises(MCPError) as stale:
                await call(s, "echo", {"token": 2})
            assert stale.value.error.code == INVALID_PARAMS
            assert bot.accepts == 2
            assert server.stats.sessions_opened == 2
            # A fresh session works.
        async with session(client, BOT, read_timeout=5) as s:
            await call(s, "echo", {"token": 3})
    assert sorted(bot.executions()) == [1, 3]


async def test_activity_keeps_a_session_alive() -> None:
    clock = ManualClock()  # both routers' time; only the bot's idle sweeper sleeps on it
    bot = Bot()
    async with (
        Fabric() as fabric,
        fabric.router(BOT, accept=bot.accept, idle_timeout=0.5, clock=clock) as server,
        fabric.router(ALICE, clock=clock) as client,
        session(client, BOT) as s,
    ):
        # 1 s in all, well past the timeout, but never 0.5 s without traffic;
        # after each step the sweeper has looked at the session.
        for i in range(10):
            await call(s, "echo", {"token": i})
            clock.advance(0.1)
            await until(lambda: clock.sleepers == 1)
        assert server.stats.idle_expired == 0
        assert bot.accepts == 1
        # Without traffic the same sweeper expires it.
        clock.advance(0.6)
        await until(lambda: server.stats.idle_expired == 1)


async def test_per_peer_session_cap_refuses_the_third_session() -> None:
    bot = Bot()
    async with Fabric() as fabric:
        server = fabric.router(BOT, accept=bot.accept, max_sessions_per_peer=2)
        async with (
            server,
            fabric.router(ALICE) as client,
            fabric.router(uid(3)) as other,
            session(client, BOT) as one,
            session(client, BOT) as two,
        ):
            assert server.sessions_of(ALICE) == 2
            conn = client.dial(BOT)
            async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=0.3) as third:
                with pytest.raises(MCPError) as refused:
                    await third.initialize()
            assert refused.value.error.code == REQUEST_TIMEOUT
            assert bot.accepts == 2
            assert server.stats.dropped_session_cap >= 1
            assert server.sessions_of(ALICE) == 2
            # The cap is per peer: another peer still gets in, and the two live sessions still work.
            async with session(other, BOT) as s:
                await call(s, "echo", {})
            await call(one, "echo", {})
            await call(two, "echo", {})
            assert bot.accepts == 3


async def test_dial_is_never_limited_by_the_cap() -> None:
    async with Fabric() as fabric:
        router = fabric.router(ALICE, max_sessions_per_peer=1)
        async with router:
            conns = [router.dial(BOT) for _ in range(3)]
            assert router.sessions_of(BOT) == 3
            assert len({c.sid for c in conns}) == 3


async def test_inbox_overflow_closes_the_session() -> None:
    accepted: list[Conn] = []

    async def lazy_accept(conn: Conn) -> None:
        # Never reads: its inbox fills up.
        accepted.append(conn)
        await until(lambda: conn.closed, limit=30)

    async with Fabric() as fabric:
        server = fabric.router(BOT, accept=lazy_accept, inbox_size=2)
        # Unpaced: every write is delivered before it returns.
        async with server, fabric.router(ALICE, pm_interval=0) as client:
            conn = client.dial(BOT)
            for _ in range(2):
                await conn.write_stream.send(_notification())
            assert server.stats.messages_delivered == 2
            assert server.session_count == 1
            await conn.write_stream.send(_notification())
            assert server.stats.inbox_overflows == 1
            assert server.session_count == 0
            await until(lambda: len(accepted) == 1 and accepted[0].closed)
            # What was queued before the overflow is dropped with the session
            # (a reader that does not keep up cannot pin it in memory): EOF.
            assert server.stats.dropped_unread == 2
            inbox = accepted[0].read_stream
            with pytest.raises(anyio.EndOfStream):
                inbox.receive_nowait()
            # More traffic on that sid starts a new session (WIRE.md §Sessions, Closing).
            await conn.write_stream.send(_notification())
            await until(lambda: len(accepted) == 2)
            assert accepted[1].sid == accepted[0].sid == conn.sid
            assert accepted[1] is not accepted[0]


async def test_request_delayed_past_its_deadline_is_dropped() -> None:
    bot = Bot()
    skew = [0.0]
    async with Fabric() as fabric:
        server = fabric.router(BOT, accept=bot.accept, clock=lambda: time.time() + skew[0])
        # Unpaced: one PM per message, each stored while BOT is offline.
        async with server, fabric.router(ALICE, ttl=5.0, pm_interval=0) as client, session(client, BOT) as s:
            fabric.set_offline(BOT)
            outcome: list[BaseException] = []

            async def late_call() -> None:
                try:
                    await call(s, "echo", {"token": "late"}, read_timeout=1.0)
                except MCPError as exc:
                    outcome.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(late_call)
                await until(lambda: fabric.stats.pms_stored == 1)
                # BOT comes back 10 s later by its clock: the request's exp (now + 5 s) has passed.
                skew[0] = 10.0
                fabric.set_online(BOT)
                await until(lambda: server.stats.dropped_expired >= 1)
            assert bot.calls == []
            assert len(outcome) == 1
            assert isinstance(outcome[0], MCPError)
            assert outcome[0].error.code == REQUEST_TIMEOUT
            # The SDK's courtesy notifications/cancelled for the timed-out call is late too.
            assert server.stats.dropped_expired == 2
            assert server.stats.messages_delivered == 2  # initialize + notifications/initialized
            # Traffic that arrives in time is served as usual.
            skew[0] = 0.0
            assert echoed(await call(s, "echo", {"token": "on time"}))["args"] == {"token": "on time"}
    assert bot.executions() == {"on time": 1}


async def test_client_send_failure_is_a_transport_error_and_closes_the_session() -> None:
    async with bot_and_alice() as (fabric, bot, _server, client):
        conn = client.dial(BOT)
        async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=5) as s:
            await s.initialize()
            fabric.fail_sends(ALICE)
            with pytest.raises(MCPError) as failed:
                await call(s, "echo", {"token": "lost"})
            assert failed.value.error.code == CONNECTION_CLOSED
            assert failed.value.error.message == "Connection closed"
            assert conn.closed
            assert isinstance(conn.error, SendError)
            assert isinstance(conn.error.__cause__, LinkDownError)
            assert str(conn.error).startswith(f"brmcp: send to {BOT}: ")
            assert client.stats.send_failures == 1
            assert client.session_count == 0
            fabric.restore_sends(ALICE)
            # The session stays dead: later calls fail fast, they do not hang.
            with pytest.raises(MCPError) as again:
                await call(s, "echo", {"token": "later"})
            assert again.value.error.code == CONNECTION_CLOSED
    assert bot.calls == []


async def test_server_send_failure_closes_the_server_session() -> None:
    async with bot_and_alice() as (fabric, bot, server, client), session(client, BOT) as s:
        fabric.fail_sends(BOT, count=1)
        with pytest.raises(MCPError) as lost:
            await call(s, "echo", {"token": "unanswered"}, read_timeout=0.5)
        # The reply never left the bot: the client sees a timeout, not a hang.
        assert lost.value.error.code == REQUEST_TIMEOUT
        assert server.stats.send_failures == 1
        served = bot.conns[0]
        assert served.closed
        assert isinstance(served.error, SendError)
        assert isinstance(served.error.__cause__, LinkDownError)
        assert served.peer == ALICE
        # The SDK's courtesy notifications/cancelled for the timed-out call re-creates a
        # session under the same sid (WIRE.md §Sessions, Closing); the failed one stays closed.
        await until(lambda: bot.accepts == 2)
        assert bot.conns[1].sid == served.sid
        assert server.stats.sessions_closed == 1
    assert bot.executions() == {"unanswered": 1}


async def test_oversize_pm_is_refused_to_the_sender() -> None:
    bot = Bot()
    token = "z" * 10_000
    async with Fabric(max_pm_bytes=4096) as fabric:
        # v1 peers (no batches, whose parts would be larger than the chunk size).
        async with (
            fabric.router(BOT, accept=bot.accept, chunk_size=2048, batch=False),
            fabric.router(ALICE) as client,
        ):
            conn = client.dial(BOT)
            async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=5) as s:
                await s.initialize()
                with pytest.raises(MCPError) as refused:
                    await call(s, "echo", {"token": token})
                assert refused.value.error.code == CONNECTION_CLOSED
                assert isinstance(conn.error, SendError)
                assert isinstance(conn.error.__cause__, PMTooLargeError)
                assert fabric.stats.pms_refused == 1
        # With a chunk size under the relay limit the same call crosses as several parts.
        async with (
            fabric.router(BOT, accept=bot.accept, chunk_size=2048, batch=False) as server,
            fabric.router(ALICE, chunk_size=2048, pm_interval=0) as client,
            session(client, BOT) as s,
        ):
            before = fabric.link(ALICE, BOT).pms
            assert echoed(await call(s, "echo", {"token": token}))["args"] == {"token": token}
            assert fabric.link(ALICE, BOT).pms - before == 5  # ~10 KB of JSON / 2048
            assert server.stats.pms_sent >= 5
    assert bot.executions() == {token: 1}


def test_options_are_validated() -> None:
    for bad in (
        {"ttl": 0},
        {"chunk_size": 0},
        {"inbox_size": 0},
        {"idle_timeout": 0},
        {"max_sessions_per_peer": 0},
    ):
        with pytest.raises(ValueError, match="must be"):
            RouterOptions(**bad)  # type: ignore[arg-type]
    assert RouterOptions(idle_timeout=None, max_sessions_per_peer=None).idle_timeout is None


async def test_close_is_idempotent_and_refuses_dial_and_traffic() -> None:
    async with bot_and_alice() as (_fabric, bot, server, client), session(client, BOT) as s:
        await call(s, "echo", {})
        conn = client.dial(BOT)
        server.close()
        server.close()
        assert server.closed
        assert server.session_count == 0
        with pytest.raises(RuntimeError, match=r"^brmcp: router closed$"):
            server.dial(ALICE)
        # Traffic after close is ignored, not served.
        ignored = server.stats.pms_ignored
        with pytest.raises(MCPError):
            await call(s, "echo", {}, read_timeout=0.3)
        assert server.stats.pms_ignored > ignored
        client.close()
        assert conn.closed
        with pytest.raises(RuntimeError, match="brmcp: router closed"):
            client.dial(BOT)
    assert bot.accepts == 1


async def test_leaving_the_router_cancels_its_tasks() -> None:
    async def stubborn(conn: Conn) -> None:
        # Ignores EOF: only cancellation ends it.
        await anyio.sleep_forever()

    before = asyncio.all_tasks()
    async with Fabric() as fabric:
        server = fabric.router(BOT, accept=stubborn, idle_timeout=60)
        async with server, fabric.router(ALICE) as client:
            for _ in range(3):
                await client.dial(BOT).write_stream.send(_notification())
            await until(lambda: server.session_count == 3)
            names = sorted(t.get_name() for t in asyncio.all_tasks() - before)
            assert sum(name.startswith("brmcp-session-") for name in names) == 3
            assert "brmcp-router-idle-sweeper" in names
        leftover = [t for t in asyncio.all_tasks() - before if t.get_name().startswith("brmcp-")]
        assert leftover == []
        assert server.closed
        assert client.closed


async def test_accept_exceptions_are_logged_and_do_not_kill_the_router(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bot = Bot()
    attempts = 0

    async def flaky(conn: Conn) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RuntimeError("accept exploded")
        await bot.accept(conn)

    caplog.set_level(logging.ERROR, logger="brmcp.transport")
    async with Fabric() as fabric, fabric.router(BOT, accept=flaky) as server, fabric.router(ALICE) as client:
        conn = client.dial(BOT)
        async with ClientSession(conn.read_stream, conn.write_stream, read_timeout_seconds=0.3) as s:
            with pytest.raises(MCPError):
                await s.initialize()
        assert server.session_count == 0
        # The router and its other sessions carry on.
        async with session(client, BOT) as s:
            assert echoed(await call(s, "echo", {}))["caller"] == ALICE
    failures = [r for r in caplog.records if "accept handler failed" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].exc_info is not None
    assert isinstance(failures[0].exc_info[1], RuntimeError)


async def test_server_role_router_must_be_entered() -> None:
    router = Router(Fabric().sender(BOT), accept=Bot().accept)
    text = wire.encode(b'{"jsonrpc":"2.0","method":"notifications/initialized"}', sid="a1")[0]
    with pytest.raises(RuntimeError, match="entered"):
        router.handle_pm(ALICE, text)
    # A client-role router just drops unknown sessions, entered or not.
    client = Router(Fabric().sender(ALICE))
    client.handle_pm(BOT, text)
    assert client.stats.dropped_unknown_session == 1
