"""Re-send timers that follow the measured round trip (BRIDGE.md §Deadlines
and re-sends; brmcp/bridge/links/_retry.py).

The scenario of ``brmcp demo --latency 1500``: every PM crosses the relay in
1.5 s plus up to 0.3 s of jitter, so a round trip takes 3.0 to 3.6 s, more
than the 3 s first guess. The link tests run that fabric in virtual time
(trio's ``MockClock``, the clock anyio's timers read; the fabric's own
delivery times are pointed at it), so seconds of relay latency cost none and
every PM is counted on the fabric. The estimator's rules (RFC 6298 §2, §3,
§5.5; RFC 9002 §6.2.2) are checked as properties.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp.server import Server, ServerRequestContext
from mcp.shared.message import SessionMessage
from trio.testing import MockClock

import brmcp.testing.fabric as fabric_module
from brmcp import Router
from brmcp.bridge.links import (
    SAMPLE_LIMIT,
    BotLink,
    BotSnapshot,
    RetryPolicy,
    RttEstimator,
    SnapshotStore,
    relay_estimator,
)
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.testing import Fabric, Faults
from brmcp.transport.conn import SendReceipt, send_receipt
from brmcp.transport.router import RouterOptions
from tests.kit import BOT, CLIENT, OTHER_BOT, pm_messages
from tests.kit.bridge import bridge_env

#: The relay of ``brmcp demo --latency 1500``: 1.5 s per PM, 20 % jitter.
DEMO_FAULTS = Faults(latency=1.5, jitter=0.3)
INFO = types.Implementation(name="brmcp-rto-test", version="1")
FREE = types.CallToolRequest(params=types.CallToolRequestParams(name="free", arguments={}))


# -- the estimator -------------------------------------------------------------------


async def _until_written(predicate: Callable[[], bool], limit: float = 30.0) -> None:
    """Wait for a file a worker thread writes: bounded in real seconds, since
    virtual time jumps ahead while the loop only waits for the thread."""
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "the snapshot was not written"
        await anyio.sleep(0.005)


def test_rfc6298_first_and_later_samples() -> None:
    rtt = RttEstimator(RetryPolicy())
    assert rtt.rto == 3.0
    rtt.sample(2.0)
    assert (rtt.srtt, rtt.rttvar, rtt.rto) == (2.0, 1.0, 6.0)  # §2.2
    rtt.sample(4.0)
    assert rtt.rttvar == pytest.approx(0.75 * 1.0 + 0.25 * 2.0)  # §2.3
    assert rtt.srtt == pytest.approx(0.875 * 2.0 + 0.125 * 4.0)


def test_a_backed_off_rto_is_kept_until_a_fresh_sample() -> None:
    rtt = RttEstimator(RetryPolicy())
    rtt.sample(1.0)
    assert rtt.rto == 3.0
    assert rtt.expired(3.0) == 6.0
    assert rtt.expired(6.0) == 12.0
    # The next request starts from the backed-off RTO (Karn), not from 3 s ...
    assert (rtt.rto, rtt.backed_off) == (12.0, 12.0)
    # ... a reply too late to measure changes nothing ...
    assert not rtt.answered(SAMPLE_LIMIT * 3.0 + 0.1, 3.0)
    assert rtt.rto == 12.0
    # ... and a measured one collapses it (RFC 6298 §5, after rule 5.7).
    assert rtt.answered(1.0, 12.0)
    assert rtt.backed_off is None
    assert rtt.rto == rtt.measured == pytest.approx(1.0 + 4 * 0.375)


def test_first_guess_order_backoff_own_seed_relay_initial() -> None:
    policy = RetryPolicy()
    relay = RttEstimator(policy)
    link = RttEstimator(policy, prior=relay)
    assert link.rto == policy.initial
    relay.seed(2.0, 0.5)
    assert link.rto == 4.0  # the relay's first guess
    relay.sample(1.0)
    assert link.rto == 3.0  # the relay's measurement (1 + 4 x 0.5)
    link.seed(4.0, 1.0)
    assert link.rto == 8.0  # this bot's own earlier measurement
    link.sample(1.2)
    assert (link.srtt, link.rttvar) == (1.2, 0.6)  # the first sample replaces the seed
    assert relay.samples == 2  # every link's samples reach the relay
    link.expired(link.rto)
    assert link.rto == link.backed_off


def test_seeds_keep_the_larger_and_are_refused_when_not_finite() -> None:
    rtt = RttEstimator(RetryPolicy())
    rtt.seed(2.0, 0.5)
    rtt.seed(1.0, 0.1)
    assert rtt.record() == (2.0, 0.5)
    rtt.seed(5.0, 0.0)
    assert rtt.record() == (5.0, 0.0)
    for bad in ((math.nan, 0.0), (1.0, math.inf), (-1.0, 0.0)):
        with pytest.raises(ValueError):
            rtt.seed(*bad)
    rtt.sample(1.0)
    rtt.seed(9.0, 9.0)  # ignored after a sample
    assert rtt.record() == (1.0, 0.5)


def test_one_relay_estimator_per_router() -> None:
    policy = RetryPolicy()
    a, b = Router(Sink()), Router(Sink())
    assert relay_estimator(a, policy) is relay_estimator(a, policy)
    assert relay_estimator(a, policy) is not relay_estimator(b, policy)


@st.composite
def policies(draw: st.DrawFn) -> RetryPolicy:
    values = sorted(draw(st.lists(st.floats(0.01, 1_000.0), min_size=3, max_size=3)))
    return RetryPolicy(minimum=values[0], initial=values[1], maximum=values[2])


seconds = st.floats(0.0, 1e6, allow_nan=False)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("sample"), seconds),
        st.tuples(st.just("answered"), seconds, st.floats(0.01, 1e4)),
        st.tuples(st.just("expired"), st.floats(0.0, 1e4)),
        st.tuples(st.just("seed"), seconds, seconds),
        st.tuples(st.just("relay"), seconds),
    ),
    max_size=40,
)


def _apply(rtt: RttEstimator, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "sample":
        rtt.sample(op[1])
    elif kind == "answered":
        rtt.answered(op[1], op[2])
    elif kind == "expired":
        rtt.expired(op[1])
    elif kind == "seed":
        rtt.seed(op[1], op[2])
    else:
        assert rtt.prior is not None
        rtt.prior.sample(op[1])


@given(policies(), operations)
def test_rto_is_always_within_minimum_and_maximum(policy: RetryPolicy, ops: list[tuple[Any, ...]]) -> None:
    rtt = RttEstimator(policy, prior=RttEstimator(policy))
    for op in ops:
        _apply(rtt, op)
        assert policy.minimum <= rtt.rto <= policy.maximum
    offsets = [0.0, *rtt.schedule(policy.maximum * 4)]
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert all(policy.minimum * (1 - 1e-9) <= gap <= policy.maximum * (1 + 1e-9) for gap in gaps)


@given(policies(), st.floats(0.0, 1e4), operations)
def test_backoff_is_retained_until_a_fresh_sample(
    policy: RetryPolicy, expired: float, ops: list[tuple[Any, ...]]
) -> None:
    rtt = RttEstimator(policy, prior=RttEstimator(policy))
    gap = rtt.expired(expired)
    assert gap == rtt.clamp(expired * 2)
    kept = gap
    for op in ops:
        sampled_before = rtt.samples
        _apply(rtt, op)
        if rtt.samples > sampled_before:
            # A fresh sample of this bot: the RTO is the measured one again.
            assert rtt.backed_off is None
            assert rtt.rto == rtt.measured
            return
        if op[0] == "expired":
            kept = max(kept, rtt.clamp(op[1] * 2))
        # Nothing else (seeds, late answers, other bots' samples) ends it.
        assert rtt.backed_off == kept
        assert rtt.rto == kept


@given(seconds, st.floats(0.01, 1e4))
def test_a_reply_is_measured_only_within_twice_its_rto(rtt_s: float, rto: float) -> None:
    rtt = RttEstimator(RetryPolicy())
    assert rtt.answered(rtt_s, rto) == (rtt_s <= SAMPLE_LIMIT * rto)
    assert rtt.samples == (1 if rtt_s <= SAMPLE_LIMIT * rto else 0)


# -- the persisted RTT ---------------------------------------------------------------


def test_snapshot_carries_the_rtt_and_ignores_a_bad_one() -> None:
    snap = BotSnapshot(bot=BOT, era="modern", protocol_version="2026-07-28", rtt=(3.25, 0.5))
    data = json.loads(snap.to_json())
    assert data["rtt"] == {"srtt": 3.25, "rttvar": 0.5}
    assert BotSnapshot.from_json(snap.to_json()).rtt == (3.25, 0.5)
    del data["rtt"]  # a file written before the RTT was persisted
    assert BotSnapshot.from_json(json.dumps(data)).rtt is None
    assert "rtt" not in json.loads(BotSnapshot.from_json(json.dumps(data)).to_json())
    for bad in ("x", None, [1, 2], {"srtt": 1}, {"srtt": True, "rttvar": 0}, {"srtt": -1, "rttvar": 0}):
        data["rtt"] = bad
        loaded = BotSnapshot.from_json(json.dumps(data))
        assert loaded.rtt is None
        assert loaded.bot == BOT
    data["rtt"] = "HUGE"
    huge = '{"srtt": 1e999, "rttvar": 1' + "0" * 400 + "}"  # inf, and an integer beyond any float
    assert BotSnapshot.from_json(json.dumps(data).replace('"HUGE"', huge)).rtt is None


# -- when a copy left: the send receipt ------------------------------------------------


class GatedSender:
    """A PMSender in front of another whose PM calls wait for :attr:`gate`
    (as a brclient whose PM queue is full); counts the PM calls begun, and
    the one-part requests among them by (peer, method)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = anyio.Event()
        self.gate.set()
        self.begun = 0
        self.requests: dict[tuple[str, str], int] = {}
        self.fail: BaseException | None = None

    def close(self) -> None:
        self.gate = anyio.Event()

    async def send_pm(self, peer: str, text: str) -> None:
        self.begun += 1
        for message in pm_messages(text):
            if "id" in message and isinstance(message.get("method"), str):
                key = (peer, str(message["method"]))
                self.requests[key] = self.requests.get(key, 0) + 1
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        await self.inner.send_pm(peer, text)


