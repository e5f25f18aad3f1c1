"""clientrpc wire format: the example messages of docs/clientrpc.md §Example
messages produced and
parsed byte for byte (by the client and by the fake), and the protojson rules."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from brmcp.clientrpc import (
    ProtojsonError,
    PublicIdentity,
    ReceivedPM,
    ReceivedTip,
    TipProgressEvent,
    VersionResponse,
    atoms_to_dcr,
    dcr_to_matoms,
)
from brmcp.clientrpc.protojson import decode_bytes, decode_int, dumps, format_double, frame
from brmcp.clientrpc.types import ack_params, pm_params, stream_params, tip_user_params
from brmcp.testing.fakebr import KIND_PM, KIND_TIP_PROGRESS, KIND_TIP_RECEIVED
from tests.kit.clientrpc import FAST, fake_network, raw_ws, request
from tests.kit.paths import REPO

UID_B64 = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA="
UID_HEX = "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20"

# docs/clientrpc.md §Example messages, verbatim (checked below).
EX_A = (
    '{"jsonrpc":"2.0","id":1,"params":{"unackedFrom":"4294967296"},"method":"ChatService.PMStream[00000000]"}'
)
EX_B = (
    '{"jsonrpc":"2.0","params":{"uid":"AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=","nick":"alice",'
    '"msg":{"message":"hello bot"},"timestampMs":"1735689600123","sequenceId":"4294967483"},'
    '"method":"ChatService.PMStream[00000000]"}'
)
EX_C_REQ = (
    '{"jsonrpc":"2.0","id":2,"params":{"sequenceId":"4294967483"},"method":"ChatService.AckReceivedPM"}'
)
EX_C_RESP = '{"jsonrpc":"2.0","id":2,"result":{}}'
EX_D_TIP = (
    '{"jsonrpc":"2.0","params":{"uid":"AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=","amountMatoms":"10000000",'
    '"sequenceId":"4294967371"},"method":"PaymentsService.TipStream[00000001]"}'
)
EX_D_DONE = (
    '{"jsonrpc":"2.0","params":{"sequenceId":"4294967420","uid":"AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=",'
    '"nick":"alice","amountMatoms":"10000000","completed":true,"attempt":1},'
    '"method":"PaymentsService.TipProgress[00000002]"}'
)
EX_D_RETRY = (
    '{"jsonrpc":"2.0","params":{"sequenceId":"4294967560","uid":"AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=",'
    '"nick":"alice","amountMatoms":"10000000","attempt":1,"attemptErr":"invoice timeout","willRetry":true},'
    '"method":"PaymentsService.TipProgress[00000002]"}'
)
EX_E_PM = (
    '{"jsonrpc":"2.0","id":3,"params":{"user":"0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20",'
    '"msg":{"message":"thanks!"}},"method":"ChatService.PM"}'
)
EX_E_PM_RESP = '{"jsonrpc":"2.0","id":3,"result":{}}'
EX_E_TIP = (
    '{"jsonrpc":"2.0","id":4,"params":{"user":"0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20",'
    '"dcrAmount":0.0001,"maxAttempts":3},"method":"PaymentsService.TipUser"}'
)
EX_E_TIP_RESP = (
    '{"jsonrpc":"2.0","id":4,"error":{"code":-32603,"message":"user '
    '0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20 not found"}}'
)
EX_F_REQ = '{"jsonrpc":"2.0","id":5,"params":{},"method":"VersionService.Version"}'
EX_F_RESP = (
    '{"jsonrpc":"2.0","id":5,"result":{"appVersion":"0.2.4","goRuntime":"go1.23.x","appName":"brclient"}}'
)
EX_F_EOF = '{"jsonrpc":"2.0","id":1,"error":{"code":10000,"message":"EOF"}}'


def _line(text: str) -> bytes:
    return (text + "\n").encode()


def _with_seq(example: str, illustrative: int, actual: int) -> bytes:
    """The example with its illustrative sequence id replaced by the one the
    fake's replay log assigned."""
    assert example.count(f'"{illustrative}"') == 1
    return _line(example.replace(f'"{illustrative}"', f'"{actual}"'))


def test_the_examples_are_the_documents_verbatim() -> None:
    """docs/clientrpc.md §Example messages shows exactly these messages."""
    doc = (REPO / "docs/clientrpc.md").read_text(encoding="utf-8")
    examples = (EX_A, EX_B, EX_C_REQ, EX_C_RESP, EX_D_TIP, EX_D_DONE, EX_D_RETRY)
    examples += (EX_E_PM, EX_E_PM_RESP, EX_E_TIP, EX_E_TIP_RESP, EX_F_REQ, EX_F_RESP, EX_F_EOF)
    missing = [example for example in examples if example not in doc.splitlines()]
    assert not missing, missing


# -- protojson ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0001, "0.0001"),
        (0.00001, "0.00001"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (1.5e-10, "1.5e-10"),
        (1.0, "1"),
        (10000.0, "10000"),
        (123456789.125, "123456789.125"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (-2.5, "-2.5"),
        (0.0, "0"),
        (math.inf, '"Infinity"'),
        (math.nan, '"NaN"'),
    ],
)
def test_doubles_are_written_as_go_does(value: float, text: str) -> None:
    assert format_double(value) == text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_double_text_round_trips(value: float) -> None:
    text = format_double(value)
    assert float(json.loads(text)) == value
    assert not text.endswith(".0")
    assert "e-0" not in text


