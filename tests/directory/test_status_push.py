"""Push status (brmcp/directory/model/_statuspush.py, docs/directory.md §Push
status): each caller reads its own registration as ``brmcpdir://registration``
and hears ``notifications/resources/updated`` for every change of it, and of
nobody else's; the Registrant follows a registration by subscription at a
directory that announces it and by polling ``my_status`` at one that does
not; a flood of changes toward a slow subscriber stays coalesced."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp.types as types
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.client.session import IncomingMessage

from brmcp import ManualClock
from brmcp.directory.model import (
    NOT_REGISTERED_NOTE,
    STATE_AWAITING_FUNDING,
    STATE_LISTED,
    STATE_NONE,
    STATE_PENDING_REVIEW,
    STATE_REJECTED,
    STATE_TESTING,
    STATUS_RESOURCE_KEY,
    STATUS_URI,
    StatusOut,
    StatusPush,
    TestSpec,
    settled,
    status_from_read,
)
from brmcp.directory.provider import AutoFund, Registrant, RegistrantConfig
from brmcp.server import CallContext, Harness
from brmcp.transport.router import RouterOptions
from tests.kit import until

from . import test_registrant as fake
from .stack import (
    ADMIN,
    BUDGET,
    CALLER,
    DAY,
    DIRECTORY,
    FEE,
    PRICE,
    PROVIDER,
    PROVIDER2,
    START,
    Stack,
    directory_stack,
    provider_harness,
    register_args,
)


class Inbox:
    """A ``message_handler`` keeping the status updates a session hears."""

    def __init__(self) -> None:
        self.updates: list[str] = []

    async def __call__(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updates.append(message.params.uri)


@dataclasses.dataclass
class Subscriber:
    session: ClientSession
    inbox: Inbox
    sid: str

    async def read(self) -> dict[str, Any]:
        result = await self.session.read_resource(STATUS_URI)
        assert isinstance(result, types.ReadResourceResult)
        block = result.contents[0]
        assert isinstance(block, types.TextResourceContents)
        assert block.mime_type == "application/json"
        value: dict[str, Any] = json.loads(block.text)
        return value

    async def read_matches_my_status(self) -> dict[str, Any]:
        """Read the resource and check it against ``my_status`` (which for
        a stranger is ``{"state": "none"}``, the read adding its note)."""
        now = await self.read()
        expected = await self.my_status()
        if expected == {"state": STATE_NONE}:
            expected["note"] = NOT_REGISTERED_NOTE
        assert now == expected
        return now

    async def my_status(self) -> dict[str, Any]:
        result = await self.session.call_tool("my_status", {})
        assert not result.is_error, result
        assert result.meta is not None
        assert result.meta[STATUS_RESOURCE_KEY] == STATUS_URI
        assert isinstance(result.structured_content, dict)
        return result.structured_content

    async def next_update(self, seen: int) -> int:
        """Wait for an update beyond the ``seen`` first; the new count."""
        await until(lambda: len(self.inbox.updates) > seen)
        assert set(self.inbox.updates) == {STATUS_URI}
        return len(self.inbox.updates)


@asynccontextmanager
async def subscriber(stk: Stack, who: str, *, subscribe: bool = True) -> AsyncIterator[Subscriber]:
    """A session of ``who`` to the directory, subscribed to the status resource."""
    inbox = Inbox()
    conn = stk.router_of(who).dial(DIRECTORY)
    try:
        async with ClientSession(
            conn.read_stream, conn.write_stream, read_timeout_seconds=20, message_handler=inbox
        ) as session:
            await session.initialize()
            if subscribe:
                request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=STATUS_URI))
                await session.send_request(request, types.EmptyResult)
            yield Subscriber(session, inbox, conn.sid)
    finally:
        conn.close()  # without a word to the directory (WIRE.md: no close frame)


def gated_provider(data_dir: Path) -> tuple[Harness, anyio.Event]:
    """A provider whose paid ``slow`` test tool answers once the event is set."""
    harness, _runs = provider_harness(data_dir)
    gate = anyio.Event()

    async def slow(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        await gate.wait()
        return {"ok": True}

    harness.add_tool("slow", slow, description="slow", input_schema={"type": "object"}, price_atoms=PRICE)
    return harness, gate


async def test_each_change_of_a_registration_reaches_its_subscriber_only(tmp_path: Path) -> None:
    sequence = itertools.count(1)
    # No idle expiry: the clock jumps a month to the listing's expiry.
    async with directory_stack(tmp_path, router_options=RouterOptions(idle_timeout=None)) as stk:
        harness, gate = gated_provider(tmp_path / "prov")
        await stk.add_provider(PROVIDER, harness)
        other, _ = provider_harness(tmp_path / "prov2")
        await stk.add_provider(PROVIDER2, other)
        for who in (ADMIN, PROVIDER):  # opened first: they close after the subscribers
            await stk.session(who)
        async with subscriber(stk, PROVIDER) as me, subscriber(stk, PROVIDER2) as bystander:
            seen = 0

            async def step(state: str) -> dict[str, Any]:
                nonlocal seen
                seen = await me.next_update(seen)
                await until(lambda: stk.directory.status_push.delivering == 0)
                now = await me.read_matches_my_status()
                assert now["state"] == state
                seen = len(me.inbox.updates)
                return now

            answer = await me.session.call_tool("register", register_args(tool="slow"))
            assert answer.meta is not None
            assert answer.meta[STATUS_RESOURCE_KEY] == STATUS_URI
            invoice = await step(STATE_AWAITING_FUNDING)
            assert invoice["shortfallAtoms"] == FEE + BUDGET

            await stk.directory.credit_tip(PROVIDER, 1_000 * 1_000, next(sequence))  # part of it
            assert (await step(STATE_AWAITING_FUNDING))["balanceAtoms"] == 1_000

            await stk.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1_000, next(sequence))
            await until(lambda: bool(stk.payer.sent))  # the test call is being paid
            await until(lambda: stk.directory.status_push.delivering == 0)
            assert (await me.read())["state"] == STATE_TESTING
            seen = len(me.inbox.updates)

            gate.set()  # the test passes: pending review
            assert "note" not in await step(STATE_PENDING_REVIEW)

            await stk.ok(ADMIN, "approve", {"uid": PROVIDER})
            expires = (await step(STATE_LISTED))["expiresAt"]

            await stk.ok(ADMIN, "flag", {"uid": PROVIDER, "note": "slow answers"})
            assert (await step(STATE_LISTED))["note"] == "slow answers"

            # A renewal runs the pipeline again and lists without review.
            await stk.ok(PROVIDER, "register", register_args(tool="slow"))
            await step(STATE_AWAITING_FUNDING)
            await stk.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1_000, next(sequence))
            await until(lambda: stk.directory.pipeline.inflight == frozenset())
            await until(lambda: stk.directory.status_push.delivering == 0)
            renewed = await me.read_matches_my_status()
            assert renewed["state"] == STATE_LISTED
            seen = len(me.inbox.updates)

            assert renewed["expiresAt"] >= expires

            stk.clock.set(renewed["expiresAt"] + 1)
            await stk.directory.sweep()  # expiry
            await step(STATE_NONE)

            # The residual balance funds a new application at once; it is rejected.
            await stk.ok(PROVIDER, "register", register_args(tool="slow"))
            await until(lambda: stk.directory.pipeline.inflight == frozenset())
            await until(lambda: stk.directory.status_push.delivering == 0)
            assert (await me.read_matches_my_status())["state"] == STATE_PENDING_REVIEW
            seen = len(me.inbox.updates)
            await stk.ok(ADMIN, "reject", {"uid": PROVIDER, "reason": "gone"})
            assert (await step(STATE_REJECTED))["note"] == "gone"

            # The bystander's first update is its own: none of the above
            # reached it (its session delivers in order).
            assert bystander.inbox.updates == []
            await bystander.session.call_tool("register", register_args())
            await bystander.next_update(0)
            assert bystander.inbox.updates == [STATUS_URI]
            assert (await bystander.read())["state"] == STATE_AWAITING_FUNDING


async def test_reading_the_resource_is_my_status_and_nobody_elses(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as stk:
        harness, _ = provider_harness(tmp_path / "prov")
        await stk.add_provider(PROVIDER, harness)
        await stk.ok(PROVIDER, "register", register_args())
        async with subscriber(stk, CALLER, subscribe=False) as stranger, subscriber(stk, PROVIDER) as me:
            init = stranger.session.initialize_result
            assert init is not None
            assert init.capabilities.resources is not None
            assert init.capabilities.resources.subscribe is True
            listed = await stranger.session.list_resources()
            assert [str(item.uri) for item in listed.resources] == [STATUS_URI]
            # A caller without a registration reads its own nothing.
            assert await stranger.read() == {"state": STATE_NONE, "note": NOT_REGISTERED_NOTE}
            assert (await stranger.my_status()) == {"state": STATE_NONE}
            mine = await me.read()
            assert mine == await me.my_status()
            assert mine["state"] == STATE_AWAITING_FUNDING
            assert status_from_read(await me.session.read_resource(STATUS_URI)) == StatusOut.from_json(mine)


async def test_an_unlisting_is_pushed(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as stk:
        harness, _ = provider_harness(tmp_path / "prov")
        await stk.add_provider(PROVIDER, harness)
        await stk.ok(PROVIDER, "register", register_args())
        await stk.directory.credit_tip(PROVIDER, (FEE + BUDGET) * 1_000, 1)

        async def parked() -> bool:
            return (await stk.directory.pipeline.status(PROVIDER)).state == STATE_PENDING_REVIEW

        await until(parked)
        await stk.ok(ADMIN, "approve", {"uid": PROVIDER})
        async with subscriber(stk, PROVIDER) as me:
            assert (await me.read())["state"] == STATE_LISTED
            await stk.ok(ADMIN, "unlist", {"uid": PROVIDER})
            await me.next_update(0)
            assert await me.read() == {"state": STATE_NONE, "note": NOT_REGISTERED_NOTE}


async def test_a_subscriber_that_went_away_costs_nothing(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as stk:
        harness, _ = provider_harness(tmp_path / "prov")
        await stk.add_provider(PROVIDER, harness)
        push = stk.directory.status_push
        async with subscriber(stk, PROVIDER) as me:
            assert stk.directory.harness.resource_subscribers(STATUS_URI, peer=PROVIDER) == 1
            assert stk.directory.harness.resource_subscribers(STATUS_URI, peer=PROVIDER2) == 0
        # Gone without a word: the directory forgets it when its session
        # idles out (the router's idle sweep closes it, as here).
        router = stk.directory.router
        assert router is not None
        server_side = router.session(PROVIDER, me.sid)
        assert server_side is not None
        server_side.close()
        await until(lambda: stk.directory.harness.resource_subscribers(STATUS_URI) == 0)
        sent = push.sent
        await stk.ok(PROVIDER, "register", register_args())
        assert push.delivering == 0
        assert push.pending == 0
        assert push.sent == sent


# -- coalescing ----------------------------------------------------------------------------


class SlowNotifier:
    """A notifier that holds every notification until released, and a
    change log to check no final update is lost."""

    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.sent: list[tuple[str, int]] = []  # (uid, changes of uid when it started)
        self.changes: dict[str, int] = {}
        self.subscribed: set[str] = set()

    async def notify(self, uri: str, peer: str) -> int:
        assert uri == STATUS_URI
        self.sent.append((peer, self.changes.get(peer, 0)))
        await self.gate.wait()
        return 1

    def subscribers(self, uri: str, peer: str) -> int:
        return 1 if peer in self.subscribed else 0

    def push(self) -> StatusPush:
        async def status(uid: str) -> StatusOut:
            return StatusOut()

        harness: Any = None  # never used: both paths are replaced
        return StatusPush(harness, status, notify=self.notify, subscribers=self.subscribers)


async def test_a_flood_toward_a_slow_subscriber_stays_coalesced() -> None:
    slow = SlowNotifier()
    slow.subscribed = {PROVIDER, PROVIDER2}
    push = slow.push()
    async with anyio.create_task_group() as tg:
        push.bind(tg)
        slow.changes[PROVIDER] = 1
        push.changed(PROVIDER)
        push.changed(PROVIDER2)
        await until(lambda: len(slow.sent) == 2)  # both in flight, held
        for _ in range(10_000):
            slow.changes[PROVIDER] += 1
            push.changed(PROVIDER)
            push.changed(CALLER)  # not subscribed: nothing at all
        for _ in range(3):
            push.changed(PROVIDER2)
        # One notification in flight per uid and at most one waiting behind it.
        assert push.delivering == 2
        assert push.pending == 2
        slow.gate.set()
        await until(lambda: push.delivering == 0)
        assert [uid for uid, _ in slow.sent].count(PROVIDER) == 2
        assert [uid for uid, _ in slow.sent].count(PROVIDER2) == 2
        assert CALLER not in {uid for uid, _ in slow.sent}
        # The last notification started after the last change.
        assert sorted(slow.sent[-2:]) == sorted([(PROVIDER, 10_001), (PROVIDER2, 0)])
        push.bind(None)
        push.changed(PROVIDER)  # not serving: dropped
        assert push.delivering == 0
        assert push.pending == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([PROVIDER, PROVIDER2, CALLER]), st.booleans()), max_size=40))
def test_coalescing_never_loses_the_last_change(plan: list[tuple[str, bool]]) -> None:
    """For any interleaving of changes and deliveries: at most one
    notification in flight and one pending per uid, never more
    notifications than changes, and each subscribed uid's last notification
    starts after its last change."""

    async def scenario() -> None:
        slow = SlowNotifier()
        slow.gate.set()
        slow.subscribed = {PROVIDER, PROVIDER2}
        push = slow.push()
        async with anyio.create_task_group() as tg:
            push.bind(tg)
            for who, let_run in plan:
                slow.changes[who] = slow.changes.get(who, 0) + 1
                push.changed(who)
                assert push.delivering <= 2
                assert push.pending <= push.delivering
                if let_run:
                    await anyio.wait_all_tasks_blocked()
            await until(lambda: push.delivering == 0)
        for who in slow.subscribed:
            mine = [count for uid, count in slow.sent if uid == who]
            assert len(mine) <= slow.changes.get(who, 0)
            if slow.changes.get(who):
                assert mine
                assert mine[-1] == slow.changes[who]
        assert CALLER not in {uid for uid, _ in slow.sent}

    anyio.run(scenario)


def test_settled_states() -> None:
    assert settled(StatusOut(state=STATE_LISTED))
    assert settled(StatusOut(state=STATE_REJECTED, note="no"))
    assert settled(StatusOut(state=STATE_NONE))
    assert settled(StatusOut(state=STATE_PENDING_REVIEW, note="test: refused"))
    assert not settled(StatusOut(state=STATE_PENDING_REVIEW))
    for state in (STATE_AWAITING_FUNDING, "crawling", STATE_TESTING):
        assert not settled(StatusOut(state=state))


# -- the Registrant ------------------------------------------------------------------------


async def test_the_registrant_follows_by_subscription_without_polling(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as stk:
        harness, runs = provider_harness(tmp_path / "prov")
        await stk.add_provider(PROVIDER, harness)
        tools = stk.directory.harness
        spec = next(item for item in tools.tools() if item.name == "my_status")
        status_calls: list[str] = []

        async def counted(ctx: CallContext, args: dict[str, Any]) -> Any:
            status_calls.append(ctx.peer)
            return await spec.handler(ctx, args)

        tools.add_tool_spec(dataclasses.replace(spec, handler=counted), replace=True)
        sequence = itertools.count(100)

        class Tips:
            async def pay(self, payee_uid: str, atoms: int) -> None:
                await stk.directory.credit_tip(PROVIDER, atoms * 1_000, next(sequence))

        notes: list[StatusOut | None] = []
        clock = ManualClock(START)  # never advanced: no safety poll, no poll
        registrant = Registrant(
            RegistrantConfig(
                description="fortunes on demand",
                tags=("fun",),
                test=TestSpec(tool="fortune", args={"topic": "tests"}, max_atoms=BUDGET),
                auto_fund=AutoFund(True, FEE + BUDGET, 10 * (FEE + BUDGET)),
                register_at_uids=(DIRECTORY,),
            ),
            payer=Tips(),
            data_dir=tmp_path / "registrant",
            router=stk.router_of(PROVIDER),
            clock=clock,
            notify=lambda _d, status, _e: notes.append(status),
        )
        await stk.session(ADMIN)  # opened first: it closes after the task group
        async with anyio.create_task_group() as tg:
            await tg.start(registrant.run)
            await until(lambda: any(n is not None and n.state == STATE_PENDING_REVIEW for n in notes))
            await until(lambda: tools.resource_subscribers(STATUS_URI, peer=PROVIDER) == 1)
            registered = len(status_calls)
            assert registered == 2  # before registering, after paying
            assert len(runs) == 1
            await stk.ok(ADMIN, "approve", {"uid": PROVIDER})
            await until(lambda: bool(notes) and notes[-1] is not None and notes[-1].state == STATE_LISTED)
            assert len(status_calls) == registered  # followed by push alone
            assert clock.now() == START
            tg.cancel_scope.cancel()
        listed = notes[-1]
        assert listed is not None
        assert listed.expires_at == int(START) + 30 * DAY


async def test_the_registrant_polls_a_directory_without_push(tmp_path: Path) -> None:
    poll = 45.0  # apart from the 30 s call timeouts the clock also sleeps on
    async with fake.network(tmp_path) as net:
        registrant = Registrant(
            RegistrantConfig(
                description=fake.CONFIG.description,
                tags=fake.CONFIG.tags,
                test=fake.CONFIG.test,
                auto_fund=fake.funded(),
                register_at_uids=(fake.DIRECTORY,),
            ),
            payer=net.books,
            data_dir=net.data_dir,
            router=net.provider_router,
            clock=net.clock,
            notify=lambda d, status, err: net.notes.append((d, status, err)),
            call_timeout=fake.CALL_TIMEOUT,
            poll_interval=poll,
        )
        await net.tg.start(registrant.run)
        await until(lambda: len(net.notes) == 1)
        first = net.notes[0][1]
        assert first is not None
        assert first.state == STATE_PENDING_REVIEW
        assert net.directory.status_calls == 2  # before registering, after paying
        # The first poll after the interval: still in review, nothing new to report.
        await until(lambda: poll in net.clock.sleeps)
        net.clock.advance(poll)
        await until(lambda: net.directory.status_calls == 3)
        assert len(net.notes) == 1
        net.directory.list_until(fake.START + 30 * DAY)
        # The next poll waits twice as long and finds the listing.
        await until(lambda: 2 * poll in net.clock.sleeps)
        net.clock.advance(2 * poll)
        await until(lambda: len(net.notes) == 2)
        assert net.notes[1][1] == StatusOut(state=STATE_LISTED, expires_at=int(fake.START) + 30 * DAY)
        assert net.directory.status_calls == 4
        assert net.clock.sleeps.count(poll) == 1
