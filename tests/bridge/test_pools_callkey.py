"""One callKey per logical call over a bot pool, and what the agent is told
when no member gives a result (WIRE.md §Pools, the money rule; BRIDGE.md
§Bot pools, §Failures, §Resumability; brmcp/bridge/pay/_pools.py).

A logical call keeps its callKey across every exchange, every member, every
"still running at another member" answer and the agent's identical re-send
of a call it did not receive; a member answering "still running" for ever
is asked on a backoff (:data:`~brmcp.bridge.pay._pools.STILL_RUNNING_MAX_PAUSE`),
never in a loop, and the call then ends at its deadline with an error that
counts the copies sent and the answers received over the whole call, its
time measured from the call's start.

Every test runs in virtual time (trio's ``MockClock``): a bridge without a
listener, called through its proxy with an agent request context, and
:class:`~tests.bridge.test_pools_hostile.PoolBot` members on the in-memory
fabric sharing one ledger and one record of outcomes per callKey.
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.to_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, CallToolResult
from trio.testing import MockClock

from brmcp.bridge import Bridge, ManualClock, RetryPolicy
from brmcp.bridge.agent import BotProxy
from brmcp.bridge.pay import STILL_RUNNING_MAX_PAUSE, STILL_RUNNING_PAUSE, still_running_asks
from brmcp.testing import Fabric, HostileBot
from brmcp.testing import fabric as fabric_module
from brmcp.testing.hostile import Behaviour, Die, HostileCall, KeyState, Reply, by_tool
from brmcp.transport.router import RouterOptions
from tests.bridge.test_pools_hostile import (
    PRICE,
    LedgerPayer,
    PoolBot,
    StillRunning,
    one_book,
    tools,
)
from tests.kit import CLIENT, until
from tests.kit.bridge import NAME, bridge_stack, fixture_settings

A, B, C = (f"{n:02x}" * 32 for n in (0xA1, 0xB2, 0xC3))
MEMBERS = (A, B, C)
#: The message TTL: each logical call's deadline (virtual seconds).
TTL = 20.0
RETRY = RetryPolicy(initial=0.5, minimum=0.5, maximum=1.0, answer_timeout=2.0)
#: The pool deadline error (brmcp/bridge/pay/_pools.py), its counts captured.
POOL_DEADLINE = re.compile(
    r"the call's deadline passed (\d+) s after it started without a result from any member of bot "
    r"[0-9a-f]{8}'s pool \([0-9a-f, ]+\): (\d+) cop(?:y|ies) sent to (\d+) members?"
)
STILL_TEXT = "that the call is still running at another member"


def run_virtual(main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})


@pytest.fixture(autouse=True)
def virtual_fabric(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fabric times its deliveries with anyio's clock (the virtual one),
    and the bridge's file writes run inline: virtual time jumps whenever
    every task waits, so a spend-log write in a worker thread would let the
    whole call's deadline pass while the payment waits for it."""
    monkeypatch.setattr(fabric_module, "time", SimpleNamespace(monotonic=anyio.current_time, time=time.time))

    async def inline(func: Callable[..., Any], *args: Any, **_: Any) -> Any:
        return func(*args)

    monkeypatch.setattr(anyio.to_thread, "run_sync", inline)


# -- members ------------------------------------------------------------------------------


@dataclass
class Book:
    """What a pool keeps per callKey on its shared book: the outcome of a
    call a member charged (replayed by every member), and when its run ends
    (virtual seconds; until then every member answers that it still runs
    at another member, the process running it)."""

    outcomes: dict[str, CallToolResult] = field(default_factory=dict)
    done_at: dict[str, float] = field(default_factory=dict)


def _key(call: HostileCall) -> str:
    assert call.call_key is not None, "every tools/call copy carries a callKey"
    return call.call_key


