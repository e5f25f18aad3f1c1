"""brmcp.clientrpc.Client against the fake brclient over real TLS on loopback:
requests, streams, acks, replay and dedupe across reconnects, the 16-slot
limit, keepalive, and bad server input."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp.clientrpc import (
    MAX_IN_FLIGHT,
    Backoff,
    ClientrpcConnectionError,
    ClientrpcConnectionLost,
    ClientrpcNotConnected,
    ReceivedPM,
    RPCError,
)
from brmcp.clientrpc.protojson import dumps, frame
from brmcp.testing.fakebr import KIND_PM, KIND_TIP_PROGRESS, KIND_TIP_RECEIVED
from tests.kit import until
from tests.kit.clientrpc import FAST, fake_network


async def test_version_identity_and_pm_round_trip(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)),
            bot.client(**FAST) as cb,
            alice.client(**FAST) as ca,
        ):
            await cb.wait_connected()
            await ca.wait_connected()
            version = await cb.version()
            assert (version.app_name, version.app_version) == ("brclient", "0.2.4")
            ident = await cb.user_public_identity()
            assert ident.uid == bot.uid
            assert ident.nick == "bot"
            assert len(ident.sig_key) == 32

            async with cb.pm_stream() as pms:
                await ca.send_pm(bot.uid, "hello <bot> & co")
                pm = await pms.__anext__()
            assert isinstance(pm, ReceivedPM)
            assert (pm.uid, pm.nick, pm.message, pm.mode) == (
                alice.uid,
                "alice",
                "hello <bot> & co",
                "MESSAGE_MODE_NORMAL",
            )
            # First entry of log file 1: the offset is the stored line's length + 1.
            line = dumps(dataclasses.replace(pm, sequence_id=0).to_wire()).encode()
            assert pm.sequence_id == (1 << 32) | (len(line) + 1)
            assert bot.pending_events(KIND_PM) == [pm]
            await cb.ack_received_pm(pm.sequence_id)
            assert bot.pending_events(KIND_PM) == []


async def test_each_ack_goes_to_its_own_log(tmp_path: Path) -> None:
    """AckTipReceived clears received tips (not tip progress), and vice versa."""
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)), bot.client(**FAST) as cb:
            await cb.wait_connected()
            tip = bot.emit_received_tip(alice.uid, 5000)
            progress = bot.emit_tip_progress(alice.uid, 7000, completed=True, attempt=1)
            await cb.ack_tip_received(tip.sequence_id)
            assert bot.pending_events(KIND_TIP_RECEIVED) == []
            assert bot.pending_events(KIND_TIP_PROGRESS) == [progress]
            await cb.ack_tip_progress(progress.sequence_id)
            assert bot.pending_events(KIND_TIP_PROGRESS) == []
            methods = [m for m, _ in bot.requests]
            assert methods == ["PaymentsService.AckTipReceived", "PaymentsService.AckTipProgress"]


async def test_replay_after_reconnect_is_deduplicated(tmp_path: Path) -> None:
    connected: list[int] = []
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)),
            bot.client(on_connected=lambda: connected.append(1), **FAST) as cb,
        ):
            async with cb.pm_stream() as pms:
                await pms.wait_open()
                for i in range(3):
                    bot.emit_pm(alice.uid, f"m{i}")
                first = [await pms.__anext__() for _ in range(3)]
                bot.drop_connections()
                await bot.wait_for(lambda: bot.total_connections == 2 and bot.stream_count(KIND_PM) == 1)
                bot.emit_pm(alice.uid, "m3")
                fourth = await pms.__anext__()
                assert [e.message for e in [*first, fourth]] == ["m0", "m1", "m2", "m3"]
                assert pms.duplicates == 3  # the replayed m0..m2
                assert pms.pending == 0
                assert pms.opens == 2
                # The reopened stream asked for everything not acked, with a fresh suffix.
                assert bot.stream_methods(KIND_PM) == ["ChatService.PMStream[00000000]"]
                assert bot.requests[-1] == ("ChatService.PMStream[00000000]", {})
            assert cb.connections == 2
            assert len(connected) == 2


async def test_drop_mid_stream_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    total = 60
    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)), bot.client(**FAST) as cb:
            got: list[ReceivedPM] = []
            async with cb.pm_stream() as pms:
                await pms.wait_open()

                async def produce() -> None:
                    for i in range(total):
                        bot.emit_pm(alice.uid, f"n{i}")
                        if i % 15 == 7:
                            await bot.wait_for(lambda: bot.stream_count(KIND_PM) == 1)
                            bot.drop_connections()
                        await anyio.sleep(0.003)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(produce)
                    async for pm in pms:
                        got.append(pm)
                        if len(got) % 10 == 0:
                            with contextlib.suppress(ClientrpcConnectionError):
                                await cb.ack_received_pm(pm.sequence_id)
                        if len(got) == total:
                            break
            assert [p.message for p in got] == [f"n{i}" for i in range(total)]
            assert len({p.sequence_id for p in got}) == total
            assert bot.total_connections == 5  # four drops mid-stream


async def test_two_subscriptions_each_see_every_event(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)),
            bot.client(**FAST) as cb,
            cb.pm_stream() as a,
            cb.pm_stream() as b,
        ):
            await bot.wait_streams(KIND_PM, 2)
            assert sorted(bot.stream_methods(KIND_PM)) == [
                "ChatService.PMStream[00000000]",
                "ChatService.PMStream[00000001]",
            ]
            bot.emit_pm(alice.uid, "both")
            assert (await a.__anext__()).message == "both"
            assert (await b.__anext__()).message == "both"


async def test_sixteen_slots_streams_included(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)), bot.client(**FAST) as cb:
            streams = [cb.pm_stream(), cb.tip_stream(), cb.tip_progress()]
            for s in streams:
                await s.wait_open()
            assert cb.in_flight == 3
            bot.hold("VersionService.Version")
            results: list[Any] = []

            async def ask() -> None:
                results.append(await cb.version())

            async with anyio.create_task_group() as tg:
                for _ in range(20):
                    tg.start_soon(ask)
                await bot.wait_for(lambda: sum(bot.in_flight()) == MAX_IN_FLIGHT)
                # The fake's reader stalls on a 17th request, and then no pong is
                # read: an answered ping shows every request sent so far was read.
                assert await bot.ping(b"all requests read") == [b"all requests read"]
                assert bot.in_flight() == [MAX_IN_FLIGHT]
                assert cb.in_flight == MAX_IN_FLIGHT
                assert sum(1 for m, _ in bot.requests if m == "VersionService.Version") == 13
                bot.release("VersionService.Version")
            assert len(results) == 20
            assert bot.max_in_flight_seen == MAX_IN_FLIGHT
            assert cb.in_flight == 3
            for s in streams:
                s.close()


async def test_timed_out_request_keeps_its_slot_until_answered(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot") as (_, (bot,)),
            bot.client(request_timeout=0.05, **FAST) as cb,
        ):
            await cb.wait_connected()
            bot.hold("VersionService.Version")
            with pytest.raises(TimeoutError):
                await cb.version()
            assert cb.in_flight == 1  # brclient still counts it
            bot.release("VersionService.Version")
            await bot.wait_for(lambda: bot.in_flight() == [0])
            # The late reply precedes this one on the wire, so its slot is free by now.
            assert (await cb.version()).app_name == "brclient"
            assert cb.in_flight == 0


async def test_disconnected_sends_fail_fast_and_in_flight_ones_are_lost(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)), bot.client(**FAST) as cb:
            await cb.wait_connected()
            bot.hold("ChatService.PM")
            caught: list[BaseException] = []

            async def send() -> None:
                try:
                    await cb.send_pm(alice.uid, "hi")
                except ClientrpcConnectionLost as exc:
                    caught.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(send)
                await bot.wait_for(lambda: any(m == "ChatService.PM" for m, _ in bot.requests))
                bot.pause_reading()  # so the reconnect below cannot complete yet
                bot.drop_connections()
            assert len(caught) == 1
            assert "ChatService.PM" in str(caught[0])
            await bot.wait_for(lambda: not cb.connected)
            with pytest.raises(ClientrpcNotConnected, match=r"^brclient not connected$"):
                await cb.send_pm(alice.uid, "hi")
            bot.resume_reading()
            bot.release("ChatService.PM")
            await cb.wait_connected()
            await cb.send_pm(alice.uid, "back")


async def test_rpc_errors_carry_brclient_texts(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)), bot.client(**FAST) as cb:
            await cb.wait_connected()
            stranger = "ab" * 32
            with pytest.raises(RPCError) as info:
                await cb.send_pm(stranger, "hi")
            assert (info.value.code, str(info.value)) == (-32603, f"user {stranger} not found")
            with pytest.raises(RPCError, match=r"^msg is empty$"):
                await cb.send_pm(alice.uid, "")
            with pytest.raises(RPCError, match=r"^maxAttempts 0 <= 0$"):
                await cb.tip_user(alice.uid, 0.0001, 0)
            with pytest.raises(RPCError) as info:
                await cb.call("ChatService.PM", {"user": alice.uid, "msg": {"message": "x"}, "extra": 1})
            assert info.value.code == -32602
            assert info.value.message.startswith("unable to decode params: ")
            assert 'unknown field "extra"' in info.value.message
            with pytest.raises(RPCError, match=r"^unknown method$"):
                await cb.call("ChatService.Nope", {})
            with pytest.raises(RPCError, match=r"^unknown service$"):
                await cb.call("NopeService.Nope", {})


async def test_bad_server_input_is_survived(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)),
            bot.client(**FAST) as cb,
            cb.pm_stream() as pms,
        ):
            await bot.wait_streams(KIND_PM, 1)
            method = bot.stream_methods(KIND_PM)[0]
            # Unknown notification, response to an unknown id, error without id,
            # wrong version, an undecodable event: logged, connection kept.
            bot.send_notification("ChatService.PMStream[00000042]", {"uid": "x"})
            bot.send_raw(frame({"jsonrpc": "2.0", "id": 999, "result": {}}))
            bot.send_raw(frame({"jsonrpc": "2.0", "id": "abc", "result": {}}))
            bot.send_raw(frame({"jsonrpc": "2.0", "error": {"code": 1, "message": "x"}}))
            bot.send_raw(frame({"jsonrpc": "1.0", "method": method, "params": {}}))
            bot.send_notification(method, {"uid": "not base64!"})
            bot.send_notification(method, "not an object")
            bot.emit_pm(alice.uid, "still fine")
            assert (await pms.__anext__()).message == "still fine"
            assert pms.malformed == 2
            assert cb.connections == 1
            # Malformed JSON: the connection state is unknowable, so reconnect.
            bot.send_raw(b"{this is not json\n")
            await bot.wait_for(lambda: bot.total_connections == 2 and bot.stream_count(KIND_PM) == 1)
            bot.send_raw(b"[1,2,3]\n")
            await bot.wait_for(lambda: bot.total_connections == 3 and bot.stream_count(KIND_PM) == 1)
            bot.emit_pm(alice.uid, "after")
            assert (await pms.__anext__()).message == "after"
            assert pms.duplicates == 2  # "still fine" replayed twice
        assert "unknown stream" in caplog.text
        assert "malformed JSON" in caplog.text


async def test_stream_ended_by_server_is_reopened(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)),
            bot.client(**FAST) as cb,
            cb.tip_stream() as tips,
        ):
            await bot.wait_streams(KIND_TIP_RECEIVED, 1)
            assert bot.end_streams(KIND_TIP_RECEIVED, code=-32603, message="replay failed") == 1
            await bot.wait_for(
                lambda: bot.stream_methods(KIND_TIP_RECEIVED) == ["PaymentsService.TipStream[00000001]"]
            )
            assert bot.end_streams(KIND_TIP_RECEIVED) == 1  # a clean EOF
            await bot.wait_for(
                lambda: bot.stream_methods(KIND_TIP_RECEIVED) == ["PaymentsService.TipStream[00000002]"]
            )
            tip = bot.emit_received_tip(alice.uid, 12_345_000)
            got = await tips.__anext__()
            assert got == tip
            assert got.atoms == 12_345
            assert cb.connections == 1
            assert tips.opens == 3
            assert cb.in_flight == 1  # ended streams gave their slots back


async def test_closed_subscription_keeps_its_slot_until_the_connection_ends(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)), bot.client(**FAST) as cb:
            sub = cb.pm_stream()
            await sub.wait_open()
            sub.close()
            bot.emit_pm(alice.uid, "ignored")
            assert [e async for e in sub] == []
            assert cb.in_flight == 1  # brclient has no cancel message
            bot.drop_connections()
            await bot.wait_for(lambda: bot.total_connections == 2)
            await cb.wait_connected()
            assert bot.stream_count(KIND_PM) == 0
            assert cb.in_flight == 0


async def test_keepalive_uses_16_byte_pings_and_survives_padded_pongs(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            opts = {**FAST, "ping_interval": 0.02, "ping_timeout": 2.0}
            async with bot.client(**opts) as cb:
                await cb.wait_connected()
                await bot.wait_for(lambda: len(bot.pings_received) >= 5)
                assert all(len(p) == 16 for p in bot.pings_received)
                assert len(set(bot.pings_received)) == len(bot.pings_received)  # random payloads
                assert cb.connections == 1
                assert cb.connected


async def test_server_short_ping_is_answered(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)), bot.client(**FAST) as cb:
            await cb.wait_connected()
            assert await bot.ping(b"abc") == [b"abc"]
            assert await bot.ping(b"") == [b""]
            assert cb.connections == 1


async def test_server_keepalive_pings_do_not_disturb_the_client(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", ping_interval=0.02, ping_timeout=2.0) as (_, (bot,)),
            bot.client(**FAST) as cb,
        ):
            await cb.wait_connected()
            await bot.wait_for(lambda: bot.total_connections == 1)
            await bot.wait_for(lambda: bot.keepalive_pongs >= 5)
            assert bot.total_connections == 1
            assert cb.connections == 1
            assert (await cb.version()).app_name == "brclient"


async def test_stalled_server_is_detected_by_keepalive(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            opts = {**FAST, "ping_interval": 0.05, "ping_timeout": 0.2}
            async with bot.client(**opts) as cb:
                await cb.wait_connected()
                bot.pause_reading()
                await bot.wait_for(lambda: not cb.connected)
                bot.resume_reading()
                await cb.wait_connected()
                assert cb.connections >= 2


def test_backoff_doubles_to_the_cap_and_resets() -> None:
    backoff = Backoff(1.0, 30.0)
    assert [backoff.next() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    backoff.reset()
    assert backoff.next() == 1.0
    with pytest.raises(ValueError, match="backoff_initial"):
        Backoff(0.0)


async def test_dial_failures_back_off_then_connect(tmp_path: Path) -> None:
    """A client started before its brclient keeps retrying and connects once it is up."""
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            url = bot.url
            await bot.__aexit__(None, None, None)  # stop it; keep its certs and port
            async with bot.client(**FAST) as cb:
                assert cb.url == url
                await until(lambda: cb.last_error is not None)
                assert "connection refused" in str(cb.last_error)
                assert "\n" not in str(cb.last_error)
                await bot.__aenter__()
                await cb.wait_connected()
                assert cb.last_error is None
