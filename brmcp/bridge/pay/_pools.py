"""Bot pools on the caller's side (WIRE.md §Pools; BRIDGE.md §Bot pools).

A pool is several bots, each its own BR identity, serving the same tools on
one shared book. The bridge treats an allowed bot as a **member** of the
pool ``(id, key)`` of another only when that bot itself announced
``brmcp/pool`` with that id and key in its own tool list, its own uid among
the members and the key equal to its ``brmcp/receiptKey``
(:attr:`.BotLink.pool`), and the two list each other. The ``members`` a bot
lists are where to look for siblings, never proof of them: a listed uid that
is not on the allowed bots, has not announced the same pool itself, or does
not list the bot back, is no member, and nothing is sent to it, paid to it
or counted for it (an announcement carries no signature, so a bot could
claim any pool; naming each other is what both operators did).

:class:`Pools` keeps who is a member of which pool and how loaded each
member is; :meth:`Pools.exchange` sends one ``tools/call`` request over a
pool:

* **Spread.** The request goes to the member with the fewest of this
  bridge's calls in flight, the one used least recently among equals, a
  member that failed recently last. Sequential calls rotate over the members,
  concurrent calls spread over them.
* **Failover.** When the member it went to is silent for
  ``max(failover_after, FAILOVER_RTOS * RTO)`` seconds (that member's RTO),
  or fails (no answer at its deadline, a link error), the same request,
  with the same ``brmcp/callKey`` and arguments, goes to the next member
  as well, and so on; the first answer from any member is the call's. At a
  second member the call is a duplicate of the first: it replays the
  recorded outcome, or waits for the original's, and is never charged
  twice (WIRE.md §Pools, the money rule). A member's answer that the
  original still runs at another member is no answer: that member is asked
  again, under the same key, until the call's deadline, on a backoff
  (:meth:`Pools.pause_after_still_running`): a member answering so for
  ever is asked at most :func:`still_running_asks` times in a call.
* **One callKey.** Every copy of a logical call, to every member, in every
  request of it, carries the call's one ``brmcp/callKey``; when no member
  gave a result by the deadline the error counts the copies sent and the
  answers received over the whole call (:class:`._exchange.CallTally`),
  and the agent's identical re-send reuses the key (:mod:`.proxy`).
* **One balance.** A pool has one :class:`.funding.Funding` for every
  member (:meth:`Pools.funding`), that of its id, key and members (bots
  claiming the same id and key without listing these members back are
  another pool): the balance a receipt of any member reports is the
  pool's, and payments made ahead of need go to the member preferred at
  that moment among those members, for the fixed price all of them list
  (none when they disagree). A member's refusal is paid only while it is
  still a member (:meth:`Pools.is_member`; else the members are asked
  again).

The hard bound per logical call (BRIDGE.md §The hard bound) is unchanged:
the payment loop of the call counts every payment it makes to any member,
the per-call cap and the listed price the agent was shown bound them all.
A bridge restart forgets membership until each member's tool list is asked
for again (membership is never read from a snapshot file).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from typing import Any

import anyio
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

from brmcp.bridge.base import Settings
from brmcp.bridge.links import (
    AgentCall,
    BotLink,
    CallTally,
    DeadlineError,
    HostOffline,
    LinkError,
    ProgressFn,
    tally_call,
)
from brmcp.protocol.pool import STILL_RUNNING_ELSEWHERE

from ._funding import Funding
from ._settle import Settler

__all__ = [
    "FAILOVER_AFTER",
    "FAILOVER_RTOS",
    "MAX_FUNDINGS",
    "PROBE_INTERVAL",
    "STILL_RUNNING_MAX_PAUSE",
    "STILL_RUNNING_PAUSE",
    "SUSPECT_SECONDS",
    "Pools",
    "still_running_asks",
]

log = logging.getLogger("brmcp.bridge")

#: Least seconds a member may stay silent on a request before the same
#: request goes to the next member too.
FAILOVER_AFTER = 5.0
#: ... and at least this many of that member's RTOs (a slow relay is not an
#: outage).
FAILOVER_RTOS = 3
#: Seconds a member that failed, or stayed silent while a sibling answered,
#: is tried last (it is tried again after that, or at once when it answers).
SUSPECT_SECONDS = 60.0
#: Seconds between the first two asks of a member that answered that the
#: original still runs at another member (the pause doubles after each
#: such answer in the call, up to :data:`STILL_RUNNING_MAX_PAUSE`).
STILL_RUNNING_PAUSE = 1.0
#: Most seconds between two such asks.
STILL_RUNNING_MAX_PAUSE = 8.0
#: Most pool Fundings kept (:meth:`Pools.funding`).
MAX_FUNDINGS = 64
#: Least seconds between two asks for the tool list of a listed sibling
#: whose own announcement is not known yet.
PROBE_INTERVAL = 300.0


class Pools:
    """Pool membership and routing for one bridge.

    ``link_of(uid)`` returns the live link of an allowed bot, or None;
    ``allowed(uid)`` says whether a uid is on the allowed bots;
    ``open_link(uid)`` returns the link of an allowed bot, built if needed
    (None while the bridge is not running), for asking a listed sibling
    for its tool list; ``settler``, ``settings`` and ``spawn`` (a task the
    bridge owns) build each pool's :class:`Funding`. ``failover_after`` is
    :data:`FAILOVER_AFTER`. Times are on the event loop's clock
    (:func:`anyio.current_time`), as the re-send timers."""

    def __init__(
        self,
        link_of: Callable[[str], BotLink | None],
        allowed: Callable[[str], bool],
        open_link: Callable[[str], BotLink | None],
        *,
        settler: Settler,
        settings: Callable[[], Settings],
        spawn: Callable[..., None],
        failover_after: float = FAILOVER_AFTER,
    ) -> None:
        self._link_of = link_of
        self._allowed = allowed
        self._open_link = open_link
        self._settler = settler
        self._settings = settings
        self._spawn = spawn
        self.failover_after = failover_after
        #: :data:`STILL_RUNNING_PAUSE` and :data:`STILL_RUNNING_MAX_PAUSE` (settable).
        self.still_running_pause = STILL_RUNNING_PAUSE
        self.still_running_max_pause = STILL_RUNNING_MAX_PAUSE
        self._inflight: dict[str, int] = {}
        self._used: dict[str, int] = {}
        self._use = itertools.count(1)
        self._suspect: dict[str, float] = {}
        self._probed: dict[str, float] = {}
        self._funding: dict[tuple[str, str, frozenset[str]], Funding] = {}
        #: Requests sent to a second member because the first was silent or failed.
        self.failovers = 0

    # -- membership ---------------------------------------------------------------

    def members(self, uid: str) -> list[BotLink]:
        """The links of the members of ``uid``'s pool that this bridge may
        use: ``uid``'s own first, then each allowed sibling its announcement
        lists that announced the same pool itself. ``[link]`` for a bot in
        no pool; ``[]`` when ``uid`` has no live link. Listed siblings whose
        own announcement is not known are probed (at most every
        :data:`PROBE_INTERVAL` s each)."""
        home = self._link_of(uid)
        if home is None or home.closed:
            return []
        pool = home.pool
        if pool is None:
            return [home]
        links = [home]
        for member in pool.members:
            if member == home.uid or not self._allowed(member):
                continue
            link = self._link_of(member)
            if link is None or link.closed or link.tools is None or link.stale:
                self._maybe_probe(member)
            if link is None or link.closed:
                continue
            theirs = link.pool
            if theirs is not None and theirs.pool == pool.pool and theirs.lists(home.uid):
                links.append(link)
        return links

    def _maybe_probe(self, uid: str) -> None:
        now = anyio.current_time()
        last = self._probed.get(uid)
        if last is not None and now - last < PROBE_INTERVAL:
            return
        self._probed[uid] = now
        link = self._open_link(uid)
        if link is None:
            return

        async def ask() -> None:
            try:
                await link.refresh()
            except LinkError as exc:
                log.info("pool sibling %s did not list its tools: %s", uid[:8], exc)

        link.spawn(ask)

    def funding(self, uid: str) -> Funding | None:
        """The one :class:`Funding` of ``uid``'s pool when it has more than
        one member this bridge may use, else None (the bot's own applies).

        A pool's Funding is that of its id, key **and members**: bots that
        announce the same id and key without listing these members back
        (another group claiming the pool) have a Funding of their own, and
        so does the pool once its members change (a member that left, or
        joined). Its payments ahead of need go to the member of those
        members preferred at the moment, never to another bot; its price of
        a tool is the fixed price every one of them lists (None when they
        disagree: nothing is paid ahead of need, and a refusal is paid
        within the price shown at the endpoint called). At most
        :data:`MAX_FUNDINGS` are kept (the least recently used goes; a call
        keeps the one it started with)."""
        members = self.members(uid)
        if len(members) < 2:
            return None
        pool = members[0].pool
        assert pool is not None
        uids = frozenset(link.uid for link in members)
        ident = (*pool.pool, uids)
        funding = self._funding.pop(ident, None)
        if funding is None:

            def current() -> list[BotLink]:
                return [link for link in self.members(uid) if link.uid in uids]

            def payee() -> str:
                order = self._order(current())
                return order[0].uid if order else uid

            def price_of(tool: str) -> int | None:
                prices = {link.fixed_price(tool) for link in current()}
                return prices.pop() if len(prices) == 1 else None

            funding = Funding(payee, self._settler, self._settings, price_of, self._spawn)
            while len(self._funding) >= MAX_FUNDINGS:
                del self._funding[next(iter(self._funding))]
        self._funding[ident] = funding
        return funding

    def is_member(self, uid: str, member: str) -> bool:
        """True when ``member`` is ``uid`` or one of the members of its
        pool this bridge may use now (:meth:`members`)."""
        return member == uid or any(link.uid == member for link in self.members(uid))

    def note(self, uid: str) -> list[str]:
        """The uids whose known balance a receipt or refusal of member
        ``uid`` states: every member of its pool (the book is shared), or
        ``[uid]``."""
        members = self.members(uid)
        return [link.uid for link in members] if members else [uid]

    # -- routing ------------------------------------------------------------------

    def _order(self, members: list[BotLink]) -> list[BotLink]:
        now = anyio.current_time()
        for uid, until in list(self._suspect.items()):
            if until <= now:
                del self._suspect[uid]

        def rank(link: BotLink) -> tuple[bool, int, int]:
            return (link.uid in self._suspect, self._inflight.get(link.uid, 0), self._used.get(link.uid, 0))

        return sorted(members, key=rank)

    def _wait_before_next(self, link: BotLink) -> float:
        """Seconds ``link`` may stay silent before the next member is asked too."""
        return max(self.failover_after, FAILOVER_RTOS * link.rtt.rto)

    def pause_after_still_running(self, answers: int) -> float:
        """Seconds before a member is asked again after its ``answers``-th
        answer (1, 2, ...) in this call that the original still runs at
        another member: :attr:`still_running_pause` doubled after each,
        at most :attr:`still_running_max_pause`.

        The bound: a member that answers so at once, for ever, is asked at
        most ``still_running_asks(T, still_running_pause,
        still_running_max_pause)`` times in a call of ``T`` seconds (with
        the defaults, 1 s doubling to 8 s: 4 asks in the first 7 s, then
        one per 8 s, 78 over the default 600 s message TTL, where a fixed
        1 s pause asked 600 times), each ask one copy unless the member
        also stays silent past its RTO (its re-sends then follow the RTO
        backoff, :mod:`.retry`). Over ``n`` members that is at most ``n``
        asks per :attr:`still_running_pause` seconds at first and ``n`` per
        :attr:`still_running_max_pause` seconds after. The member itself
        waited for the original before it answered (WIRE.md §Pools, the
        money rule, case 2), so a pause adds little to an honest wait."""
        cap = max(self.still_running_max_pause, self.still_running_pause)
        return float(min(self.still_running_pause * 2.0 ** min(max(answers, 1) - 1, 62), cap))

    async def exchange(
        self,
        home: BotLink,
        request: Any,
        *,
        progress: ProgressFn | None = None,
        quiet: anyio.Event | None = None,
        deadline: float | None = None,
        call: AgentCall | None = None,
    ) -> tuple[CallToolResult, BotLink]:
        """Send the ``tools/call`` ``request`` of ``home``'s agents over its
        pool (the module docstring) and return the first answer with the
        link of the member that gave it. A bot in no pool (or whose
        siblings this bridge may not use) gets it over ``home`` alone, as
        :meth:`.BotLink.exchange`. ``call`` is the agent call whose relayed
        traffic a sibling may send. Raises as :meth:`.BotLink.exchange`:
        :class:`HostOffline` at once, the bot's :class:`MCPError` when a
        member answered one; :class:`DeadlineError` when no member gave a
        result by ``deadline`` (without one: the message TTL from now), its
        text, ``sends`` and ``seconds`` those of the whole logical call (the
        :class:`.CallTally` in force: every copy to any member, every
        answer, the time from the call's start), or :class:`LinkError` when
        every member failed."""
        members = self.members(home.uid)
        if len(members) < 2:
            return await home.exchange(
                request, CallToolResult, progress=progress, quiet=quiet, deadline=deadline
            ), home
        with tally_call() as tally:
            return await self._exchange(members, home, request, progress, quiet, deadline, call, tally)

    async def _exchange(
        self,
        members: list[BotLink],
        home: BotLink,
        request: Any,
        progress: ProgressFn | None,
        quiet: anyio.Event | None,
        deadline: float | None,
        call: AgentCall | None,
        tally: CallTally,
    ) -> tuple[CallToolResult, BotLink]:
        """:meth:`exchange` over two or more ``members``, counting into
        ``tally`` (the logical call's)."""
        # Without the call's deadline, this request's: the message TTL from
        # now (a member answering "still running" is never asked past it).
        end = deadline if deadline is not None else anyio.current_time() + home.ttl
        order = self._order(members)
        answer: list[tuple[CallToolResult, BotLink] | BaseException] = []
        failures: list[LinkError] = []
        changed = anyio.Event()
        pending: set[str] = set()

        async def one(link: BotLink) -> None:
            nonlocal changed
            uid = link.uid
            self._inflight[uid] = self._inflight.get(uid, 0) + 1
            self._used[uid] = next(self._use)
            pending.add(uid)
            try:
                with link.relay.lend(call if link is not home else None):
                    while True:
                        # A member that said the original still runs at
                        # another member is asked again (same request, same
                        # callKey) on the backoff, in this request or a later
                        # one of the call, until the call's deadline.
                        due = tally.asks_due.get(uid)
                        if due is not None:
                            await anyio.sleep(max(0.0, min(due, end) - anyio.current_time()))
                            if anyio.current_time() >= end:
                                raise DeadlineError(
                                    f"bot {uid[:8]} answered that the call still runs at another member "
                                    "until the call's deadline",
                                    sends=tally.sends.get(uid, 0),
                                    seconds=tally.elapsed(),
                                )
                        result = await link.exchange(
                            request, CallToolResult, progress=progress, quiet=quiet, deadline=end
                        )
                        self._suspect.pop(uid, None)
                        if not _still_running_elsewhere(result):
                            break
                        pause = self.pause_after_still_running(tally.said_still_running(uid))
                        tally.asks_due[uid] = anyio.current_time() + pause
                if not answer:
                    for other in pending - {uid}:
                        # Silent while a sibling answered: tried last for a while.
                        self._suspect[other] = anyio.current_time() + SUSPECT_SECONDS
                answer.append((result, link))
                tg.cancel_scope.cancel()
            except (HostOffline, MCPError) as exc:
                answer.append(exc)
                tg.cancel_scope.cancel()
            except LinkError as exc:  # DeadlineError included
                self._suspect[uid] = anyio.current_time() + SUSPECT_SECONDS
                failures.append(exc)
                changed.set()
                changed = anyio.Event()
            finally:
                pending.discard(uid)
                self._inflight[uid] -= 1

        async with anyio.create_task_group() as tg:
            for index, link in enumerate(order):
                if index:
                    self.failovers += 1
                    before = order[index - 1].uid[:8]
                    log.info("call to bot %s: failing over to pool member %s", before, link.uid[:8])
                tg.start_soon(one, link)
                if index == len(order) - 1:
                    break
                # The next member is asked too once every member asked so far
                # failed, or the last one stayed silent for its wait.
                until = anyio.current_time() + self._wait_before_next(link)
                while len(failures) <= index and not answer:
                    left = until - anyio.current_time()
                    if left <= 0:
                        break
                    with anyio.move_on_after(left):
                        await changed.wait()
                if answer:
                    break
        if answer:
            first = answer[0]
            if isinstance(first, BaseException):
                raise first
            return first
        if any(isinstance(exc, DeadlineError) for exc in failures):
            # What every request of the call sent and heard, to any member,
            # and the time from the call's start (not this request's).
            seconds = tally.elapsed()
            names = ", ".join(link.uid[:8] for link in order)
            raise DeadlineError(
                f"the call's deadline passed {seconds:.0f} s after it started without a result from any "
                f"member of bot {home.uid[:8]}'s pool ({names}): {tally.describe()}",
                sends=tally.copies,
                seconds=seconds,
            )
        raise failures[0]


def _still_running_elsewhere(result: CallToolResult) -> bool:
    """A member's answer to a duplicate whose original still runs at another
    member (WIRE.md §Pools, the money rule, case 2)."""
    if not result.is_error or len(result.content) != 1:
        return False
    first = result.content[0]
    return isinstance(first, TextContent) and first.text.startswith(STILL_RUNNING_ELSEWHERE)


def still_running_asks(seconds: float, pause: float, cap: float) -> int:
    """Most asks of one member within ``seconds`` of the first when it
    answers each at once that the original still runs at another member:
    one at 0, then one after each pause, the pause ``pause`` doubling up to
    ``cap`` (seconds). Raises ValueError unless ``0 < pause <= cap``."""
    if not 0 < pause <= cap:
        raise ValueError(f"still_running_asks needs 0 < pause <= cap, got {pause!r}, {cap!r}")
    asks, at, gap = 1, 0.0, pause
    while gap < cap and at + gap <= seconds:
        at += gap
        asks += 1
        gap = min(gap * 2, cap)
    if at + gap > seconds:
        return asks
    return asks + math.floor((seconds - at) / cap)
