"""Which agent sessions hear about changes on a bot: ``resources/subscribe``
per URI, and the ``list_changed`` notifications (BRIDGE.md §Resources,
prompts and completions).

All agents of one bot share the link's single BR session, so the bot is
subscribed to a URI once, when the first agent session subscribes to it,
and unsubscribed when the last one unsubscribes. The bot's
``notifications/resources/updated`` then goes to the agent sessions
subscribed to that URI (or to a URI it lies under: the spec lets a server
report a sub-resource), on each session's standalone stream (its GET
stream; an agent without one gets nothing, as from any server).
``notifications/resources/list_changed`` and ``prompts/list_changed`` go to
every agent session that has used the bot's resources or prompts.

Agent sessions are known by their ``Mcp-Session-Id``. One is forgotten when
it ends with DELETE, when a notification to it fails, or when more than
:data:`MAX_AGENTS` are known (least recently active first); URIs left
without a subscriber are reported to ``on_orphan`` so the link can
unsubscribe the bot.

What the bot sends is relayed within rate bounds (SECURITY.md "The bridge
against a hostile bot"): each relayed notification is multiplied by the
agent sessions that get it, so a flood is dropped past
:data:`LIST_CHANGED_BURST` / :data:`LIST_CHANGED_RATE` list changes of each
kind and :data:`UPDATES_BURST` / :data:`UPDATES_RATE` resource updates.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.server import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    ResourceUpdatedNotification,
    ResourceUpdatedNotificationParams,
    ServerNotification,
)

from ._linkbase import RateGate
from ._relay import agent_session_id

__all__ = [
    "LIST_CHANGED_BURST",
    "LIST_CHANGED_RATE",
    "MAX_AGENTS",
    "MAX_URIS_PER_AGENT",
    "MAX_URI_BYTES",
    "NOTIFY_TIMEOUT",
    "UPDATES_BURST",
    "UPDATES_RATE",
    "Subscriptions",
]

log = logging.getLogger("brmcp.bridge")

#: Agent sessions remembered per bot (least recently active dropped first).
MAX_AGENTS = 1024
#: Resource URIs one agent session may subscribe to on one bot.
MAX_URIS_PER_AGENT = 256
#: Longest URI (UTF-8 bytes) an agent may subscribe to, bounding the table.
MAX_URI_BYTES = 2048
#: Seconds one relayed notification may take before it is given up.
NOTIFY_TIMEOUT = 10.0
#: ``list_changed`` notifications of one kind (resources, prompts, tools)
#: relayed from one bot: this many at once, then :data:`LIST_CHANGED_RATE`
#: per second; the rest are dropped (a real bot's lists change on an
#: operator's action, seconds or minutes apart).
LIST_CHANGED_BURST = 10
LIST_CHANGED_RATE = 1.0
#: ``notifications/resources/updated`` relayed from one bot: this many at
#: once, then :data:`UPDATES_RATE` per second; the rest are dropped. An
#: update asks an agent to read the resource again, a round trip over BR.
UPDATES_BURST = 100
UPDATES_RATE = 20.0


class _Agent:
    __slots__ = ("session", "uris")

    def __init__(self, session: ServerSession) -> None:
        self.session = session
        self.uris: set[str] = set()


def _covers(subscribed: str, uri: str) -> bool:
    """True when an update of ``uri`` concerns a subscription to ``subscribed``:
    the same URI, or one below it in the path (``file:///d`` covers ``file:///d/a``)."""
    if uri == subscribed:
        return True
    base = subscribed if subscribed.endswith("/") else subscribed + "/"
    return uri.startswith(base)


class Subscriptions:
    """The agent sessions of one bot link. ``on_orphan(uri)`` is called
    (synchronously) for each URI whose last subscriber went away without
    unsubscribing."""

    def __init__(
        self, on_orphan: Callable[[str], None] | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        self._agents: OrderedDict[str, _Agent] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._on_orphan = on_orphan
        #: The time source of the rate bounds (seconds; anyio's by default).
        self.clock: Callable[[], float] = clock if clock is not None else anyio.current_time
        self._gates: dict[str, RateGate] = {}
        #: Serializes the subscription changes sent to the bot (held across
        #: the round trip, so a subscribe and an unsubscribe of one URI
        #: cannot cross on the way).
        self.lock = anyio.Lock()

    # -- bookkeeping ---------------------------------------------------------------

    def watch(self, ctx: ServerRequestContext[Any]) -> str | None:
        """Remember the agent session of request ``ctx`` (it will get the
        list_changed notifications); returns its session id, None for a
        request without one."""
        sid = agent_session_id(ctx)
        if sid is None:
            return None
        agent = self._agents.get(sid)
        if agent is None:
            self._agents[sid] = _Agent(ctx.session)
            while len(self._agents) > MAX_AGENTS:
                old, dropped = self._agents.popitem(last=False)
                log.info("bridge: forgetting agent session %s… (over %d)", old[:8], MAX_AGENTS)
                self._release(dropped)
        else:
            agent.session = ctx.session
            self._agents.move_to_end(sid)
        return sid

    def forget(self, sid: str) -> None:
        """Forget one agent session (it ended)."""
        agent = self._agents.pop(sid, None)
        if agent is not None:
            self._release(agent)

    def _release(self, agent: _Agent) -> None:
        for uri in agent.uris:
            if self._decrement(uri) and self._on_orphan is not None:
                self._on_orphan(uri)
        agent.uris.clear()

    def _decrement(self, uri: str) -> bool:
        """One subscriber fewer; True when it was the last."""
        left = self._counts.get(uri, 0) - 1
        if left > 0:
            self._counts[uri] = left
            return False
        self._counts.pop(uri, None)
        return True

    def subscribed(self, uri: str) -> bool:
        """True while some agent session is subscribed to exactly ``uri``."""
        return uri in self._counts

    def uris(self) -> list[str]:
        """Every URI with at least one subscriber."""
        return list(self._counts)

    @property
    def agents(self) -> int:
        return len(self._agents)

    # -- agent requests ------------------------------------------------------------

    async def subscribe(
        self, ctx: ServerRequestContext[Any], uri: str, forward: Callable[[], Awaitable[object]]
    ) -> None:
        """``resources/subscribe`` from an agent: ``forward()`` subscribes the
        bot when this is the URI's first subscriber; its MCPError reaches
        the agent and nothing is recorded. Raises MCPError -32600 for a
        request without a session or over :data:`MAX_URIS_PER_AGENT`."""
        if agent_session_id(ctx) is None:
            raise MCPError(code=INVALID_REQUEST, message="resources/subscribe needs an MCP session")
        if len(uri.encode("utf-8", "surrogatepass")) > MAX_URI_BYTES:
            raise MCPError(
                code=INVALID_PARAMS, message=f"resources/subscribe: URI longer than {MAX_URI_BYTES} bytes"
            )
        async with self.lock:
            sid = self.watch(ctx)
            assert sid is not None
            if uri in self._agents[sid].uris:
                return
            if len(self._agents[sid].uris) >= MAX_URIS_PER_AGENT:
                raise MCPError(
                    code=INVALID_REQUEST,
                    message=f"too many resource subscriptions on this bot ({MAX_URIS_PER_AGENT})",
                )
            if not self.subscribed(uri):
                await forward()
            self.watch(ctx)  # again: the session may have been dropped meanwhile
            self._agents[sid].uris.add(uri)
            self._counts[uri] = self._counts.get(uri, 0) + 1

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any], uri: str, forward: Callable[[], Awaitable[object]]
    ) -> None:
        """``resources/unsubscribe`` from an agent: ``forward()`` unsubscribes
        the bot when this was the URI's last subscriber (its MCPError
        reaches the agent). Unsubscribing from a URI the session did not
        subscribe to does nothing."""
        async with self.lock:
            sid = self.watch(ctx)
            agent = self._agents.get(sid) if sid is not None else None
            if agent is None or uri not in agent.uris:
                return
            agent.uris.discard(uri)
            if self._decrement(uri):
                await forward()

    # -- bot notifications -----------------------------------------------------------

    async def deliver_update(self, uri: str) -> int:
        """Relay ``notifications/resources/updated`` for ``uri`` to the
        subscribed agent sessions; returns how many got it, or, when the
        rate bound (:data:`UPDATES_BURST`, :data:`UPDATES_RATE`) dropped
        it, how many it was meant for (so the URI counts as watched)."""
        notification = ResourceUpdatedNotification(params=ResourceUpdatedNotificationParams(uri=uri))
        targets = [
            (sid, agent)
            for sid, agent in self._agents.items()
            if any(_covers(subscribed, uri) for subscribed in agent.uris)
        ]
        if targets and not self.gate(notification.method).take():
            return len(targets)
        return await self._send(targets, notification)

    async def broadcast(self, notification: ServerNotification) -> int:
        """Relay a list_changed notification to every known agent session;
        returns how many got it (0 when the rate bound of its kind,
        :data:`LIST_CHANGED_BURST` and :data:`LIST_CHANGED_RATE`, dropped it)."""
        if self._agents and not self.gate(notification.method).take():
            return 0
        return await self._send(list(self._agents.items()), notification)

    def gate(self, method: str) -> RateGate:
        """The rate bound on relaying notifications ``method`` from the bot
        (one per method; on :attr:`clock`)."""
        gate = self._gates.get(method)
        if gate is None:
            if method == "notifications/resources/updated":
                burst, rate = UPDATES_BURST, UPDATES_RATE
            else:
                burst, rate = LIST_CHANGED_BURST, LIST_CHANGED_RATE
            gate = RateGate(method, burst=burst, rate=rate, clock=lambda: self.clock())
            self._gates[method] = gate
        return gate

    async def _send(self, targets: list[tuple[str, _Agent]], notification: ServerNotification) -> int:
        sent = 0

        async def one(sid: str, agent: _Agent) -> None:
            nonlocal sent
            with anyio.move_on_after(NOTIFY_TIMEOUT):
                try:
                    await agent.session.send_notification(notification)
                except Exception as exc:
                    log.debug("%s to agent session %s… failed: %s", notification.method, sid[:8], exc)
                    if self._agents.get(sid) is agent:
                        self.forget(sid)
                    return
                sent += 1

        async with anyio.create_task_group() as tg:
            for sid, agent in targets:
                tg.start_soon(one, sid, agent)
        return sent