@dataclass(frozen=True, slots=True)
class Member(Behaviour):
    """A conforming pool member (WIRE.md §Pools, the money rule): a call
    recorded on the book is replayed once its run ended, and answered
    "still running at another member" until then; else it is charged
    (once, recorded) or refused. ``runs``: seconds the run takes after the
    charge, in a worker process of the pool (the copy that charged is
    answered "still running" too); ``crash``: the copy that charged gets no
    answer (the member died after recording it; its siblings replay it)."""

    book: Book
    runs: float = 0.0
    crash: bool = False

    def respond(self, bot: HostileBot, call: HostileCall, state: KeyState) -> Reply:
        key = _key(call)
        if key not in self.book.outcomes:
            price = bot.tools[call.tool].price_atoms
            if not bot.ledger.debit(call.peer, price):
                return Reply(bot.refusal(call.tool, price, bot.ledger.balance(call.peer)))
            self.book.outcomes[key] = bot.success(call, charged=price)
            self.book.done_at[key] = anyio.current_time() + self.runs
            if self.crash:
                return Reply(None)
        if anyio.current_time() < self.book.done_at[key]:
            return StillRunning().respond(bot, call, state)
        return Reply(self.book.outcomes[key])


@dataclass(frozen=True, slots=True)
class Fails(Behaviour):
    """A JSON-RPC error for every copy, running and charging nothing."""

    def respond(self, bot: HostileBot, call: HostileCall, state: KeyState) -> Reply:
        raise MCPError(INTERNAL_ERROR, "member failed")


def member(fabric: Fabric, me: str, kind: str, book: Book, opening: int = 0) -> PoolBot:
    """A pool member at ``me`` answering ``paid`` as ``kind`` says; the
    caller's ``opening`` balance on its ledger (atoms)."""
    behaviours: dict[str, Behaviour] = {
        "silent": Die(),
        "still": StillRunning(),
        "fail": Fails(),
        "answer": Member(book),
        "crash": Member(book, crash=True),
        "long": Member(book, runs=TTL + 5),
    }
    return PoolBot(
        fabric,
        me,
        tools(),
        members=MEMBERS,
        strategy=by_tool({"paid": behaviours[kind]}),
        opening={CLIENT: opening},
    )


# -- the stack ----------------------------------------------------------------------------


class _AgentSession:
    """The agent request's session as the relay uses it (nothing is relayed here)."""

    async def report_progress(self, progress: float, total: float | None, message: str | None) -> None:
        return None


def agent(sid: str = "s1") -> ServerRequestContext[Any]:
    """An agent's ``tools/call`` request context on HTTP session ``sid``."""
    return ServerRequestContext(
        session=_AgentSession(),  # type: ignore[arg-type]
        lifespan_context={},
        protocol_version="2025-11-25",
        method="tools/call",
        request_id=7,
        request=SimpleNamespace(headers={"mcp-session-id": sid}),
    )


@dataclass
class Env:
    bridge: Bridge
    payer: LedgerPayer
    bots: Sequence[HostileBot]
    #: The copies of ``paid`` each member received in the last :meth:`attempt`.
    asked: dict[str, list[HostileCall]] = field(default_factory=dict)

    @property
    def proxy(self) -> BotProxy:
        return self.bridge._proxy(A)

    async def learn(self) -> None:
        """Call ``free`` at A until the bridge knows every member."""
        result = await self.proxy.call("free", {})
        assert not result.is_error
        await until(lambda: len(self.bridge.pools.members(A)) == len(self.bots))

    async def attempt(self) -> tuple[CallToolResult | MCPError, float, list[HostileCall]]:
        """One agent call of ``paid`` at A: its outcome, its virtual
        seconds, and the copies the members received meanwhile (in
        :attr:`asked` per member too)."""
        before = {bot.uid: len(bot.calls) for bot in self.bots}
        start = anyio.current_time()
        outcome: CallToolResult | MCPError
        try:
            outcome = await self.proxy.call("paid", {"x": 1}, agent=agent())
        except MCPError as exc:
            outcome = exc
        took = anyio.current_time() - start
        self.asked = {
            bot.uid: [c for c in bot.calls[before[bot.uid] :] if c.tool == "paid"] for bot in self.bots
        }
        seen = [c for copies in self.asked.values() for c in copies]
        return outcome, took, seen

    def books(self) -> None:
        """Every payment is in the spend log and credited on the pool's
        ledger; at most one payment, of at most the price, per callKey."""
        entries = [e for e in self.bridge.spend_log().entries if e.counts]
        assert sorted((e.bot, e.atoms) for e in entries) == sorted(self.payer.calls), entries
        assert all(e.status == "paid" for e in entries), entries
        per_key: dict[str | None, list[int]] = {}
        for e in entries:
            per_key.setdefault(e.call_key, []).append(e.atoms)
        assert all(len(v) == 1 and v[0] <= PRICE for v in per_key.values()), per_key
        assert self.bots[0].ledger.credited == sum(atoms for _, atoms in self.payer.calls)