class Sink:
    def __init__(self) -> None:
        self.texts: list[str] = []

    async def send_pm(self, peer: str, text: str) -> None:
        self.texts.append(text)


def _request(n: int, method: str = "ping") -> SessionMessage:
    return SessionMessage(types.JSONRPCRequest(jsonrpc="2.0", id=n, method=method))


async def test_a_receipt_marks_when_the_request_left_this_side() -> None:
    sender = GatedSender(Sink())
    sender.close()
    async with Router(sender, options=RouterOptions(chunk_size=64)) as router:
        conn = router.dial(BOT)
        receipt = SendReceipt()
        token = send_receipt.set(receipt)
        try:
            async with anyio.create_task_group() as tg:
                # A notification written here does not claim the receipt.
                tg.start_soon(
                    conn.write_stream.send,
                    SessionMessage(types.JSONRPCNotification(jsonrpc="2.0", method="notifications/x")),
                )
                await anyio.wait_all_tasks_blocked()
                assert not receipt.claimed
                big = types.JSONRPCRequest(jsonrpc="2.0", id=1, method="ping", params={"pad": "p" * 200})
                tg.start_soon(conn.write_stream.send, SessionMessage(big))
                await anyio.wait_all_tasks_blocked()
                # Claimed, but its PM call has not returned: it has not left.
                assert receipt.claimed
                assert receipt.parts > 1
                assert receipt.left_at is None
                assert not receipt.settled.is_set()
                sender.gate.set()
            assert receipt.left_at is not None
            assert receipt.settled.is_set()
            assert not receipt.failed
            assert receipt.started_at is not None
            assert receipt.started_at <= receipt.left_at
            left = receipt.left_at
            await conn.write_stream.send(_request(2))  # a later request leaves it alone
            assert receipt.left_at == left
            assert receipt.parts > 1
        finally:
            send_receipt.reset(token)