def test_strings_are_html_escaped_like_go() -> None:
    assert dumps({"a": "<b>&\u2028\u2029é\n"}) == '{"a":"\\u003cb\\u003e\\u0026\\u2028\\u2029é\\n"}'
    assert dumps("\ud800") == '"\\ufffd"'
    assert frame({"x": 1}) == b'{"x":1}\n'


def test_lenient_decoding_of_server_values() -> None:
    raw = bytes(range(1, 33))
    urlsafe = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert decode_bytes(urlsafe, "uid") == raw
    assert decode_int(4294967483, "sequenceId") == decode_int("4294967483", "sequenceId") == 4294967483
    with pytest.raises(ProtojsonError):
        decode_int("12x", "sequenceId")
    with pytest.raises(ProtojsonError):
        decode_int(-1, "sequenceId")
    with pytest.raises(ProtojsonError):
        decode_bytes("!!", "uid")
    pm = ReceivedPM.from_wire(
        {"uid": urlsafe, "msg": {"message": "hi", "mode": 1}, "timestamp_ms": 5, "sequence_id": "7"}
    )
    assert (pm.uid, pm.nick, pm.message, pm.mode, pm.timestamp_ms, pm.sequence_id) == (
        UID_HEX,
        "",
        "hi",
        "MESSAGE_MODE_ME",
        5,
        7,
    )
    with pytest.raises(ProtojsonError, match="32 bytes"):
        ReceivedTip.from_wire({"uid": base64.b64encode(b"short").decode()})
    with pytest.raises(ProtojsonError):
        TipProgressEvent.from_wire({"uid": UID_B64, "completed": "yes"})


def test_defaults_are_omitted_from_requests_and_events() -> None:
    assert stream_params(0) == {}
    assert ack_params(0) == {}
    assert stream_params(4294967296) == {"unackedFrom": "4294967296"}
    assert tip_user_params(UID_HEX, 0.0, 0) == {"user": UID_HEX}
    assert pm_params(UID_HEX, "") == {"user": UID_HEX, "msg": {}}
    event = TipProgressEvent(sequence_id=9, uid=UID_HEX, nick="", amount_matoms=0)
    assert event.to_wire() == {"sequenceId": "9", "uid": UID_B64}
    assert VersionResponse("", "", "").to_wire() == {}


def test_units() -> None:
    assert atoms_to_dcr(10_000) == 0.0001
    assert dcr_to_matoms(0.0001) == 10_000_000
    assert dcr_to_matoms(atoms_to_dcr(12_345)) == 12_345_000
    assert ReceivedTip(uid=UID_HEX, amount_matoms=1999, sequence_id=1).atoms == 1  # floored
    final = TipProgressEvent(sequence_id=1, uid=UID_HEX, nick="a", amount_matoms=1, attempt_err="x")
    assert final.final
    assert not TipProgressEvent(sequence_id=1, uid=UID_HEX, nick="a", amount_matoms=1, will_retry=True).final


_uids = st.binary(min_size=32, max_size=32).map(bytes.hex)
_u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
_i64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)


@given(
    st.builds(
        ReceivedPM,
        uid=_uids,
        nick=st.text(),
        message=st.text(),
        mode=st.sampled_from(["MESSAGE_MODE_NORMAL", "MESSAGE_MODE_ME"]),
        timestamp_ms=_i64,
        sequence_id=_u64,
    )
    | st.builds(ReceivedTip, uid=_uids, amount_matoms=_i64, sequence_id=_u64)
    | st.builds(
        TipProgressEvent,
        sequence_id=_u64,
        uid=_uids,
        nick=st.text(),
        amount_matoms=_i64,
        completed=st.booleans(),
        attempt=st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1),
        attempt_err=st.text(),
        will_retry=st.booleans(),
    )
)
def test_events_round_trip_through_the_wire_text(event: ReceivedPM | ReceivedTip | TipProgressEvent) -> None:
    text = dumps(event.to_wire())
    assert type(event).from_wire(json.loads(text)) == event


def test_public_identity_wire_shape() -> None:
    ident = PublicIdentity(name="Bot", nick="bot", sig_key=b"\x02" * 32, identity=bytes(range(1, 33)))
    wire = ident.to_wire()
    assert list(wire) == ["name", "nick", "sigKey", "identity"]
    assert PublicIdentity.from_wire(wire).uid == UID_HEX


# -- the examples against the fake and the client -----------------------------------------------