@asynccontextmanager
async def pool_stack(data: Path, bots: Sequence[HostileBot], fabric: Fabric) -> AsyncIterator[Env]:
    """A bridge at CLIENT without a listener allowing ``bots`` (entered
    here, on ``fabric``), message TTL :data:`TTL`, the pools' defaults."""
    payer = LedgerPayer()
    payer.bots = {bot.uid: bot for bot in bots}
    async with (
        bridge_stack(
            data,
            payer,
            bot=None,
            settings=fixture_settings(allowed_bots=tuple(bot.uid for bot in bots)),
            fabric=fabric,
            listen=None,
            name=NAME,
            clock=ManualClock(1_800_000_000, auto=True),
            router_options=RouterOptions(ttl=TTL),
            retry=RETRY,
        ) as built,
        AsyncExitStack() as stack,
    ):
        for bot in bots:
            await stack.enter_async_context(bot)
        yield Env(built.bridge, payer, bots)


def asks_bound(seconds: float) -> int:
    """Most asks of one member answering "still running" at once within
    ``seconds`` (the bound :func:`still_running_asks` documents)."""
    return still_running_asks(seconds, STILL_RUNNING_PAUSE, STILL_RUNNING_MAX_PAUSE)


# -- still running for ever -------------------------------------------------------------------


def test_members_answering_still_running_for_ever_end_the_call_at_its_deadline_counting_every_copy(
    tmp_path: Path,
) -> None:
    """All three members answer every copy at once that the original still
    runs at another member. The call ends at its deadline (measured from
    its start) with an error counting every copy sent and every answer,
    each member was asked on the backoff (not once a second for the whole
    deadline), nothing was paid, and the agent's re-send carries the same
    callKey."""

    async def main() -> None:
        fabric = Fabric()
        bots = [member(fabric, me, "still", Book()) for me in MEMBERS]
        one_book(*bots, keys=False)
        async with pool_stack(tmp_path, bots, fabric) as env:
            await env.learn()
            outcome, took, seen = await env.attempt()
            assert isinstance(outcome, MCPError), outcome
            message = outcome.error.message
            found = POOL_DEADLINE.match(message)
            assert found is not None, message
            answered = [c for c in seen if c.outcome == "answered"]
            assert int(found[2]) == len(seen), (message, len(seen))
            assert int(found[3]) == 3
            assert f"each answered {STILL_TEXT} ({len(answered)} answers)" in message, message
            assert TTL <= took < TTL + 1, took
            assert int(found[1]) == round(took)
            # At most the payment made alongside the first copy, and the error says it.
            assert len(env.payer.calls) <= 1
            if env.payer.calls:
                assert f"paid {PRICE} atoms for this call" in message, message
            for bot in bots:
                asked = env.asked[bot.uid]
                assert 1 <= len(asked) <= asks_bound(TTL), (bot.uid[:4], len(asked))
            assert len({c.call_key for c in seen}) == 1
            again, _, resent = await env.attempt()
            assert isinstance(again, MCPError)
            assert resent
            assert {c.call_key for c in resent} == {c.call_key for c in seen}
            assert len(env.payer.calls) <= 1
            env.books()

    run_virtual(main)