async def test_a_receipt_of_a_failed_send_settles_as_failed() -> None:
    sender = GatedSender(Sink())
    sender.fail = ConnectionError("brclient is gone")
    async with Router(sender) as router:
        conn = router.dial(BOT)
        receipt = SendReceipt()
        token = send_receipt.set(receipt)
        try:
            with pytest.raises(anyio.BrokenResourceError):
                await conn.write_stream.send(_request(1))
        finally:
            send_receipt.reset(token)
        assert receipt.failed
        assert receipt.settled.is_set()
        assert receipt.left_at is None


# -- links over the demo's relay, in virtual time --------------------------------------


def run_virtual(main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` on trio with a clock that jumps to the next timer
    whenever every task waits: relay seconds cost no real time."""
    anyio.run(main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})


@pytest.fixture
def virtual_fabric(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fabric times its deliveries with anyio's clock (the virtual one)."""
    monkeypatch.setattr(fabric_module, "time", SimpleNamespace(monotonic=anyio.current_time, time=time.time))


@dataclass
class Relay:
    fabric: Fabric
    router: Router
    tg: anyio.abc.TaskGroup
    sender: GatedSender

    def copies(self, bot: str, method: str) -> int:
        """Copies of ``method`` requests the bridge side sent to ``bot``."""
        return self.sender.requests.get((bot, method), 0)

    def link(self, bot: str = BOT, **options: Any) -> BotLink:
        return BotLink(bot, self.router, self.tg, INFO, **options)


def harness_bot(data_dir: Path) -> Harness:
    """A brmcp bot (as ``brmcp-serve`` in the demo) with one free tool."""
    harness = Harness(HarnessConfig(data_dir=data_dir, allowed_peers={CLIENT}, calls_per_minute=100_000))

    async def free(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    harness.add_tool("free", free, description="A free tool", input_schema={"type": "object"})
    return harness


def handshake_bot() -> Server[Any]:
    """A plain SDK bot (handshake era: initialize first) with one free tool."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="free", input_schema={"type": "object"})])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])

    return Server("plain", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


@asynccontextmanager
async def relay(tmp_path: Path, *, plain: bool = False) -> AsyncIterator[Relay]:
    """The demo's relay with bots at BOT and OTHER_BOT (brmcp harnesses, or
    plain SDK servers) and a client router at CLIENT behind a
    :class:`GatedSender`."""
    async with AsyncExitStack() as stack:
        fabric = await stack.enter_async_context(Fabric(seed=7, faults=DEMO_FAULTS))
        for n, bot in enumerate((BOT, OTHER_BOT)):
            if plain:
                server = handshake_bot()

                async def accept(conn: Any, server: Server[Any] = server) -> None:
                    await server.run(
                        conn.read_stream, conn.write_stream, server.create_initialization_options()
                    )

                await stack.enter_async_context(fabric.router(bot, accept=accept))
            else:
                harness = harness_bot(tmp_path / f"bot{n}")
                await stack.enter_async_context(harness)
                fabric.attach(bot, (await harness.start(fabric.sender(bot))).handle_pm)
        sender = GatedSender(fabric.sender(CLIENT))
        router = await stack.enter_async_context(Router(sender))
        fabric.attach(CLIENT, router.handle_pm)
        tg = await stack.enter_async_context(anyio.create_task_group())
        yield Relay(fabric, router, tg, sender)
        tg.cancel_scope.cancel()


async def _timed(awaitable: Awaitable[Any]) -> tuple[Any, float]:
    start = anyio.current_time()
    result = await awaitable
    return result, anyio.current_time() - start


@pytest.mark.usefixtures("virtual_fabric")
def test_after_a_re_sent_first_contact_no_call_is_re_sent(tmp_path: Path) -> None:
    """``brmcp demo --latency 1500``, the connect and call steps. The first
    guess (3 s) is below this relay's round trip, so the first-contact
    initialize goes twice; its first answer is taken (one round trip, not
    two) and measured (its JSON-RPC id names the copy), so no call after it
    is sent twice. Before, every call went twice: 3 s was never replaced."""

    async def main() -> None:
        async with relay(tmp_path) as r:
            link = r.link()
            tools, took = await _timed(link.refresh())
            assert [t.name for t in tools] == ["free"]
            assert 3.0 <= took < 4.0  # the first copy's answer, not the second's
            assert r.copies(BOT, "initialize") == 2
            assert link.resends == 1
            assert link.rtt.samples == 1
            assert link.rtt.srtt == pytest.approx(took, abs=0.01)
            for n in range(1, 4):
                result, took = await _timed(link.exchange(FREE, types.CallToolResult))
                assert not result.is_error
                assert took < 4.0
                assert r.copies(BOT, "tools/call") == n  # one copy per call
            assert r.copies(BOT, "initialize") == 2
            assert link.resends == 1
            assert link.rtt.rto > 3.6  # the measured round trip plus its variation
            link.close()

    run_virtual(main)


@pytest.mark.usefixtures("virtual_fabric")
def test_a_second_bot_behind_the_relay_starts_from_its_rtt(tmp_path: Path) -> None:
    async def main() -> None:
        async with relay(tmp_path) as r:
            first = r.link(BOT)
            await first.refresh()
            second = r.link(OTHER_BOT)
            assert first.rtt.prior is not None
            assert second.rtt.rto == first.rtt.prior.measured
            assert second.rtt.rto > 3.6
            await second.refresh()
            result = await second.exchange(FREE, types.CallToolResult)
            assert not result.is_error
            assert r.copies(OTHER_BOT, "initialize") == 1
            assert r.copies(OTHER_BOT, "tools/call") == 1
            assert second.resends == 0
            first.close()
            second.close()

    run_virtual(main)


@pytest.mark.usefixtures("virtual_fabric")
def test_a_restart_starts_from_the_rtt_persisted_with_the_snapshot(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "bridge")

    async def main() -> None:
        async with relay(tmp_path) as r:
            link = r.link(store=store)
            await link.refresh()
            await link.exchange(FREE, types.CallToolResult)
            measured = link.rtt.record()
            assert measured is not None
            # Written with the first snapshot (its own thread), in the background.
            await _until_written(lambda: (snap := store.load(BOT)) is not None and snap.rtt is not None)
            saved = store.load(BOT)
            assert saved is not None
            assert saved.rtt == pytest.approx(measured, abs=1.0)
            link.close()
        # A new process: a new router (no relay measurement), the snapshot read back.
        async with relay(tmp_path) as r:
            snapshot = store.load(BOT)
            assert snapshot is not None
            assert snapshot.rtt is not None
            link = r.link(store=store, snapshot=snapshot)
            first_guess = link.rtt.measured
            assert first_guess is not None
            assert first_guess > 3.6
            assert link.rtt.rto == first_guess
            # ... and the relay's, for bots not measured yet.
            assert relay_estimator(r.router, RetryPolicy()).measured == first_guess
            result = await link.exchange(FREE, types.CallToolResult)
            assert not result.is_error
            # Before, the restarted bridge re-sent this first call at 3 s.
            assert r.copies(BOT, "tools/call") == 1
            assert link.resends == 0
            link.close()

    run_virtual(main)


@pytest.mark.usefixtures("virtual_fabric")
def test_a_handshake_bot_is_initialized_once_on_the_measured_rtt(tmp_path: Path) -> None:
    async def main() -> None:
        async with relay(tmp_path, plain=True) as r:
            link = r.link()
            await link.refresh()
            assert link.era == "handshake"
            assert r.copies(BOT, "initialize") == 2  # the first contact, on the 3 s first guess
            link.reset()  # a new session: initialize again, now on the measured RTO
            result = await link.exchange(FREE, types.CallToolResult)
            assert not result.is_error
            assert result.content[0].type == "text"
            assert r.copies(BOT, "initialize") == 3
            assert r.copies(BOT, "tools/call") == 1
            assert link.resends == 1
            link.close()

    run_virtual(main)


@pytest.mark.usefixtures("virtual_fabric")
def test_no_copy_joins_one_still_waiting_to_leave(tmp_path: Path) -> None:
    """brclient holds the bridge's PM calls for 60 s (a full PM queue): no
    copy is sent meanwhile, and the round trip measured after is the
    relay's, without the 60 s this side queued."""

    async def main() -> None:
        async with relay(tmp_path) as r:
            # The agent is told after 100 s (answer_timeout), not the 30 s default.
            link = r.link(retry=RetryPolicy(initial=5.0, answer_timeout=100.0))
            r.sender.close()
            async with anyio.create_task_group() as tg:
                tg.start_soon(link.refresh)
                await anyio.sleep(60)
                assert r.sender.begun == 1  # twelve first-guess RTOs later: still one copy
                r.sender.gate.set()
            assert r.copies(BOT, "initialize") == 1
            assert link.resends == 0
            assert link.rtt.srtt is not None
            assert link.rtt.srtt < 4.0
            begun = r.sender.begun
            r.sender.close()
            async with anyio.create_task_group() as tg:
                tg.start_soon(link.exchange, FREE, types.CallToolResult)
                await anyio.sleep(60)
                assert r.sender.begun == begun + 1
                r.sender.gate.set()
            assert r.copies(BOT, "tools/call") == 1
            assert link.resends == 0
            assert link.rtt.srtt < 4.0
            link.close()

    run_virtual(main)


@pytest.mark.usefixtures("virtual_fabric")
def test_an_outage_is_not_measured_and_its_backoff_is_kept(tmp_path: Path) -> None:
    """The bot is offline for a minute during a call: the call's copies back
    off, the late answer is not taken as a round trip, the backed-off RTO is
    kept for the next call, and that call's measured answer ends it."""

    async def main() -> None:
        async with relay(tmp_path) as r:
            link = r.link()
            await link.refresh()
            srtt = link.rtt.srtt
            rto = link.rtt.rto
            r.fabric.set_offline(BOT)
            async with anyio.create_task_group() as tg:
                tg.start_soon(link.exchange, FREE, types.CallToolResult)
                await anyio.sleep(60)
                r.fabric.set_online(BOT)
            # Copies at 0, RTO and 3 x RTO; the answer to the first came after them.
            assert r.copies(BOT, "tools/call") == 3
            assert link.rtt.srtt == srtt  # the outage is not a round trip
            assert link.rtt.backed_off == pytest.approx(rto * 4)
            assert link.rtt.rto == link.rtt.backed_off
            result, took = await _timed(link.exchange(FREE, types.CallToolResult))
            assert not result.is_error
            assert took < 4.0
            assert r.copies(BOT, "tools/call") == 4
            assert link.rtt.backed_off is None
            measured = link.rtt.measured
            assert measured is not None
            assert link.rtt.rto == measured < rto * 2
            link.close()

    run_virtual(main)


async def test_a_started_bridge_seeds_the_relay_from_persisted_round_trips(tmp_path: Path) -> None:
    data_dir = tmp_path / "bridge"
    data_dir.mkdir()
    SnapshotStore(data_dir).save(
        BotSnapshot(bot=OTHER_BOT, era="handshake", protocol_version="2025-11-25", updated=1, rtt=(4.0, 0.5))
    )
    async with bridge_env(tmp_path) as env:
        shared = relay_estimator(env.bridge._router, env.bridge.config.retry)
        # A bot never contacted in this run starts from what an earlier run measured.
        assert shared.measured == pytest.approx(4.0 + 4 * 0.5)
        assert shared.rto == pytest.approx(6.0)
