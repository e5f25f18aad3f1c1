"""Batches under attack (WIRE.md §Batches): a hostile peer's batch PMs,
abuse of the ``brmcp/batch`` announcement, an outbox whose sender fails or
hangs, and duplicated batches carrying paid calls."""

from __future__ import annotations

import base64
import json
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCNotification, JSONRPCRequest, JSONRPCResponse
from trio.testing import MockClock

from brmcp import Router, RouterOptions, SendError, wire
from brmcp.testing import Faults
from brmcp.transport import Conn
from brmcp.transport._batching import BATCH_KEY
from brmcp.transport.conn import SendReceipt, send_receipt
from brmcp.transport.outbox import QUEUED_PARTS, Outbox
from brmcp.transport.router import DRAIN_SECONDS, RouterStats
from tests.kit import ALICE, BOT, pm_messages, until
from tests.kit.harness import call as paid_call
from tests.kit.harness import ok_text, query, served, standard_harness
from tests.kit.transport import MALLORY

# These tests are about the real PM pacing (tests/conftest.py turns it off elsewhere).
pytestmark = pytest.mark.paced

#: The RouterStats counters every inbound part lands in (or it is still
#: partial): the docstring's buckets.
BUCKETS = (
    "pms_ignored",
    "dropped_denied",
    "dropped_expired",
    "dropped_too_large",
    "dropped_buffer_full",
    "dropped_part_count",
    "dropped_invalid_jsonrpc",
    "dropped_unknown_session",
    "dropped_session_cap",
    "messages_delivered",
)


def bucketed(router: Router) -> int:
    """Inbound parts that landed in a bucket (not those that only fed a
    reassembly still partial or since completed)."""
    stats = router.stats
    return sum(getattr(stats, name) for name in BUCKETS)


def run_virtual(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})


def later() -> int:
    return math.floor(time.time()) + 600


def frame(message: dict[str, Any], sid: str, *, chunk_size: int = 0, mid: str | None = None) -> list[str]:
    """The parts of one JSON-RPC message as a peer would send them."""
    payload = json.dumps(message, separators=(",", ":")).encode()
    return wire.encode(payload, sid=sid, exp=later(), chunk_size=chunk_size, mid=mid)


def envelope(sid: str, mid: str, seq: int, total: int, chunk: bytes, exp: int | None = None) -> str:
    body = base64.b64encode(chunk).decode()
    return f"--mcp[v=1,sid={sid},mid={mid},seq={seq}/{total},exp={later() if exp is None else exp}]--{body}"