async def test_client_requests_match_the_reference_bytes(tmp_path: Path) -> None:
    """Examples (a), (c), (e), (f): what the client sends, byte for byte."""
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (relay, (bot,)):
            relay.add_user("alice", UID_HEX)
            relay.kx(bot, UID_HEX)
            async with bot.client(**FAST) as cb:
                cb.pm_stream(unacked_from=4294967296)
                await bot.wait_streams(KIND_PM, 1)
                await cb.ack_received_pm(4294967483)
                await cb.send_pm(UID_HEX, "thanks!")
                await cb.tip_user(UID_HEX, 0.0001, 3)
                await cb.version()
            assert bot.frames_in == [_line(t) for t in (EX_A, EX_C_REQ, EX_E_PM, EX_E_TIP, EX_F_REQ)]
            # (g): the upgrade request carries Basic auth even with empty credentials.
            assert bot.upgrade_headers[0]["Authorization"] == "Basic Og=="
            assert "Origin" not in bot.upgrade_headers[0]
            async with bot.client(rpcuser="user", rpcpass="pass", **FAST) as cb:
                await cb.wait_connected()
            assert bot.upgrade_headers[1]["Authorization"] == "Basic dXNlcjpwYXNz"


async def test_fake_output_matches_the_reference_bytes(tmp_path: Path) -> None:
    """Examples (b)-(f): what the fake sends, byte for byte, in binary frames."""
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot", go_runtime="go1.23.x") as (relay, (bot,)):
            relay.add_user("alice", UID_HEX)
            relay.kx(bot, UID_HEX)
            async with raw_ws(bot) as ws:
                await request(ws, 1, "ChatService.PMStream[00000000]", {"unackedFrom": "4294967296"})
                await request(ws, 10, "PaymentsService.TipStream[00000001]")
                await request(ws, 11, "PaymentsService.TipProgress[00000002]")
                await bot.wait_for(
                    lambda: bot.stream_count(KIND_TIP_PROGRESS) == 1 and bot.stream_count(KIND_PM) == 1
                )

                pm = bot.emit_pm(UID_HEX, "hello bot", timestamp_ms=1735689600123)
                assert await ws.recv() == _with_seq(EX_B, 4294967483, pm.sequence_id)
                # The first entry of log file 1 ends at the stored line's length + 1.
                stored = dumps({**pm.to_wire(), "sequenceId": None}).replace(',"sequenceId":null', "")
                assert pm.sequence_id == (1 << 32) | (len(stored.encode()) + 1)

                await request(ws, 2, "ChatService.AckReceivedPM", {"sequenceId": "4294967483"})
                assert await ws.recv() == _line(EX_C_RESP)

                tip = bot.emit_received_tip(UID_HEX, 10_000_000)
                assert await ws.recv() == _with_seq(EX_D_TIP, 4294967371, tip.sequence_id)
                done = bot.emit_tip_progress(UID_HEX, 10_000_000, completed=True, attempt=1)
                assert await ws.recv() == _with_seq(EX_D_DONE, 4294967420, done.sequence_id)
                retry = bot.emit_tip_progress(
                    UID_HEX, 10_000_000, attempt=1, attempt_err="invoice timeout", will_retry=True
                )
                assert await ws.recv() == _with_seq(EX_D_RETRY, 4294967560, retry.sequence_id)

                await ws.send(_line(EX_E_PM))
                assert await ws.recv() == _line(EX_E_PM_RESP)
                relay.unkx(bot, UID_HEX)
                await ws.send(_line(EX_E_TIP))
                assert await ws.recv() == _line(EX_E_TIP_RESP)
                await ws.send(_line(EX_F_REQ))
                assert await ws.recv() == _line(EX_F_RESP)
                bot.end_streams(KIND_PM)
                assert await ws.recv() == _line(EX_F_EOF)


async def test_client_parses_the_reference_server_messages(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with fake_network(tmp_path, "bot") as (_, (bot,)), bot.client(**FAST) as cb:
            pms = cb.pm_stream()
            await bot.wait_streams(KIND_PM, 1)
            tips = cb.tip_stream()
            await bot.wait_streams(KIND_TIP_RECEIVED, 1)
            progress = cb.tip_progress()
            await bot.wait_streams(KIND_TIP_PROGRESS, 1)
            for text in (EX_B, EX_D_TIP, EX_D_DONE, EX_D_RETRY, EX_F_EOF):
                bot.send_raw(_line(text))
            assert await pms.__anext__() == ReceivedPM(
                uid=UID_HEX,
                nick="alice",
                message="hello bot",
                mode="MESSAGE_MODE_NORMAL",
                timestamp_ms=1735689600123,
                sequence_id=4294967483,
            )
            assert await tips.__anext__() == ReceivedTip(
                uid=UID_HEX, amount_matoms=10_000_000, sequence_id=4294967371
            )
            assert await progress.__anext__() == TipProgressEvent(
                sequence_id=4294967420,
                uid=UID_HEX,
                nick="alice",
                amount_matoms=10_000_000,
                completed=True,
                attempt=1,
            )
            retry = await progress.__anext__()
            assert (retry.attempt_err, retry.will_retry, retry.completed, retry.final) == (
                "invoice timeout",
                True,
                False,
                False,
            )
            # (f)'s EOF line answers request id 1, the PM stream: the client reopens it
            # (the fake's own stream 0 stays registered: the EOF was injected, not real).
            await bot.wait_for(lambda: "ChatService.PMStream[00000003]" in bot.stream_methods(KIND_PM))
            assert cb.connections == 1
