"""Security review: the clientrpc client against a hostile or broken brclient
(each test pins a bug found in review; see its docstring)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from clientrpc_support import FAST, fake_network
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from brmcp.clientrpc import ClientrpcConnectionLost, ClientrpcNotConnected
from brmcp.clientrpc.client import _Connection
from brmcp.testing.fakebr import KIND_PM


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
    maybe_sent = _Connection(_StubClient(), _DroppingSocket(open_=True), 1)  # type: ignore[arg-type]
    with pytest.raises(ClientrpcConnectionLost):
        await maybe_sent.call("PaymentsService.TipUser", {}, None)
    assert maybe_sent.pending == {}
    assert maybe_sent.slots.in_use == 0
    never_sent = _Connection(_StubClient(), _DroppingSocket(open_=False), 1)  # type: ignore[arg-type]
    with pytest.raises(ClientrpcNotConnected):
        await never_sent.call("PaymentsService.TipUser", {}, None)
    assert never_sent.slots.in_use == 0
