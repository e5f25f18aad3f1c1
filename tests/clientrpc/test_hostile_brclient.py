"""The clientrpc client against a hostile or broken brclient (each test pins
one failure mode it must survive; see its docstring)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from brmcp.clientrpc import ClientrpcConnectionLost, ClientrpcNotConnected, Subscription
from brmcp.clientrpc._connection import Connection
from brmcp.clientrpc.subscription import _dedupe_key
from brmcp.clientrpc.types import PM_STREAM
from brmcp.testing.fakebr import KIND_PM
from tests.kit.clientrpc import FAST, fake_network


async def test_deeply_nested_json_from_brclient_does_not_kill_the_client(tmp_path: Path) -> None:
    """A frame nested deeper than Python's recursion limit made the JSON
    decoder raise RecursionError, which escaped the reader and tore down the
    client's task group (and with it the bot or bridge daemon). It must be
    treated like any other malformed JSON: log and reconnect."""
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)),
            bot.client(**FAST) as cb,
            cb.pm_stream() as pms,
        ):
            await bot.wait_streams(KIND_PM, 1)
            bot.send_raw(b"[" * 200_000 + b"\n")
            await bot.wait_for(lambda: bot.total_connections == 2 and bot.stream_count(KIND_PM) == 1)
            bot.send_raw(b'{"jsonrpc":"2.0","method":"x","params":' + b"[" * 200_000 + b"\n")
            await bot.wait_for(lambda: bot.total_connections == 3 and bot.stream_count(KIND_PM) == 1)
            bot.emit_pm(alice.uid, "still here")
            assert (await pms.__anext__()).message == "still here"


class _DroppingSocket:
    """A websocket whose send fails with ConnectionClosed; ``open`` says
    whether the connection was open when the send began (so the frame may
    already be in the kernel when the drain fails)."""

    def __init__(self, open_: bool) -> None:
        self.state = State.OPEN if open_ else State.CLOSING
        self.sends = 0

    async def send(self, data: bytes) -> None:
        self.sends += 1
        raise ConnectionClosed(None, None)


class _StubClient:
    _max_in_flight = 16


async def test_send_failure_after_the_write_began_is_an_unknown_outcome() -> None:
    """websockets raises ConnectionClosed from ``send`` also when the frame
    was written and the drain failed: brclient may have received, say, a
    TipUser. Reporting that as ClientrpcNotConnected ("nothing was sent")
    made the bridge mark the payment failed, uncounted against the daily cap,
    while the tip could still go out. Only a send on a connection that was
    not open is "nothing sent"; otherwise the outcome is unknown."""
    maybe_sent = Connection(_StubClient(), _DroppingSocket(open_=True), 1)  # type: ignore[arg-type]
    with pytest.raises(ClientrpcConnectionLost):
        await maybe_sent.call("PaymentsService.TipUser", {}, None)
    assert maybe_sent.pending == {}
    assert maybe_sent.slots.in_use == 0
    never_sent = Connection(_StubClient(), _DroppingSocket(open_=False), 1)  # type: ignore[arg-type]
    with pytest.raises(ClientrpcNotConnected):
        await never_sent.call("PaymentsService.TipUser", {}, None)
    assert never_sent.slots.in_use == 0


def _text(params: Any) -> str:
    return str(params["msg"]["message"])


async def test_decoder_returning_unhashable_values_keeps_the_reader_alive(tmp_path: Path) -> None:
    """A decoder returning a dict (say, the raw params) or a list made the
    replay de-duplication look the event up in a dict, which raised
    ``TypeError: unhashable type`` inside the connection's reader and tore
    down the client's task group. Such events are now compared by content:
    each is delivered once, and a replay after a reconnect is still dropped."""
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)),
            bot.client(**FAST) as cb,
        ):
            raw: Subscription[Any] = cb.subscribe(PM_STREAM, lambda p: p)
            rows: Subscription[Any] = cb.subscribe(PM_STREAM, lambda p: sorted(p.items()))
            await raw.wait_open()
            await rows.wait_open()
            bot.emit_pm(alice.uid, "m0")
            bot.emit_pm(alice.uid, "m1")
            first_raw = [await raw.__anext__() for _ in range(2)]
            first_rows = [await rows.__anext__() for _ in range(2)]
            assert [_text(e) for e in first_raw] == ["m0", "m1"]
            assert [_text(dict(e)) for e in first_rows] == ["m0", "m1"]
            bot.drop_connections()  # the reopened streams replay m0 and m1
            await bot.wait_for(lambda: bot.total_connections == 2 and bot.stream_count(KIND_PM) == 2)
            bot.emit_pm(alice.uid, "m2")
            assert _text(await raw.__anext__()) == "m2"
            assert _text(dict(await rows.__anext__())) == "m2"
            assert (raw.duplicates, rows.duplicates) == (2, 2)
            assert (raw.delivered, rows.delivered) == (3, 3)
            assert cb.connections == 2


class _Opaque:
    """Unhashable (``__eq__`` without ``__hash__``) and not a container."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Opaque) and other.text == self.text


