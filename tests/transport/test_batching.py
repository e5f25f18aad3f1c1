"""Batches between brmcp routers (WIRE.md §Batches): negotiation, PMs per
call under concurrency, and peers that never see a batch."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCRequest, JSONRPCResponse

from brmcp import wire
from brmcp.testing import Fabric
from brmcp.transport import Conn
from brmcp.transport._batching import BATCH_KEY, marked_payload
from tests.kit import ALICE, BOT
from tests.kit.transport import bot_and_alice, call, echoed, session

# These tests are about the real PM pacing (tests/conftest.py turns it off elsewhere).
pytestmark = pytest.mark.paced


class RawBot:
    """A server-role accept that records every inbound message as the
    session sees it and answers each request with ``result``."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.result = result
        self.seen: list[Any] = []

    async def accept(self, conn: Conn) -> None:
        async for item in conn.read_stream:
            assert isinstance(item, SessionMessage)
            message = item.message
            self.seen.append(message)
            if isinstance(message, JSONRPCRequest):
                reply = JSONRPCResponse(jsonrpc="2.0", id=message.id, result=dict(self.result))
                await conn.write_stream.send(SessionMessage(reply))


class RawClient:
    """A client-role conn that sends requests and collects the responses."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    async def ask(self, n: int, params: dict[str, Any] | None = None) -> JSONRPCResponse:
        request = JSONRPCRequest(jsonrpc="2.0", id=n, method="tools/list", params=params)
        await self.conn.write_stream.send(SessionMessage(request))
        item = await self.conn.read_stream.receive()
        assert isinstance(item, SessionMessage)
        assert isinstance(item.message, JSONRPCResponse)
        return item.message


async def test_two_routers_negotiate_and_the_mark_never_reaches_a_session() -> None:
    bot = RawBot({"tools": [], "_meta": {"k": 1}})
    async with (
        Fabric() as fabric,
        fabric.router(BOT, accept=bot.accept) as server,
        fabric.router(ALICE) as client,
    ):
        raw = RawClient(client.dial(BOT))
        assert client.batch_limit(BOT) is None
        first = await raw.ask(1)
        second = await raw.ask(2, {"_meta": {"x": True}})
    # The request carried the mark; the session saw none (an _meta made
    # only for it is gone, another keeps its own keys).
    assert [m.params for m in bot.seen] == [None, {"_meta": {"x": True}}]
    # The answer carried it back and the client took it off too.
    assert first.result == second.result == {"tools": [], "_meta": {"k": 1}}
    assert client.batch_limit(BOT) == server.batch_limit(ALICE) == wire.MAX_BATCH_BYTES
    assert fabric.stats.pms_refused == 0


@pytest.mark.parametrize("value", [True, "1490000", 4095, -5, None, 1.5e6, [1]])
async def test_a_mark_that_is_not_a_limit_is_no_announcement(value: object) -> None:
    # The bot's router does not batch, so its answers carry the mark as given.
    bot = RawBot({"_meta": {BATCH_KEY: value}})
    async with (
        Fabric() as fabric,
        fabric.router(BOT, accept=bot.accept, batch=False),
        fabric.router(ALICE) as client,
    ):
        raw = RawClient(client.dial(BOT))
        reply = await raw.ask(1)
        # Consumed either way; a response without a valid mark is a refusal.
        assert reply.result == {}
        assert client.batch_limit(BOT) is None
        await raw.ask(2)
    # After the refusal no request carries the mark.
    assert len(bot.seen) == 2


async def test_a_limit_above_ours_is_capped_at_ours() -> None:
    bot = RawBot({"_meta": {BATCH_KEY: 10**12}})
    async with (
        Fabric() as fabric,
        fabric.router(BOT, accept=bot.accept, batch=False),
        fabric.router(ALICE) as client,
    ):
        await RawClient(client.dial(BOT)).ask(1)
        assert client.batch_limit(BOT) == wire.MAX_BATCH_BYTES


async def test_sixteen_concurrent_calls_cost_a_few_pms_between_batch_peers() -> None:
    async with bot_and_alice() as (fabric, bot, server, client), session(client, BOT) as s:
        await call(s, "echo", {"token": "warm"})
        assert client.batch_limit(BOT) is not None
        before = fabric.stats.pms_sent
        results: dict[int, Any] = {}

        async def one(i: int) -> None:
            results[i] = echoed(await call(s, "echo", {"token": i}))

        async with anyio.create_task_group() as tg:
            for i in range(16):
                tg.start_soon(one, i)
        pms = fabric.stats.pms_sent - before
    assert sorted(results) == list(range(16))
    assert bot.executions() == {"warm": 1, **dict.fromkeys(range(16), 1)}
    # 16 requests and 16 responses: a batch or two each way, not 32 PMs.
    assert pms <= 6, pms
    assert server.stats.batches_sent >= 1
    assert client.stats.batches_sent >= 1


async def test_a_peer_that_does_not_announce_never_gets_a_batch() -> None:
    # The bot's router has batches off: it answers like the Go reference
    # (no mark), so the client keeps to one part per PM.
    async with (
        bot_and_alice(batch=False) as (_fabric, bot, server, client),
        session(client, BOT) as s,
        anyio.create_task_group() as tg,
    ):
        for i in range(12):
            tg.start_soon(call, s, "echo", {"token": i})
    assert client.batch_limit(BOT) is None
    assert server.batch_limit(ALICE) is None
    assert client.stats.batches_sent == 0
    assert server.stats.batches_sent == 0
    assert server.stats.batches_received == 0
    assert bot.executions() == dict.fromkeys(range(12), 1)


def _marked_reference(message: JSONRPCRequest | JSONRPCResponse, value: int) -> bytes | None:
    """The mark added to the message's dict form, the obvious way: the
    container (``params``, created when absent) gets ``_meta`` (created as
    its last member when absent) with the mark as the last member."""
    data = message.model_dump(by_alias=True, exclude_unset=True, mode="json")
    key = "params" if isinstance(message, JSONRPCRequest) else "result"
    if data.get(key) is None:
        data[key] = {}
    container = data[key]
    meta = container.get("_meta")
    if meta is None:
        meta = container["_meta"] = {}
    if not isinstance(meta, dict):
        return None
    meta[BATCH_KEY] = value
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


_KEYS = st.sampled_from(["_meta", "name", "arguments", "é", "k"])
_LEAVES = st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.text(max_size=6)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=10,
)
_CONTAINERS = st.none() | st.dictionaries(_KEYS, _VALUES, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    container=_CONTAINERS,
    request=st.booleans(),
    params_given=st.booleans(),
    value=st.integers(4096, wire.MAX_BATCH_BYTES),
)
def test_the_marked_payload_is_the_message_with_the_mark_in_its_meta(
    container: dict[str, Any] | None, request: bool, params_given: bool, value: int
) -> None:
    """Whatever the container holds (no ``_meta``, an empty or a full one,
    ``_meta`` null or not an object, ``params`` absent, null or empty), the
    marked bytes equal the reference construction, byte for byte, and the
    message itself is unchanged."""
    message: JSONRPCRequest | JSONRPCResponse
    if request:
        if container is None and not params_given:
            message = JSONRPCRequest(jsonrpc="2.0", id=7, method="tools/call")
        else:
            message = JSONRPCRequest(jsonrpc="2.0", id=7, method="tools/call", params=container)
    else:
        message = JSONRPCResponse(jsonrpc="2.0", id="r1", result=container or {})
    before = message.model_dump_json(by_alias=True, exclude_unset=True)
    expected = _marked_reference(message, value)
    assert marked_payload(message, value) == expected
    assert message.model_dump_json(by_alias=True, exclude_unset=True) == before


def test_a_message_that_cannot_be_serialized_is_sent_unmarked() -> None:
    lone = JSONRPCResponse(jsonrpc="2.0", id=1, result={"text": "a\ud800b"})
    assert marked_payload(lone, 65536) is None
