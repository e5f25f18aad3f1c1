"""The fake brclient's wire behaviour, driven by a bare websocket (no client
logic): framing, errors and their texts, connection-killing input, the
16-request stall, pong padding, Origin checks and the POST endpoint."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from brmcp.testing.fakebr import KIND_PM, FakeBRClient
from tests.kit import until
from tests.kit.clientrpc import client_ssl, fake_network, raw_ws, recv_json, request


async def _error_for(ws: Any, method: str, params: Any, rid: int = 1) -> dict[str, Any]:
    await request(ws, rid, method, params)
    reply = await recv_json(ws)
    assert reply["id"] == rid
    assert "result" not in reply
    return dict(reply["error"])


async def test_frames_are_binary_json_lines_in_go_key_order(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)), raw_ws(bot) as ws:
            await ws.send(
                '{"jsonrpc":"2.0","id":7,"params":{},"method":"VersionService.Version"}'
            )  # text is fine
            raw = await ws.recv()
            assert isinstance(raw, bytes)
            assert raw.endswith(b"}\n")
            assert raw.count(b"\n") == 1
            assert list(json.loads(raw)) == ["jsonrpc", "id", "result"]
            await request(ws, "dummy_id", "VersionService.Version")
            assert (await recv_json(ws))["id"] == "dummy_id"  # ids are echoed as sent


async def test_params_errors_are_32602_with_protojson_texts(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)), raw_ws(bot) as ws:
            err = await _error_for(ws, "VersionService.Version", {"foo": 1})
            assert err == {
                "code": -32602,
                "message": 'unable to decode params: proto: (line 1:2): unknown field "foo"',
            }
            err = await _error_for(ws, "ChatService.AckReceivedPM", {"sequenceId": "abc"})
            assert err["code"] == -32602
            assert "invalid value for uint64 field sequenceId" in err["message"]
            err = await _error_for(ws, "ChatService.AckReceivedPM", {"sequenceId": "1", "sequence_id": "2"})
            assert err["code"] == -32602
            assert "duplicate field" in err["message"]
            err = await _error_for(
                ws, "ChatService.PM", {"user": "x", "msg": {"message": "m", "bogus": True}}
            )
            assert err["code"] == -32602
            assert 'unknown field "bogus"' in err["message"]
            err = await _error_for(ws, "PaymentsService.TipUser", {"maxAttempts": 1.5})
            assert err["code"] == -32602
            await ws.send(b'{"jsonrpc":"2.0","id":9,"params":null,"method":"VersionService.Version"}')
            assert (await recv_json(ws))["error"]["code"] == -32602
            await ws.send(b'{"jsonrpc":"2.0","id":10,"method":"VersionService.Version"}\n')  # no params
            assert (await recv_json(ws))["error"]["code"] == -32602
            # Accepted input forms: proto names, numbers for 64-bit ids, enum numbers.
            await request(ws, 11, "ChatService.AckReceivedPM", {"sequence_id": 5})
            assert (await recv_json(ws))["result"] == {}


async def test_unknown_methods_are_32603(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)), raw_ws(bot) as ws:
            cases = {
                "NopeService.Version": "unknown service",
                "ChatService.Nope": "unknown method",
                "Version": "method is not Service.Method",
                "ChatService.PMStream[0000000a]": "unknown method",  # hex suffixes are not stripped
            }
            for method, text in cases.items():
                assert await _error_for(ws, method, {}) == {"code": -32603, "message": text}
            # A decimal suffix is stripped, even on a unary method.
            await request(ws, 2, "VersionService.Version[00000123]")
            assert (await recv_json(ws))["result"]["appName"] == "brclient"


async def test_handler_errors_carry_brclient_texts(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice", max_remote_send_tip_amt=0.5) as (_, (bot, alice)),
            raw_ws(bot) as ws,
        ):
            cases: list[tuple[str, dict[str, Any], str]] = [
                ("ChatService.PM", {"user": "carol", "msg": {"message": "x"}}, "user carol not found"),
                ("ChatService.PM", {"user": alice.uid}, "msg is nil"),
                ("ChatService.PM", {"user": alice.uid, "msg": {}}, "msg is empty"),
                ("PaymentsService.TipUser", {"user": alice.uid, "dcrAmount": 0.1}, "maxAttempts 0 <= 0"),
                (
                    "PaymentsService.TipUser",
                    {"user": alice.uid, "dcrAmount": 0.6, "maxAttempts": 1},
                    "tip exceeds max limit: 0.5",
                ),
                (
                    "PaymentsService.TipUser",
                    {"user": alice.uid, "maxAttempts": 1},
                    "cannot pay user 0.000000 <= 0",
                ),
            ]
            for method, params, text in cases:
                assert await _error_for(ws, method, params) == {"code": -32603, "message": text}
            # Nick and long-enough uid prefixes resolve like brclient's UserByNick.
            for user in ("ALICE", alice.uid[:5]):
                await request(ws, 3, "ChatService.PM", {"user": user, "msg": {"message": "hi"}})
                assert (await recv_json(ws))["result"] == {}
            assert (await _error_for(ws, "ChatService.PM", {"user": alice.uid[:4], "msg": {"message": "x"}}))[
                "message"
            ] == (f"user {alice.uid[:4]} not found")


async def test_tip_guard_refuses_remote_tips(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice", allow_remote_send_tip=False) as (_, (bot, alice)),
            raw_ws(bot) as ws,
        ):
            params = {"user": alice.uid, "dcrAmount": 0.1, "maxAttempts": 1}
            assert (await _error_for(ws, "PaymentsService.TipUser", params))[
                "message"
            ] == "remote tip sending not allowed"


async def test_streams_get_no_response_until_they_end(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)), raw_ws(bot) as ws:
            bot.emit_pm(alice.uid, "before")
            await request(ws, 1, "ChatService.PMStream[00000007]")
            replayed = await recv_json(ws)
            assert list(replayed) == ["jsonrpc", "params", "method"]
            assert replayed["method"] == "ChatService.PMStream[00000007]"
            await request(ws, 2, "VersionService.Version")
            assert (await recv_json(ws))["id"] == 2  # the stream request itself got nothing
            bot.emit_pm(alice.uid, "live")
            assert (await recv_json(ws))["params"]["msg"] == {"message": "live"}
            # Unsuffixed streams work too; notifications then carry the bare name.
            await request(ws, 3, "ChatService.PMStream", {"unackedFrom": replayed["params"]["sequenceId"]})
            bot.emit_pm(alice.uid, "third")
            got = [await recv_json(ws), await recv_json(ws), await recv_json(ws)]
            methods = [m["method"] for m in got]
            # "live" replayed (above unackedFrom) and "third" on the bare stream, "third" on stream 7.
            assert methods.count("ChatService.PMStream") == 2
            assert methods.count("ChatService.PMStream[00000007]") == 1
            assert bot.end_streams(KIND_PM, code=-32603, message="boom") == 2
            ends = [await recv_json(ws), await recv_json(ws)]
            assert sorted(e["id"] for e in ends) == [1, 3]
            assert {json.dumps(e["error"]) for e in ends} == {'{"code": -32603, "message": "boom"}'}


async def test_connection_killing_input(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            for bad in (
                b"{not json",
                b'[{"jsonrpc":"2.0","id":1,"params":{},"method":"VersionService.Version"}]',
                b'{"jsonrpc":"1.0","id":1,"params":{},"method":"VersionService.Version"}',
                b"42",
            ):
                async with raw_ws(bot) as ws:
                    await ws.send(bad)
                    with pytest.raises(ConnectionClosed):
                        await ws.recv()
            await bot.wait_for(lambda: bot.connection_count == 0)


async def test_lenient_input_is_accepted(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)), raw_ws(bot) as ws:
            # Only the first JSON value counts; keys match case-insensitively; client
            # notifications and responses are ignored.
            await ws.send(b'{"jsonrpc":"2.0","method":"VersionService.Version","params":{}}\n')
            await ws.send(b'{"jsonrpc":"2.0","id":99,"result":{}}\n')
            await ws.send(
                b'{"JSONRPC":"2.0","ID":1,"Params":{},"METHOD":"VersionService.Version"} trailing junk'
            )
            reply = await recv_json(ws)
            assert reply["id"] == 1
            assert reply["result"]["appName"] == "brclient"


async def test_seventeenth_request_stalls_the_reader(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)), raw_ws(bot) as ws:
            bot.hold("VersionService.Version")
            for rid in range(1, 18):
                await request(ws, rid, "VersionService.Version")
            await bot.wait_for(lambda: len(bot.requests) == 16)
            pong = await ws.ping(b"x" * 16)
            # The reader took the 17th message and waits for a free slot: the
            # ping behind it on the connection is not read, so not answered.
            await until(lambda: len(bot.frames_in) == 17)
            assert not pong.done(), "a stalled reader must not answer pings"
            assert len(bot.requests) == 16
            assert bot.in_flight() == [16]
            bot.release("VersionService.Version")
            ids = sorted([(await recv_json(ws))["id"] for _ in range(17)])
            assert ids == list(range(1, 18))
            await pong  # answered once reading resumed


async def test_pongs_are_padded_to_16_bytes(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)), raw_ws(bot) as ws:
            exact = await ws.ping(b"0123456789abcdef")
            await exact  # 16 bytes come back unchanged
            waiters = [await ws.ping(payload) for payload in (b"abcd", b"0123456789abcdefXYZ")]
            # The reply to a request sent after the pings comes after their pongs.
            await request(ws, 1, "VersionService.Version")
            assert (await recv_json(ws))["id"] == 1
            # brclient pads/truncates pong payloads to 16 bytes, so these never match.
            assert not any(w.done() for w in waiters)
            assert bot.pings_received == [b"0123456789abcdef", b"abcd", b"0123456789abcdefXYZ"]


async def test_websockets_default_keepalive_fails_against_brclient_pongs(tmp_path: Path) -> None:
    """websockets' 4-byte keepalive pings never match brclient's 16-byte pongs
    (docs/clientrpc.md §Keepalive)."""
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            async with raw_ws(bot, ping_interval=0.05, ping_timeout=0.2) as ws:
                with pytest.raises(ConnectionClosed) as info:
                    await ws.recv()
            assert info.value.sent is not None
            assert (info.value.sent.code, info.value.sent.reason) == (1011, "keepalive ping timeout")


async def test_server_keepalive_drops_clients_that_do_not_answer(tmp_path: Path) -> None:
    """A client that upgrades and then never reads gets no pongs out: the fake's
    ping watchdog drops it (docs/clientrpc.md §Keepalive)."""
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", ping_interval=0.05, ping_timeout=0.2) as (_, (bot,)):
            stream = await anyio.connect_tcp(
                "127.0.0.1", bot.port, tls=True, ssl_context=client_ssl(bot), tls_hostname="127.0.0.1"
            )
            try:
                await stream.send(
                    f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{bot.port}\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n".encode()
                )
                head = b""
                while b"\r\n\r\n" not in head:
                    head += await stream.receive()
                assert head.startswith(b"HTTP/1.1 101")
                await bot.wait_connections(1)
                await bot.wait_for(lambda: bot.connection_count == 0)  # dropped: no pong came back
                assert bot.total_connections == 1
            finally:
                await anyio.aclose_forcefully(stream)


async def test_origin_check(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            with pytest.raises(InvalidStatus) as info:
                async with raw_ws(bot, origin="https://evil.example"):
                    pass
            assert info.value.response.status_code == 403
            async with raw_ws(bot, origin=f"https://127.0.0.1:{bot.port}"):
                pass
            async with raw_ws(bot, origin="null"):
                pass


async def _post(
    bot: FakeBRClient, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    ctx: ssl.SSLContext = client_ssl(bot)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"https://127.0.0.1:{bot.port}{path}", data=body, ssl=ctx, headers=headers or {}
        ) as resp,
    ):
        return resp.status, await resp.text()


async def test_post_endpoint_and_its_auth_wrapper_quirk(tmp_path: Path) -> None:
    body = (
        b'{"jsonrpc":"2.0","id":1,"params":{},"method":"VersionService.Version"}\n'
        b'{"jsonrpc":"2.0","id":2,"params":{"x":1},"method":"VersionService.Version"}'
    )
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            for path in ("/", "/ws/", "/anything?q=1"):
                status, text = await _post(bot, path, body)
                assert status == 200
                lines = text.split("\n")
                assert json.loads(lines[0])["result"]["appName"] == "brclient"
                assert json.loads(lines[1])["error"]["code"] == -32602
                # No auth mode and no server credentials: the wrapper appends its 401 text.
                assert lines[2:] == ["Forbidden", ""]
        async with fake_network(tmp_path / "auth", "bot", auth_mode="basic", rpcuser="u", rpcpass="p") as (
            _,
            (bot,),
        ):
            status, text = await _post(bot, "/", body)
            assert (status, text) == (401, "Unauthorized\n")
            status, text = await _post(bot, "/", body, {"Authorization": "Basic dTpw"})
            assert status == 200
            assert text.count("\n") == 2
            assert text.endswith("}\n")