@dataclasses.dataclass
class _Mutable:
    text: str
    tags: list[str]


async def test_unusual_decoders_cost_one_event_not_the_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A decoder raising something other than ValueError/TypeError (here a
    KeyError from ``p["..."]``) also escaped the reader; it now drops that one
    event with a one-line error. An event that cannot be compared at all is
    delivered (never lost) with a one-line warning; a mutable dataclass is
    compared by its fields."""
    caplog.set_level(logging.WARNING, logger="brmcp.clientrpc")
    with anyio.fail_after(20):
        async with (
            fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)),
            bot.client(**FAST) as cb,
        ):
            picky: Subscription[Any] = cb.subscribe(PM_STREAM, lambda p: {"t": p["msg"]["nope"]})
            opaque: Subscription[Any] = cb.subscribe(PM_STREAM, lambda p: _Opaque(_text(p)))
            mutable: Subscription[Any] = cb.subscribe(PM_STREAM, lambda p: _Mutable(_text(p), [_text(p)]))
            for sub in (picky, opaque, mutable):
                await sub.wait_open()
            bot.emit_pm(alice.uid, "a")
            assert (await opaque.__anext__()).text == "a"
            assert (await mutable.__anext__()) == _Mutable("a", ["a"])
            bot.drop_connections()
            await bot.wait_for(lambda: bot.total_connections == 2 and bot.stream_count(KIND_PM) == 3)
            bot.emit_pm(alice.uid, "b")
            assert (await mutable.__anext__()).text == "b"
            assert mutable.duplicates == 1  # the replayed "a"
            assert [(await opaque.__anext__()).text for _ in range(2)] == ["a", "b"]  # replay not caught
            assert picky.malformed == 3  # a, the replayed a, b
            assert picky.pending == 0
            assert cb.connections == 2
    errors = [r.getMessage() for r in caplog.records if "malformed ChatService.PMStream" in r.getMessage()]
    assert len(errors) == 3
    assert all(m.endswith("KeyError: 'nope'") and "\n" not in m for m in errors)
    assert any("cannot be compared for de-duplication" in r.getMessage() for r in caplog.records)


def test_unhashable_events_are_equal_exactly_when_their_content_is() -> None:
    """The de-duplication key of an unhashable event never makes two
    different events equal (that would drop one), nor an equal pair unequal."""
    event = {"uid": "x", "msg": {"message": "hi", "tags": ["a", {"b"}]}, "sequenceId": 7}
    same = {"sequenceId": 7, "msg": {"tags": ["a", {"b"}], "message": "hi"}, "uid": "x"}
    assert _dedupe_key(event) == _dedupe_key(same)
    assert hash(_dedupe_key(event)) == hash(_dedupe_key(same))
    different = [
        {**event, "sequenceId": 8},
        {**event, "msg": {"message": "hi", "tags": ["a", {"c"}]}},
        {**event, "msg": {"message": "hi", "tags": ("a", frozenset({"b"}))}},
        list(event.items()),
        tuple(event.items()),
        _Mutable("hi", ["a"]),
    ]
    keys = [_dedupe_key(event), *(_dedupe_key(d) for d in different)]
    assert len(set(keys)) == len(keys)
    assert _dedupe_key(_Mutable("hi", ["a"])) == _dedupe_key(_Mutable("hi", ["a"]))
    assert _dedupe_key("text") == "text"  # hashable events are their own key
    with pytest.raises(TypeError, match="_Opaque"):
        _dedupe_key([_Opaque("x")])