def test_the_agents_re_send_while_the_original_still_runs_at_a_member_reuses_its_callkey(
    tmp_path: Path,
) -> None:
    """The member the call reaches first charges it from the pool's credit
    and has it run for longer than the deadline; meanwhile every member
    answers every copy that it still runs at another member. The call ends
    at its deadline; the agent re-sends it: the same callKey reaches the
    members, one of them answers with the original's result once the run
    ended, and the pool charged the call once."""

    async def main() -> None:
        fabric = Fabric()
        book = Book()
        bots = [member(fabric, me, "long", book, PRICE if me == A else 0) for me in MEMBERS]
        one_book(*bots, keys=False)
        async with pool_stack(tmp_path, bots, fabric) as env:
            await env.learn()
            first, took, seen = await env.attempt()
            assert isinstance(first, MCPError), first
            assert TTL <= took < TTL + 1, took
            assert f"each answered {STILL_TEXT}" in first.error.message, first.error.message
            second, _, resent = await env.attempt()
            assert {c.call_key for c in seen} == {c.call_key for c in resent}
            assert len({c.call_key for c in seen}) == 1
            assert bots[0].ledger.charged == PRICE
            assert isinstance(second, CallToolResult), second
            assert not second.is_error, second
            # At most the payment made alongside the first copy (the balance
            # was not known yet); the re-send paid nothing.
            assert len(env.payer.calls) <= 1
            env.books()

    run_virtual(main)


# -- any mix of members -------------------------------------------------------------------------

KINDS = st.sampled_from(["silent", "still", "fail", "answer", "crash", "long"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(KINDS, min_size=3, max_size=3), st.integers(0, 1))
def test_any_mix_of_members_keeps_one_callkey_and_one_charge_per_logical_call(
    kinds: list[str], opening: int
) -> None:
    """Three members, each silent, still running for ever, failing,
    answering, crashing after it charged, or having the call it charged run
    past the deadline; the pool's credit covers the
    call or not (then the bridge pays the refusal). The agent calls once
    and, when it got no result, re-sends the call. Whatever the mix: every
    copy any member saw of that logical call carries one callKey; the pool
    charged it at most once and the bridge paid at most once; a deadline
    error counts the copies the members received; the books agree."""

    async def main(data: Path) -> None:
        fabric = Fabric()
        book = Book()
        bots = [
            member(fabric, me, kind, book, opening * PRICE) for me, kind in zip(MEMBERS, kinds, strict=True)
        ]
        one_book(*bots, keys=False)
        async with pool_stack(data, bots, fabric) as env:
            await env.learn()
            seen_all: list[HostileCall] = []
            attempts = 0
            while attempts < 2:
                attempts += 1
                outcome, took, seen = await env.attempt()
                seen_all += seen
                # A payment and its credit polls extend the deadline (BRIDGE.md §Deadlines).
                assert took <= TTL + 10, took
                if isinstance(outcome, MCPError):
                    found = POOL_DEADLINE.match(outcome.error.message)
                    if found is not None:
                        assert int(found[2]) == len(seen), (outcome.error.message, len(seen))
                    for bot in bots:
                        asked = env.asked[bot.uid]
                        if kinds[bots.index(bot)] == "still":
                            assert len(asked) <= asks_bound(took), (bot.uid[:4], len(asked))
                    continue
                break
            assert seen_all, "some member was asked"
            assert len({c.call_key for c in seen_all}) == 1, [(c.call_key, c.behaviour) for c in seen_all]
            assert bots[0].ledger.charged <= PRICE
            assert len(env.payer.calls) <= 1
            assert sum(atoms for _, atoms in env.payer.calls) <= PRICE
            env.books()

    with tempfile.TemporaryDirectory() as data:
        run_virtual(lambda: main(Path(data)))


def test_the_documented_bound_counts_asks_on_the_backoff() -> None:
    """:func:`still_running_asks`: 1 ask at 0 s, then one after each pause
    (doubling from the first pause up to the cap)."""
    assert still_running_asks(0.0, 1.0, 8.0) == 1
    pauses = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    at = 0.0
    for count, pause in enumerate(pauses, start=2):
        at += pause
        assert still_running_asks(at, 1.0, 8.0) == count
        assert still_running_asks(at - 0.01, 1.0, 8.0) == count - 1
    # Past the cap, one ask per cap: 4 asks by 7 s, then one each 8 s.
    assert still_running_asks(600.0, 1.0, 8.0) == 4 + math.floor((600.0 - 7.0) / 8.0)