def request(n: int, method: str = "tools/list", params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": n, "method": method}
    if params is not None:
        message["params"] = params
    return message


def marked(value: Any, **params: Any) -> dict[str, Any]:
    return {**params, "_meta": {BATCH_KEY: value}}


def sid_of(i: int) -> str:
    return format(i + 1, "016x")


class Recorder:
    """A PMSender that records what it was handed: (virtual time, peer, text)."""

    def __init__(self) -> None:
        self.pms: list[tuple[float, str, str]] = []

    async def send_pm(self, peer: str, text: str) -> None:
        self.pms.append((anyio.current_time(), peer, text))

    def texts(self, peer: str | None = None) -> list[str]:
        return [text for _, to, text in self.pms if peer is None or to == peer]

    def parts(self, peer: str | None = None) -> list[str]:
        out: list[str] = []
        for text in self.texts(peer):
            out.extend(wire.split_batch(text) or [text])
        return out


class Sink:
    """A server-role accept that keeps every session open and records what
    each one reads (it reads only when ``reading`` is set)."""

    def __init__(self, *, reading: bool = True, answer: dict[str, Any] | None = None) -> None:
        self.reading = anyio.Event()
        if reading:
            self.reading.set()
        self.answer = answer
        self.conns: list[Conn] = []
        self.seen: list[Any] = []

    async def accept(self, conn: Conn) -> None:
        self.conns.append(conn)
        await self.reading.wait()
        async for item in conn.read_stream:
            assert isinstance(item, SessionMessage)
            self.seen.append(item.message)
            message = item.message
            if self.answer is not None and isinstance(message, JSONRPCRequest):
                reply = JSONRPCResponse(jsonrpc="2.0", id=message.id, result=dict(self.answer))
                await conn.write_stream.send(SessionMessage(reply))


def batch(lines: list[str]) -> str:
    return "\n".join((wire.BATCH_TAG, *lines))


# -- a hostile peer's batch PMs ---------------------------------------------------


async def test_one_batch_of_256_new_sessions_opens_only_the_cap() -> None:
    sink = Sink()
    options = RouterOptions(max_sessions_per_peer=8)
    async with Router(Recorder(), accept=sink.accept, options=options) as router:
        lines = [frame(request(1), sid_of(i))[0] for i in range(wire.MAX_BATCH_PARTS)]
        router.handle_pm(MALLORY, batch(lines))
        assert router.sessions_of(MALLORY) == 8
        assert router.stats.sessions_opened == 8
        assert router.stats.messages_delivered == 8
        assert router.stats.dropped_session_cap == wire.MAX_BATCH_PARTS - 8
        # A second batch opens nothing more.
        router.handle_pm(MALLORY, batch([frame(request(1), sid_of(300 + i))[0] for i in range(10)]))
        assert router.sessions_of(MALLORY) == 8
        assert router.stats.pms_received == wire.MAX_BATCH_PARTS + 10 == bucketed(router)


async def test_lines_past_the_256th_are_dropped_and_not_counted() -> None:
    sink = Sink()
    async with Router(Recorder(), accept=sink.accept, options=RouterOptions(inbox_size=1024)) as router:
        sid = sid_of(0)
        lines = [frame(request(i), sid)[0] for i in range(wire.MAX_BATCH_PARTS + 44)]
        router.handle_pm(MALLORY, batch(lines))
        assert router.stats.messages_delivered == wire.MAX_BATCH_PARTS
        assert router.stats.pms_received == wire.MAX_BATCH_PARTS == bucketed(router)
        await until(lambda: len(sink.seen) == wire.MAX_BATCH_PARTS)
    assert [m.id for m in sink.seen] == list(range(wire.MAX_BATCH_PARTS))


async def test_batches_flooding_one_session_stay_within_its_inbox_bounds() -> None:
    # The reader never reads: each message is queued in the inbox.
    sink = Sink(reading=False)
    inbox = 16
    async with Router(Recorder(), accept=sink.accept, options=RouterOptions(inbox_size=inbox)) as router:
        sid = sid_of(0)
        # One whole batch fits: its lines arrived together (WIRE.md §Inboxes).
        router.handle_pm(MALLORY, batch([frame(request(i), sid)[0] for i in range(wire.MAX_BATCH_PARTS)]))
        conn = router.session(MALLORY, sid)
        assert conn is not None
        assert router.stats.messages_delivered == wire.MAX_BATCH_PARTS
        assert router.stats.inbox_overflows == 0
        # The next one finds the inbox past its bound at its first line.
        router.handle_pm(MALLORY, batch([frame(request(1000 + i), sid)[0] for i in range(4)]))
        assert conn.closed
        assert router.stats.inbox_overflows == 1
        assert router.stats.dropped_unread == wire.MAX_BATCH_PARTS
        assert conn.queued_bytes == 0
        # Only the first line met the full inbox; the rest opened a new session.
        assert router.stats.messages_delivered == wire.MAX_BATCH_PARTS + 3
        fresh = router.session(MALLORY, sid)
        assert fresh is not None
        assert fresh is not conn


async def test_junk_lines_lend_their_room_to_a_later_message_but_never_past_the_buffer() -> None:
    # The room a batch gets beyond the inbox bound is counted in lines, so
    # a peer that pads its batches with junk keeps more than inbox_size
    # messages queued; never more than inbox_size + MAX_BATCH_PARTS, and
    # the byte bounds are not relaxed.
    sink = Sink(reading=False)
    inbox = 4
    async with Router(Recorder(), accept=sink.accept, options=RouterOptions(inbox_size=inbox)) as router:
        sid = sid_of(0)
        pad = ["junk"] * (wire.MAX_BATCH_PARTS - 1)
        delivered = 0
        for i in range(inbox + wire.MAX_BATCH_PARTS + 5):
            router.handle_pm(MALLORY, batch([*pad, frame(request(i), sid)[0]]))
            conn = router.session(MALLORY, sid)
            if conn is None or router.stats.inbox_overflows:
                break
            delivered += 1
            queued = conn.read_stream.statistics().current_buffer_used
            assert queued <= inbox + wire.MAX_BATCH_PARTS
        assert router.stats.inbox_overflows == 1
        assert delivered == inbox + wire.MAX_BATCH_PARTS - 1
        assert router.stats.pms_received == bucketed(router) + 1  # the refused message: no bucket


async def test_almost_parts_in_a_batch_are_each_ignored() -> None:
    sink = Sink()
    async with Router(Recorder(), accept=sink.accept) as router:
        good = frame(request(7), sid_of(0))[0]
        header, body = good.split("]--", 1)
        almost = [
            good[:-1],  # a base64 quantum cut short
            good.replace("--mcp[", "--mcp(", 1),
            good.replace("v=1", "v=2", 1),
            good.replace("seq=1/1", "seq=2/1", 1),
            good.replace("seq=1/1", "seq=0/1", 1),
            good.replace("seq=1/1", "seq=1/65", 1),
            header + "]-" + body,
            header + "]--",  # no body
            header + "]--" + body + "-",
            header + "]--" + body + "[",
            "--mcp[v=1,sid=" + "a" * 33 + ",mid=1,seq=1/1,exp=0]--" + body,
            "--mcp[v=1,sid=ABC,mid=1,seq=1/1,exp=0]--" + body,
            "--mcp[v=1,sid=1,mid=1,seq=1/1,exp=" + "9" * 30 + "]--" + body,
            wire.BATCH_TAG,  # a batch inside a batch is one more line that is no part
            batch([good]).replace("\n", " "),
            "\x1c" + good,  # not Go white space
            good + "\x1f",
            "chat: " + good,
            "\u2028" + good + "\u2029",  # Go white space: trimmed, a part
        ]
        router.handle_pm(MALLORY, batch(almost))
        stats = router.stats
        assert stats.pms_received == len(almost) == bucketed(router)
        assert stats.messages_delivered == 1
        assert stats.pms_ignored == len(almost) - 1
        assert router.assembler.pending_messages == 0
        await until(lambda: len(sink.seen) == 1)


async def test_a_batch_mixing_parts_of_messages_with_junk_reassembles_them() -> None:
    sink = Sink()
    async with Router(Recorder(), accept=sink.accept) as router:
        sid = sid_of(0)
        big = frame(request(1, params={"pad": "x" * 500}), sid, chunk_size=100)
        small = frame(request(2), sid)
        assert len(big) > 3
        lines = ["hello", big[0], "", "  ", big[1], "--mcp[junk", *small, *big[2:], "bye"]
        router.handle_pm(MALLORY, batch(lines))
        stats = router.stats
        assert stats.messages_delivered == 2
        assert stats.pms_received == len([line for line in lines if line.strip()])
        assert stats.pms_received == bucketed(router) + len(big) - 1  # parts that only fed reassembly
        assert router.assembler.pending_messages == 0
        await until(lambda: len(sink.seen) == 2)
    # In line order: the small one first, the big one at its last part.
    assert [m.id for m in sink.seen] == [2, 1]


async def test_a_part_whose_total_disagrees_drops_its_message() -> None:
    sink = Sink()
    async with Router(Recorder(), accept=sink.accept) as router:
        sid, mid = sid_of(0), "abcdef"
        parts = frame(request(1, params={"pad": "y" * 300}), sid, chunk_size=100, mid=mid)
        total = len(parts)
        chunk = wire.parse(parts[1])
        assert chunk is not None
        liar = envelope(sid, mid, 2, total + 1, chunk.chunk)
        router.handle_pm(MALLORY, batch([parts[0], liar, *parts[1:]]))
        stats = router.stats
        assert stats.dropped_part_count == 1
        # The message was dropped at the liar; its remaining parts started a
        # new reassembly that lacks the first part.
        assert stats.messages_delivered == 0
        assert router.assembler.pending_messages == 1
        router.handle_pm(MALLORY, parts[0])
        assert stats.messages_delivered == 1
        assert router.assembler.pending_messages == 0


async def test_a_refused_peer_is_dropped_part_by_part_before_any_reassembly() -> None:
    asked: list[str] = []

    def allow(peer: str) -> bool:
        asked.append(peer)
        return peer != MALLORY

    sink = Sink()
    async with Router(Recorder(), accept=sink.accept, allow=allow) as router:
        sid = sid_of(0)
        multi = frame(request(1, params={"pad": "z" * 400}), sid, chunk_size=100)
        lines = [
            *multi[:-1],
            frame(request(2), sid)[0],
            "chat",
            *[frame(request(3), sid_of(i))[0] for i in range(20)],
            frame(request(4, params=marked(8192)), sid)[0],
        ]
        router.handle_pm(MALLORY, batch(lines))
        stats = router.stats
        parts = len(lines) - 1
        assert stats.dropped_denied == parts
        assert stats.pms_ignored == 1  # the chat line never reaches allow()
        assert asked == [MALLORY] * parts
        assert router.assembler.pending(MALLORY) == 0
        assert router.assembler.buffered_bytes == 0
        assert router.session_count == 0
        assert stats.pms_received == len(lines) == bucketed(router)
        assert router.batch_limit(MALLORY) is None  # its announcement was dropped too
        # An allowed peer's identical batch goes through.
        router.handle_pm(ALICE, batch(lines))
        assert router.sessions_of(ALICE) == 8
        assert router.assembler.pending(ALICE) == 1
        assert router.batch_limit(ALICE) == 8192


async def test_an_allow_that_raises_refuses_every_part_and_the_router_survives() -> None:
    def allow(peer: str) -> bool:
        raise RuntimeError("directory down")

    async with Router(Recorder(), accept=Sink().accept, allow=allow) as router:
        router.handle_pm(MALLORY, batch([frame(request(i), sid_of(i))[0] for i in range(5)]))
        assert router.stats.dropped_denied == 5
        assert router.session_count == 0


@pytest.mark.parametrize(
    "layout",
    [
        "{tag}\r\n{a}\r\n{b}\r\n",
        "\r\n \t{tag}\n\n\n{a}\n \n\t\n{b}",
        "  {tag}\n  {a}  \n\t{b}\t",
        "{tag}\n{a}\n{b}\n\n\n",
        "\u3000{tag}\n\u3000{a}\u3000\n{b}\u2028",
        "{tag}\r{a}\n{b}",  # a CR after the tag: white space opening the first line
    ],
)
async def test_white_space_around_batch_lines(layout: str) -> None:
    sink = Sink()
    async with Router(Recorder(), accept=sink.accept) as router:
        a, b = frame(request(1), sid_of(0))[0], frame(request(2), sid_of(0))[0]
        text = layout.format(tag=wire.BATCH_TAG, a=a, b=b)
        router.handle_pm(MALLORY, text)
        assert router.stats.batches_received == 1
        assert router.stats.messages_delivered == 2
        assert router.stats.pms_received == bucketed(router)
        await until(lambda: len(sink.seen) == 2)
    assert [m.id for m in sink.seen] == [1, 2]


@pytest.mark.parametrize(
    "text",
    [
        wire.BATCH_TAG + " \n{a}",  # something other than a line break after the tag
        wire.BATCH_TAG + "x\n{a}",
        "--mcpb[v=2]--\n{a}",
        "--MCPB[v=1]--\n{a}",
        "chat\n" + wire.BATCH_TAG + "\n{a}",
        "{a}\n{a}",  # two parts without the tag: one PM that is no part
    ],
)
async def test_texts_that_are_not_batches_carry_nothing(text: str) -> None:
    async with Router(Recorder(), accept=Sink().accept) as router:
        router.handle_pm(MALLORY, text.format(a=frame(request(1), sid_of(0))[0]))
        assert router.stats.batches_received == 0
        assert router.stats.messages_delivered == 0
        assert router.stats.pms_received == router.stats.pms_ignored == 1


def _junk_batches() -> dict[str, str]:
    size = 1_800_000
    good = frame(request(1), sid_of(0))[0]
    header = good.split("]--", 1)[0] + "]--"
    line = 7000
    return {
        "blank lines": wire.BATCH_TAG + "\n" * size,
        "white space lines": wire.BATCH_TAG + "\n" + " \t\r\n" * (size // 4),
        "short lines": wire.BATCH_TAG + "\nab" * (size // 3),
        "one long line": wire.BATCH_TAG + "\n" + "x" * size,
        "one long white space line": wire.BATCH_TAG + "\n" + " " * size + "x",
        "long junk lines": wire.BATCH_TAG + ("\n" + "x" * line) * (size // line),
        "almost parts": wire.BATCH_TAG + ("\n" + header + "A" * (line - 1)) * (size // line),
        "hostile headers": wire.BATCH_TAG + ("\n--mcp[" + "a=b," * (line // 4) + "]--QUJD") * (size // line),
        "bodies that are no JSON": wire.BATCH_TAG + ("\n" + header + "QUJD " * (line // 5)) * (size // line),
        "tags": (wire.BATCH_TAG + "\n") * (size // (len(wire.BATCH_TAG) + 1)),
    }


async def test_a_large_batch_of_junk_completes_and_every_line_is_counted() -> None:
    sink = Sink()
    timings: dict[str, float] = {}
    async with Router(Recorder(), accept=sink.accept) as router:
        for name, text in _junk_batches().items():
            before = router.stats.pms_received
            started = time.perf_counter()
            router.handle_pm(MALLORY, text)
            timings[name] = (time.perf_counter() - started) / (len(text) / 2**20)
            lines = [line for line in text.split("\n")[1:] if line.strip()]
            assert router.stats.pms_received - before == max(1, min(len(lines), wire.MAX_BATCH_PARTS)), name
            assert router.stats.pms_received == bucketed(router), name
        assert router.stats.batches_received == len(timings)
        assert router.stats.messages_delivered == 0
        assert router.session_count == 0
    print({name: f"{ms * 1000:.1f} ms/MiB" for name, ms in timings.items()})


# -- the money: duplicated batches -------------------------------------------------


async def test_a_batch_delivered_twice_runs_each_keyed_paid_call_once(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    keys = [f"dup-batch-key-{i:04d}" for i in range(5)]
    copies: list[str] = []
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 10_000)

        def duplicate(sender: str, to: str, text: str) -> None:
            # Every batch carrying a paid call reaches the bot twice: a copy
            # right before the original.
            if sender == ALICE and to == BOT and wire.is_batch(text) and "tools/call" in _decoded(text):
                copies.append(text)
                srv.router.handle_pm(ALICE, text)

        answers: Counter[Any] = Counter()

        def answered(sender: str, to: str, text: str) -> None:
            if sender == BOT and to == ALICE:
                answers.update(m.get("id") for m in pm_messages(text) if "result" in m)

        srv.fabric.add_tap(duplicate)
        srv.fabric.add_tap(answered)
        texts: dict[str, str] = {}

        async def one(key: str) -> None:
            texts[key] = ok_text(await paid_call(s, "paid", key=key))

        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(one, key)
        srv.fabric.remove_tap(duplicate)
        assert copies, "no batch carried the calls"
        # A late copy of every batch, after the calls were answered.
        sent = srv.router.stats.messages_sent
        for text in copies:
            srv.tap(ALICE, text)
        replayed = sum(_decoded(text).count("tools/call") for text in copies)
        await until(lambda: srv.router.stats.messages_sent >= sent + replayed)
        # Each batched call was answered three times (early copy, original,
        # late copy), each time from the one execution.
        ids = [m["id"] for text in copies for m in pm_messages(text) if m.get("method") == "tools/call"]
        assert len(ids) == replayed >= 2
        await until(lambda: all(answers[i] == 3 for i in ids))
        assert runs.n == len(keys)
        assert sorted(json.loads(t)["n"] for t in texts.values()) == list(range(1, len(keys) + 1))
        assert await harness.balance(ALICE) == 10_000 - 500 * len(keys)
        charges = [e for e in await harness.statement(ALICE) if e.kind == "charge"]
        assert sorted((e.atoms, e.call_key) for e in charges) == [(-500, key) for key in keys]
    for key in keys:
        assert query(tmp_path, "SELECT count(*) FROM calls WHERE call_key = ?", (key,)) == [(1,)]


async def test_a_relay_that_duplicates_every_pm_charges_each_keyed_call_once(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path, calls_per_minute=1000)
    keys = [f"dup-relay-key-{i:04d}" for i in range(12)]
    asked: set[Any] = set()
    answers: Counter[Any] = Counter()

    def watch(sender: str, to: str, text: str) -> None:
        for m in pm_messages(text):
            if sender == ALICE and m.get("method") == "tools/call":
                asked.add(m["id"])
            elif sender == BOT and "result" in m:
                answers[m["id"]] += 1

    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 100_000)
        srv.fabric.add_tap(watch)
        srv.fabric.faults = Faults(duplicate_rate=1.0)
        texts: dict[str, str] = {}

        async def one(key: str) -> None:
            texts[key] = ok_text(await paid_call(s, "paid", key=key))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for key in keys:
                    tg.start_soon(one, key)
            # Both copies of every call were answered, each answer twice.
            await until(lambda: len(asked) == len(keys) and all(answers[i] == 4 for i in asked))
        assert srv.fabric.stats.pms_duplicated > 0
        assert srv.router.stats.batches_received > 0
        assert runs.n == len(keys)
        assert await harness.balance(ALICE) == 100_000 - 500 * len(keys)
        charges = [e for e in await harness.statement(ALICE) if e.kind == "charge"]
        assert sorted((e.atoms, e.call_key) for e in charges) == [(-500, key) for key in keys]
    for key in keys:
        assert query(tmp_path, "SELECT count(*) FROM calls WHERE call_key = ?", (key,)) == [(1,)]


async def test_one_batch_carrying_the_same_keyed_call_twice_charges_once(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    key = "same-batch-key-01"
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 10_000)
        # Learn the session's sid from a first call.
        assert json.loads(ok_text(await paid_call(s, "paid", key="warm-up-key-0001")))["n"] == 1
        (conn,) = [c for c in _conns(srv.router) if c.peer == ALICE]
        call = request(99, "tools/call", {"name": "paid", "arguments": {}, "_meta": {"brmcp/callKey": key}})
        line = frame(call, conn.sid)[0]
        sent = srv.router.stats.messages_sent
        srv.tap(ALICE, batch([line, line, line]))
        await until(lambda: srv.router.stats.messages_sent >= sent + 3)
        assert runs.n == 2
        assert await harness.balance(ALICE) == 10_000 - 1000
        charges = [e for e in await harness.statement(ALICE) if e.kind == "charge"]
        assert sorted(str(e.call_key) for e in charges) == sorted([key, "warm-up-key-0001"])
    assert query(tmp_path, "SELECT count(*) FROM calls WHERE call_key = ?", (key,)) == [(1,)]


def _decoded(text: str) -> str:
    """The JSON of the single-part messages a PM carries, joined."""
    out = []
    for line in wire.split_batch(text) or [text]:
        part = wire.parse(line)
        if part is not None and part.total == 1:
            out.append(part.chunk.decode())
    return "\n".join(out)


def _conns(router: Router) -> list[Conn]:
    return list(router._sessions.values())


# -- the outbox under failure --------------------------------------------------------

INTERVAL = 0.1
PEER = "11" * 32
OTHER = "22" * 32


def parts_of(tag: str, n: int = 1) -> list[str]:
    payload = (tag * 30).encode()[:30]
    return wire.encode(payload, sid="ab12", exp=0, chunk_size=-(-30 // n))


class Owner:
    """A task group standing in for the router: it owns the flushers."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self.tg = tg

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: object) -> bool:
        self.tg.start_soon(fn, *args)
        return True


def test_a_cancelled_write_that_need_not_wait_is_withdrawn() -> None:
    async def main() -> None:
        brclient = Recorder()
        async with anyio.create_task_group() as tg:
            outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=RouterStats(), spawn=Owner(tg).spawn)
            await outbox.send(PEER, parts_of("a"), wait=False)
            with anyio.CancelScope() as scope:
                scope.cancel()
                await outbox.send(PEER, parts_of("b"), wait=False)
            # The write raised (Cancelled, caught by its scope): its
            # message must not leave behind the writer's back.
            assert outbox.waiting(PEER) == 0
            await outbox.send(PEER, parts_of("c"), wait=False)
            await outbox.drained()
        chunks = [part.chunk for part in map(wire.parse, brclient.parts()) if part is not None]
        assert chunks == [b"a" * 30, b"c" * 30]

    run_virtual(main)


def test_writers_cancelled_while_waiting_for_room_do_not_grow_the_queue() -> None:
    async def main() -> None:
        brclient = Recorder()
        async with anyio.create_task_group() as tg:
            outbox = Outbox(brclient.send_pm, interval=INTERVAL, stats=RouterStats(), spawn=Owner(tg).spawn)
            for i in range(QUEUED_PARTS):
                await outbox.send(PEER, parts_of(f"f{i}"), wait=False)
            given_up = 0

            async def impatient(i: int) -> None:
                nonlocal given_up
                with anyio.move_on_after(INTERVAL / 10):
                    await outbox.send(PEER, parts_of(f"h{i}"), wait=False)
                    return
                given_up += 1

            async with anyio.create_task_group() as writers:
                for i in range(1000):
                    writers.start_soon(impatient, i)
            assert given_up > 900
            assert outbox.waiting(PEER) <= QUEUED_PARTS + (1000 - given_up)
            await outbox.drained()
        assert len(brclient.pms) == QUEUED_PARTS + 1000 - given_up

    run_virtual(main)


@pytest.mark.parametrize("timed", [False, True])
def test_a_failed_pm_of_a_multi_part_message_fails_it_and_closes_its_session(timed: bool) -> None:
    doomed: list[str] = []

    class Brclient(Recorder):
        async def send_pm(self, peer: str, text: str) -> None:
            part = wire.parse(text)
            if part is not None and part.sid in doomed and part.seq == 2:
                raise RuntimeError("brclient refused the PM")
            await super().send_pm(peer, text)

    async def main() -> None:
        brclient = Brclient()
        async with Router(brclient, options=RouterOptions(chunk_size=40)) as router:
            first, second = router.dial(PEER), router.dial(PEER)
            doomed.append(first.sid)
            message = JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list", params={"pad": "p" * 100})
            # The peer never announced: one part per PM, and the second PM
            # of the first session's message fails.
            receipt = SendReceipt() if timed else None
            token = send_receipt.set(receipt)
            try:
                if timed:
                    # A write that waits for its PMs raises.
                    with pytest.raises(anyio.BrokenResourceError):
                        await first.write_stream.send(SessionMessage(message))
                    assert receipt is not None
                    assert receipt.failed
                else:
                    # One that does not learns it from the closed session.
                    await first.write_stream.send(SessionMessage(message))
            finally:
                send_receipt.reset(token)
            await second.write_stream.send(SessionMessage(message))
            await second.write_stream.send(SessionMessage(message))
            await router._outbox.drained()
            assert first.closed
            assert isinstance(first.error, SendError)
            assert first.error.peer == PEER
            assert not second.closed
            assert router.stats.send_failures == 1
            with pytest.raises(anyio.ClosedResourceError):
                await first.write_stream.send(SessionMessage(message))
        sent = [wire.parse(p) for p in brclient.parts(PEER)]
        seqs = {
            sid: [p.seq for p in sent if p is not None and p.sid == sid] for sid in (first.sid, second.sid)
        }
        # The failed message's first part left; none after the failure.
        total = len(seqs[second.sid]) // 2
        assert total > 2
        assert seqs[first.sid] == [1]
        assert seqs[second.sid] == list(range(1, total + 1)) * 2

    run_virtual(main)


def test_a_failed_batch_fails_every_message_with_a_part_in_it_and_later_ones_flow() -> None:
    class Brclient(Recorder):
        refuse = True

        async def send_pm(self, peer: str, text: str) -> None:
            if self.refuse and wire.is_batch(text):
                self.refuse = False
                raise RuntimeError("brclient refused the PM")
            await super().send_pm(peer, text)

    async def main() -> None:
        brclient = Brclient()
        async with Router(brclient) as router:
            conns = [router.dial(PEER) for _ in range(3)]
            _announce(router, conns[0], 1_000_000)
            assert router.batch_limit(PEER) == 1_000_000
            # Requests, not notifications: a notification's failed PM only drops it.
            note = JSONRPCRequest(jsonrpc="2.0", id=7, method="ping", params={"n": 1})
            # The first PM leaves alone; the next two, queued behind the
            # pacing, share the batch that fails.
            await conns[0].write_stream.send(SessionMessage(note))
            await until(lambda: len(brclient.pms) == 1)
            await conns[0].write_stream.send(SessionMessage(note))
            await conns[1].write_stream.send(SessionMessage(note))
            await anyio.sleep(INTERVAL * 1.5)
            await conns[2].write_stream.send(SessionMessage(note))
            await conns[2].write_stream.send(SessionMessage(note))
            await router._outbox.drained()
            assert [c.closed for c in conns] == [True, True, False]
            assert all(isinstance(c.error, SendError) for c in conns[:2])
            assert router.stats.send_failures == 2
        sids = [part.sid for part in map(wire.parse, brclient.parts(PEER)) if part is not None]
        assert sids == [conns[0].sid, conns[2].sid, conns[2].sid]
        assert router.stats.batches_sent == 1

    run_virtual(main)


def test_a_waiting_write_cancelled_mid_queue_leaves_nothing_behind() -> None:
    async def main() -> None:
        brclient = Recorder()
        async with Router(brclient) as router:
            conn = router.dial(PEER)
            note = JSONRPCNotification(jsonrpc="2.0", method="notifications/progress", params={"n": 1})
            for _ in range(5):
                await conn.write_stream.send(SessionMessage(note))
            request = JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list")
            receipt = SendReceipt()
            token = send_receipt.set(receipt)
            try:
                with anyio.move_on_after(INTERVAL * 2.5):
                    await conn.write_stream.send(SessionMessage(request))
            finally:
                send_receipt.reset(token)
            assert receipt.failed
            assert receipt.left_at is None
            await router._outbox.drained()
            assert router.waiting_parts(PEER) == 0
            assert not conn.closed
        assert len(brclient.pms) == 5
        assert all("tools/list" not in _decoded(text) for text in brclient.texts())

    run_virtual(main)


def test_a_router_exiting_with_parts_queued_drains_for_a_bound_then_fails_the_rest() -> None:
    async def main() -> None:
        brclient = Recorder()
        router = Router(brclient)
        async with router:
            conn = router.dial(PEER)
            # Requests, not notifications: a notification's failed PM only drops it.
            note = JSONRPCRequest(jsonrpc="2.0", id=7, method="ping", params={"n": 1})
            # One part per PM (no announcement): 100 intervals of work.
            for _ in range(100):
                await conn.write_stream.send(SessionMessage(note))
            assert router.waiting_parts(PEER) > 90
            started = anyio.current_time()
        took = anyio.current_time() - started
        assert took == pytest.approx(DRAIN_SECONDS)
        # What left in the drain left; the rest was reported, not dropped silently.
        assert len(brclient.pms) == pytest.approx(DRAIN_SECONDS / INTERVAL, abs=1)
        assert router.waiting_parts(PEER) == 0
        assert isinstance(conn.error, SendError)
        assert str(conn.error).endswith(": brmcp: router closed before the PM was handed over")
        assert router.stats.send_failures == 1

    run_virtual(main)


def test_a_router_left_by_cancellation_reports_what_was_still_queued() -> None:
    # Cancelled from outside, the flushers are cancelled with the rest: the
    # queued messages are not drained but fail, and the exit does not wait.
    async def main() -> None:
        brclient = Recorder()
        router = Router(brclient)
        started = anyio.current_time()
        with anyio.move_on_after(INTERVAL / 2):
            async with router:
                conn = router.dial(PEER)
                # Requests, not notifications: a notification's failed PM only drops it.
                note = JSONRPCRequest(jsonrpc="2.0", id=7, method="ping", params={"n": 1})
                for _ in range(10):
                    await conn.write_stream.send(SessionMessage(note))
                await anyio.sleep_forever()
        assert anyio.current_time() - started < DRAIN_SECONDS
        assert len(brclient.pms) < 10
        assert router.waiting_parts(PEER) == 0
        assert isinstance(conn.error, SendError)

    run_virtual(main)


def test_a_router_exits_in_bounded_time_while_its_sender_blocks_forever() -> None:
    class Stuck(Recorder):
        async def send_pm(self, peer: str, text: str) -> None:
            if len(self.pms) >= 2:
                await anyio.sleep_forever()
            await super().send_pm(peer, text)

    async def main() -> None:
        brclient = Stuck()
        router = Router(brclient)
        waited: list[str] = []
        with anyio.fail_after(60):
            async with router:
                conns = [router.dial(PEER), router.dial(OTHER)]
                # Requests, not notifications: a notification's failed PM only drops it.
                note = JSONRPCRequest(jsonrpc="2.0", id=7, method="ping", params={"n": 1})
                for _ in range(10):
                    for conn in conns:
                        await conn.write_stream.send(SessionMessage(note))

                async def timed() -> None:
                    # A write that waits for its PM, stuck behind the sender.
                    receipt = SendReceipt()
                    send_receipt.set(receipt)
                    request = JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list")
                    try:
                        await conns[0].write_stream.send(SessionMessage(request))
                        waited.append("returned")
                    except anyio.BrokenResourceError:
                        waited.append("failed")

                router._tg.start_soon(timed)  # type: ignore[union-attr]
                await anyio.sleep(1)
                started = anyio.current_time()
        assert anyio.current_time() - started == pytest.approx(DRAIN_SECONDS)
        assert all(isinstance(c.error, SendError) for c in conns)
        assert router.waiting_parts(PEER) == router.waiting_parts(OTHER) == 0
        assert waited in ([], ["failed"])

    run_virtual(main)


def _announce(router: Router, conn: Conn, limit: int) -> None:
    """The peer answers a (marked) request of ``conn`` announcing ``limit``."""
    router.handle_pm(conn.peer, frame(response(0, marked(limit)), conn.sid)[0])


def response(n: int, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": n, "result": result}


# -- negotiation abuse ---------------------------------------------------------------


def _carried_marks(texts: list[str]) -> list[Any]:
    """The brmcp/batch value of every single-part message sent (None: unmarked)."""
    out = []
    for text in texts:
        for line in wire.split_batch(text) or [text]:
            part = wire.parse(line)
            assert part is not None
            if part.total > 1:
                continue
            message = json.loads(part.chunk)
            container = message.get("params") if "method" in message else message.get("result")
            meta = (container or {}).get("_meta") or {}
            out.append(meta.get(BATCH_KEY))
    return out


@pytest.mark.parametrize("chunk_size", [1000, wire.DEFAULT_CHUNK_SIZE])
def test_a_tiny_announced_limit_bounds_every_batch_we_send(chunk_size: int) -> None:
    async def main() -> None:
        brclient = Recorder()
        sink = Sink(answer={"pad": "r" * 500})
        options = RouterOptions(chunk_size=chunk_size)
        async with Router(brclient, accept=sink.accept, options=options) as router:
            sid = sid_of(0)
            router.handle_pm(MALLORY, frame(request(0, params=marked(4095)), sid)[0])
            assert router.batch_limit(MALLORY) is None  # below 4096: no announcement
            router.handle_pm(MALLORY, frame(request(1, params=marked(4096)), sid)[0])
            assert router.batch_limit(MALLORY) == 4096
            router.handle_pm(MALLORY, batch([frame(request(i), sid)[0] for i in range(2, 60)]))
            # A response too big for one small part.
            big = JSONRPCResponse(jsonrpc="2.0", id=999, result={"blob": "b" * 20_000})
            await until(lambda: len(sink.conns) == 1)
            await sink.conns[0].write_stream.send(SessionMessage(big))
            await until(lambda: len(sink.seen) == 60)
            await router._outbox.drained()
        texts = brclient.texts(MALLORY)
        batches = [t for t in texts if wire.is_batch(t)]
        assert batches
        assert all(len(t) <= 4096 for t in batches)
        parts = [p for p in map(wire.parse, brclient.parts(MALLORY)) if p is not None]
        assert len(parts) == len(brclient.parts(MALLORY))
        if chunk_size < 2880:
            # Parts are cut to fill such a batch: no PM passes the limit.
            assert max(len(t) for t in texts) <= 4096
            chunked = [p for p in parts if p.total > 1]
            assert chunked
            assert {len(p.chunk) for p in chunked if p.seq < p.total} == {2880}
        else:
            # A larger part goes alone, as an ordinary PM.
            (alone,) = [t for t in texts if len(t) > 4096]
            assert wire.parse(alone) is not None
            assert all(p.total == 1 for p in parts)
        # Every answer announced our own limit back.
        assert set(_carried_marks(texts)) == {wire.MAX_BATCH_BYTES}

    run_virtual(main)


def test_a_peer_that_announced_is_not_refused_by_later_unmarked_answers() -> None:
    async def main() -> None:
        brclient = Recorder()
        async with Router(brclient) as router:
            conn = router.dial(PEER)
            ask = JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list")
            await conn.write_stream.send(SessionMessage(ask))
            _announce(router, conn, 8192)
            assert router.batch_limit(PEER) == 8192
            for n, result in enumerate([{}, marked(100), marked("8192"), marked(None), {"_meta": 5}], 2):
                router.handle_pm(PEER, frame(response(n, result), conn.sid)[0])
                assert router.batch_limit(PEER) == 8192
            await conn.write_stream.send(SessionMessage(ask))
            # A smaller valid announcement lowers the limit.
            router.handle_pm(PEER, frame(response(9, marked(5000)), conn.sid)[0])
            assert router.batch_limit(PEER) == 5000
            await router._outbox.drained()
        # Both requests carried our mark.
        assert _carried_marks(brclient.texts(PEER)) == [wire.MAX_BATCH_BYTES] * 2

    run_virtual(main)


def test_the_mark_on_a_notification_or_an_error_is_no_announcement_and_no_refusal() -> None:
    async def main() -> None:
        brclient = Recorder()
        async with Router(brclient) as router:
            conn = router.dial(PEER)
            ask = JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list")
            await conn.write_stream.send(SessionMessage(ask))
            note = {"jsonrpc": "2.0", "method": "notifications/message", "params": marked(9000, level="info")}
            error = {"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "no", "data": marked(9000)}}
            weird_error = {
                "jsonrpc": "2.0",
                "id": 1,
                "error": {"code": -1, "message": "no", "_meta": marked(9000)},
            }
            router.handle_pm(PEER, batch([frame(m, conn.sid)[0] for m in (note, error, weird_error)]))
            assert router.stats.messages_delivered == 3
            assert router.batch_limit(PEER) is None
            # Still only asked: the next request carries the mark again.
            await conn.write_stream.send(SessionMessage(ask))
            # A plain answer is the refusal; after it nothing is marked.
            router.handle_pm(PEER, frame(response(1, {}), conn.sid)[0])
            await conn.write_stream.send(SessionMessage(ask))
            await router._outbox.drained()
            got = []
            while True:
                try:
                    got.append(conn.read_stream.receive_nowait())
                except anyio.WouldBlock:
                    break
        assert _carried_marks(brclient.texts(PEER)) == [wire.MAX_BATCH_BYTES, wire.MAX_BATCH_BYTES, None]
        assert len(got) == 4
        assert router.batch_limit(PEER) is None

    run_virtual(main)


@pytest.mark.parametrize(
    ("params", "seen"),
    [
        (marked(5000), None),
        ({"_meta": {BATCH_KEY: 5000, "progressToken": 3}, "x": 1}, {"_meta": {"progressToken": 3}, "x": 1}),
        ({"_meta": {BATCH_KEY: 5000}, "x": 1}, {"x": 1}),
        ({"_meta": 5}, {"_meta": 5}),
        ({"_meta": [BATCH_KEY, 5000]}, {"_meta": [BATCH_KEY, 5000]}),
        ({"_meta": None}, {"_meta": None}),
        ({"nested": {"_meta": {BATCH_KEY: 5000}}}, {"nested": {"_meta": {BATCH_KEY: 5000}}}),
    ],
)
async def test_the_mark_never_reaches_the_session(params: Any, seen: Any) -> None:
    sink = Sink()
    async with Router(Recorder(), accept=sink.accept) as router:
        router.handle_pm(MALLORY, frame(request(1, params=params), sid_of(0))[0])
        await until(lambda: len(sink.seen) == 1)
        assert sink.seen[0].params == seen
        announced = isinstance(params.get("_meta"), dict) and params["_meta"].get(BATCH_KEY) == 5000
        assert router.batch_limit(MALLORY) == (5000 if announced else None)


def ping_marked(value: str) -> str:
    """A ping whose mark is the JSON text ``value``, as one part."""
    text = '{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"' + BATCH_KEY + '":' + value + "}}}"
    return wire.encode(text.encode(), sid=sid_of(0), exp=later())[0]


@pytest.mark.parametrize(
    ("value", "limit"),
    [
        ("9" * 400, wire.MAX_BATCH_BYTES),
        ("18446744073709551616", wire.MAX_BATCH_BYTES),
        ("4096", 4096),
        ("4095", None),
        ("-4096", None),
        ("-" + "9" * 400, None),
        ("5000.0", None),
        ("5e3", None),
        ("1e400", None),
        ("true", None),
        ('"5000"', None),
        ("{}", None),
    ],
)
async def test_odd_announced_values(value: str, limit: int | None) -> None:
    sink = Sink()
    async with Router(Recorder(), accept=sink.accept) as router:
        router.handle_pm(MALLORY, ping_marked(value))
        assert router.stats.messages_delivered == 1
        await until(lambda: len(sink.seen) == 1)
        assert sink.seen[0].params is None
        assert router.batch_limit(MALLORY) == limit


async def test_a_number_too_long_for_json_is_an_invalid_message_not_a_crash() -> None:
    async with Router(Recorder(), accept=Sink().accept) as router:
        router.handle_pm(MALLORY, ping_marked("9" * 5000))
        assert router.stats.dropped_invalid_jsonrpc == 1
        assert router.session_count == 0
        assert router.batch_limit(MALLORY) is None


async def test_params_that_are_a_list_are_no_request() -> None:
    async with Router(Recorder(), accept=Sink().accept) as router:
        router.handle_pm(MALLORY, frame(request(1, params=[{"_meta": {BATCH_KEY: 5000}}]), sid_of(0))[0])
        assert router.stats.dropped_invalid_jsonrpc == 1
        assert router.session_count == 0
        assert router.batch_limit(MALLORY) is None


async def test_a_response_holding_only_the_mark_reaches_the_session_empty() -> None:
    async with Router(Recorder()) as router:
        conn = router.dial(PEER)
        await conn.write_stream.send(SessionMessage(JSONRPCRequest(jsonrpc="2.0", id=1, method="ping")))
        router.handle_pm(PEER, frame(response(1, marked(70_000)), conn.sid)[0])
        item = conn.read_stream.receive_nowait()
        assert isinstance(item, SessionMessage)
        assert isinstance(item.message, JSONRPCResponse)
        assert item.message.result == {}
        assert router.batch_limit(PEER) == 70_000


@pytest.mark.parametrize("seed", range(80))
def test_writes_that_fail_or_give_up_leave_nothing_queued(seed: int) -> None:
    # Writers of 1 to 4 parts, waiting or not, give up at random while a
    # flaky, sometimes slow brclient takes the PMs; paced by flushers or
    # by the writers themselves, with and without batches. Once they are
    # done and the outbox has drained, no part is queued or counted.
    rng = random.Random(seed)

    async def main() -> None:
        async def send(peer: str, text: str) -> None:
            if rng.random() < 0.1:
                raise RuntimeError("brclient refused the PM")
            if rng.random() < 0.2:
                await anyio.sleep(rng.random() * 0.3)

        limit = rng.choice([None, 4096, 20_000])
        flushers = rng.random() < 0.5
        async with anyio.create_task_group() as tg:
            outbox = Outbox(
                send,
                interval=INTERVAL,
                stats=RouterStats(),
                limit=lambda _peer: limit,
                spawn=Owner(tg).spawn if flushers else None,
            )

            async def writer(i: int) -> None:
                n, size = rng.randint(1, 4), rng.randint(1, 3000)
                parts = wire.encode(bytes([i % 256]) * size, sid="ab", exp=0, chunk_size=-(-size // n))
                with anyio.move_on_after(rng.choice([0, 0.01, 0.15, 0.5, 10])):
                    try:
                        await outbox.send(PEER, parts, wait=rng.random() < 0.5)
                    except RuntimeError:
                        pass

            async with anyio.create_task_group() as writers:
                for i in range(rng.randint(1, 60)):
                    writers.start_soon(writer, i)
                    if rng.random() < 0.3:
                        await anyio.sleep(rng.random() * 0.2)
            with anyio.fail_after(100):
                await outbox.drained()
            await anyio.sleep(1)
            lane = outbox._lanes.get(PEER)
            if lane is not None:
                assert list(lane.queue) == []
                assert lane.bytes == 0
            tg.cancel_scope.cancel()

    run_virtual(main)
