"""Routing one request over a pool (brmcp/bridge/pay/_pools.py ``Pools.exchange``;
BRIDGE.md §Bot pools), on stand-in links whose members answer, fail, stay
silent or say the original still runs elsewhere, in any mix and timing.

The invariants, for every mix: every member asked gets the very same
request (one callKey per logical call); the answer returned is one a member
gave, never a "still running at another member" answer; members are asked
in the routing order, a later one only after every earlier one failed or
stayed silent past the failover wait; when no member answers the error is
a link error (a deadline error when any member ran out of time); the bridge's
own brclient being down is raised at once; nothing stays counted in flight.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.types import CallToolRequest, CallToolRequestParams, CallToolResult, TextContent

from brmcp.bridge.links import DeadlineError, HostOffline, LinkError
from brmcp.bridge.pay import Pools
from brmcp.protocol.pool import STILL_RUNNING_ELSEWHERE, PoolAnnouncement
from brmcp.testing import uid

KEY = "cd" * 32
UIDS = [uid(40 + n) for n in range(4)]
FAILOVER = 0.02
SILENCE = 0.15
STILL_RUNNING = f"{STILL_RUNNING_ELSEWHERE}; retry with the same callKey"


@dataclass(frozen=True)
class Behaviour:
    """What one member does with each request: ``kind`` after ``delay`` s
    ("answer", "fail" (a link error), "deadline" (no reply by the
    deadline), "silent" (no reply until a deadline past the failover
    wait), "offline" (the bridge's own brclient is down), or "still"
    (``stills`` times "the original still runs elsewhere", then the
    answer))."""

    kind: str
    delay: float
    stills: int = 0


class _Rtt:
    rto = 0.001


@dataclass
class FakeLink:
    uid: str
    behaviour: Behaviour
    members: tuple[str, ...]
    asked: list[Any] = field(default_factory=list)
    started: list[float] = field(default_factory=list)
    closed: bool = False
    stale: bool = False
    tools: list[Any] = field(default_factory=list)
    rtt: _Rtt = field(default_factory=_Rtt)
    #: The message TTL: a request's deadline when the caller gives none.
    ttl: float = 3.0

    @property
    def pool(self) -> PoolAnnouncement:
        return PoolAnnouncement("p", self.members, KEY)

    @property
    def relay(self) -> FakeLink:
        return self

    @contextmanager
    def lend(self, call: Any) -> Iterator[None]:
        yield

    async def exchange(self, request: Any, result_type: Any, **_: Any) -> CallToolResult:
        self.asked.append(request)
        self.started.append(anyio.current_time())
        b = self.behaviour
        await anyio.sleep(b.delay)
        if b.kind == "silent":
            # No reply until the request's deadline, long after the failover wait.
            await anyio.sleep(SILENCE)
            raise DeadlineError("no reply", sends=3, seconds=SILENCE)
        if b.kind == "fail":
            raise LinkError(f"link of {self.uid[:4]} closed")
        if b.kind == "deadline":
            raise DeadlineError("no reply", sends=2, seconds=b.delay)
        if b.kind == "offline":
            raise HostOffline("the bridge's brclient is not connected", sends=1)
        if b.kind == "still" and len(self.asked) <= b.stills:
            return CallToolResult(content=[TextContent(type="text", text=STILL_RUNNING)], isError=True)
        return CallToolResult(content=[TextContent(type="text", text=f"by {self.uid}")])


def _pools(links: dict[str, FakeLink]) -> Pools:
    pools = Pools(
        links.get,
        lambda u: u in links,
        links.get,  # type: ignore[arg-type]
        settler=None,  # type: ignore[arg-type]
        settings=lambda: None,  # type: ignore[arg-type,return-value]
        spawn=lambda *a: None,
        failover_after=FAILOVER,
    )
    pools.still_running_pause = 0.001
    return pools


BEHAVIOURS = st.builds(
    Behaviour,
    kind=st.sampled_from(["answer", "fail", "deadline", "silent", "still", "offline"]),
    delay=st.sampled_from([0.0, 0.005, 0.03, 0.06]),
    stills=st.integers(0, 2),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(BEHAVIOURS, min_size=2, max_size=4))
def test_one_request_over_a_pool_keeps_the_invariants(behaviours: list[Behaviour]) -> None:
    members = tuple(UIDS[: len(behaviours)])
    links = {u: FakeLink(u, b, members) for u, b in zip(members, behaviours, strict=True)}
    pools = _pools(links)
    request = CallToolRequest(
        params=CallToolRequestParams(name="paid", arguments={"x": 1}, _meta={"brmcp/callKey": "k" * 32})
    )
    outcome: list[Any] = []

    async def main() -> None:
        with anyio.fail_after(5):
            try:
                outcome.append(await pools.exchange(links[members[0]], request))
            except Exception as exc:
                outcome.append(exc)

    anyio.run(main)
    (got,) = outcome
    asked = [link for link in links.values() if link.asked]
    # One logical call, one request: every copy to every member is the same.
    assert all(r is request for link in asked for r in link.asked)
    # Members are asked in order; a later one only once the earlier ones
    # failed or stayed silent past the wait.
    order = sorted(asked, key=lambda link: link.started[0])
    assert [link.uid for link in order] == list(members[: len(order)])
    answerers = {u for u, b in zip(members, behaviours, strict=True) if b.kind in ("answer", "still")}
    if isinstance(got, tuple):
        result, link = got
        assert link.uid in answerers
        assert result.content[0].text == f"by {link.uid}"
        assert STILL_RUNNING_ELSEWHERE not in result.content[0].text
    else:
        assert isinstance(got, LinkError), got
        if isinstance(got, HostOffline):
            assert any(links[u].behaviour.kind == "offline" for u in members)
        else:
            # Nobody answered: every member was asked, none could answer, and
            # the error is a deadline one when any member ran out of time.
            assert len(asked) == len(members)
            assert not answerers
            timed_out = any(b.kind in ("deadline", "silent") for b in behaviours)
            assert isinstance(got, DeadlineError) == timed_out, got
    assert all(n == 0 for n in pools._inflight.values())


@pytest.mark.anyio
async def test_a_bot_in_no_pool_is_asked_alone() -> None:
    link = FakeLink(UIDS[0], Behaviour("answer", 0.0), (UIDS[0], UIDS[1]))
    pools = _pools({UIDS[0]: link})  # the listed sibling is not allowed: no member
    request = CallToolRequest(params=CallToolRequestParams(name="paid"))
    _, served = await pools.exchange(link, request)
    assert served is link
    assert link.asked == [request]
    assert pools.failovers == 0


@pytest.mark.anyio
async def test_a_silent_member_is_tried_last_afterwards() -> None:
    members = (UIDS[0], UIDS[1])
    links = {
        UIDS[0]: FakeLink(UIDS[0], Behaviour("silent", 0.0), members),
        UIDS[1]: FakeLink(UIDS[1], Behaviour("answer", 0.0), members),
    }
    pools = _pools(links)
    request = CallToolRequest(params=CallToolRequestParams(name="paid"))
    for _ in range(3):
        _, served = await pools.exchange(links[UIDS[0]], request)
        assert served.uid == UIDS[1]
    # Once silent while its sibling answered, the first member goes last.
    assert len(links[UIDS[0]].asked) == 1
    assert pools.failovers == 1
