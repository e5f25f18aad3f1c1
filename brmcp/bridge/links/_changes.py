"""A bot link's change notifications (README §How a paid call travels;
BRIDGE.md §Eras and snapshots): what the bot sends unasked on the link's
standing session. Resource updates go to the agent sessions subscribed to
their URI, list changes to every agent session that used resources or
prompts (:mod:`.subscriptions`), a tool list change refreshes the link's
tool snapshot (which tells the agents once it is fresh). The bot is
unsubscribed from a URI nobody watches any more, and a new session
re-subscribes it to every URI agents still watch.

:class:`BotChanges` is that part, a component each :class:`~.link.BotLink`
owns; it reaches the bot through the link's sessions (:class:`ChangeSessions`).
Every bot is a stranger (SECURITY.md "The bridge against a hostile bot"):
at most :data:`MAX_PENDING_DROPS` unsubscriptions are queued at once.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Protocol

import anyio
import anyio.abc
from mcp import ClientSession
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPError
from mcp.types import (
    EmptyResult,
    PromptListChangedNotification,
    ResourceListChangedNotification,
    ResourceUpdatedNotification,
    ServerCapabilities,
    SubscribeRequest,
    SubscribeRequestParams,
    ToolListChangedNotification,
    UnsubscribeRequest,
    UnsubscribeRequestParams,
)

from ._linkbase import TRANSPORT_ERROR_CODES, describe_failure, log
from ._subscriptions import Subscriptions
from ._toolsnap import ToolSnapshot

__all__ = ["MAX_PENDING_DROPS", "BotChanges", "ChangeSessions", "can_subscribe"]

#: Most bot unsubscriptions queued at once; past it a URI is left alone until
#: its next update (a bot flooding updates for URIs nobody watches cannot
#: pile up tasks or hold the subscription lock for ever).
MAX_PENDING_DROPS = 32


class ChangeSessions(Protocol):
    """What :class:`BotChanges` uses of the sessions of its bot link
    (:class:`~.link.BotLink` provides it)."""

    @property
    def closed(self) -> bool:
        """True once the link is closed for good."""
        ...

    @property
    def connected(self) -> bool:
        """True while an initialized session is current."""
        ...

    def lease(self) -> AbstractAsyncContextManager[tuple[ClientSession, int]]:
        """Use the shared session: yields ``(session, generation)``; raises
        :class:`~._linkbase.LinkError`."""
        ...


def can_subscribe(capabilities: ServerCapabilities | None) -> bool:
    """True when ``capabilities`` declare resource subscriptions."""
    resources = capabilities.resources if capabilities is not None else None
    return resources is not None and bool(resources.subscribe)


class BotChanges:
    """The change notifications of one bot link. ``uid`` is the bot's;
    ``sessions`` the link's sessions (:class:`ChangeSessions`);
    ``task_group`` owns the unsubscribe tasks; ``subscriptions`` are the
    agents' (who watches what); ``tools`` is the link's tool snapshot (its
    capabilities tell whether the bot takes subscriptions; a tool list
    change refreshes it); ``connect_timeout`` bounds each (un)subscribe
    request (seconds)."""

    def __init__(
        self,
        uid: str,
        sessions: ChangeSessions,
        task_group: anyio.abc.TaskGroup,
        subscriptions: Subscriptions,
        tools: ToolSnapshot,
        *,
        connect_timeout: float,
    ) -> None:
        self.uid = uid
        self._sessions = sessions
        self._tg = task_group
        self._subscriptions = subscriptions
        self._tools = tools
        self._connect_timeout = connect_timeout
        self._dropping: set[str] = set()

    async def on_message(self, message: IncomingMessage) -> None:
        """``message_handler`` of the link's ClientSession: relays resource
        updates to their subscribers and list changes to every agent session
        that used resources or prompts. An update nobody here asked for
        unsubscribes the bot from that URI."""
        subscriptions = self._subscriptions
        if isinstance(message, ResourceUpdatedNotification):
            uri = message.params.uri
            delivered = await subscriptions.deliver_update(uri)
            if delivered == 0 and not subscriptions.subscribed(uri):
                self.schedule_drop(uri)
        elif isinstance(message, ResourceListChangedNotification):
            await subscriptions.broadcast(ResourceListChangedNotification())
        elif isinstance(message, PromptListChangedNotification):
            await subscriptions.broadcast(PromptListChangedNotification())
        elif isinstance(message, ToolListChangedNotification):
            # A bot whose tools change at run time (e.g. a brmcp gateway after
            # a prices.json reload): refreshed at once, then relayed, so
            # agents that re-list get the new tools.
            self._tools.list_changed()

    def schedule_drop(self, uri: str) -> None:
        """Unsubscribe the bot from ``uri`` in a task (nobody watches it):
        not when the bot takes no subscriptions, the link is closed, ``uri``
        is already being dropped or :data:`MAX_PENDING_DROPS` are."""
        if uri in self._dropping or self._sessions.closed or not can_subscribe(self._tools.capabilities):
            return
        if len(self._dropping) >= MAX_PENDING_DROPS:
            log.debug(
                "bot %s: %d unsubscriptions pending; not dropping %.200s",
                self.uid[:8],
                MAX_PENDING_DROPS,
                uri,
            )
            return
        self._dropping.add(uri)
        self._tg.start_soon(self._drop, uri)

    async def _drop(self, uri: str) -> None:
        """Unsubscribe the bot from ``uri`` unless an agent subscribed again
        meanwhile (best effort: failures are logged)."""
        try:
            async with self._subscriptions.lock:
                if self._subscriptions.subscribed(uri) or not self._sessions.connected:
                    return
                async with self._sessions.lease() as (session, _gen):
                    with anyio.fail_after(self._connect_timeout):
                        request = UnsubscribeRequest(params=UnsubscribeRequestParams(uri=uri))
                        await session.send_request(request, EmptyResult)
        except Exception as exc:
            log.debug("bot %s: unsubscribing from %s failed: %s", self.uid[:8], uri, describe_failure(exc))
        finally:
            self._dropping.discard(uri)

    async def resubscribe(self, gen: int) -> None:
        """Subscribe a new session (generation ``gen``) to every URI agents
        still watch: the bot forgot the old session's subscriptions. Best
        effort: failures are logged, never raised."""
        try:
            async with self._subscriptions.lock, self._sessions.lease() as (session, current):
                if current != gen:
                    return
                for uri in self._subscriptions.uris():
                    request = SubscribeRequest(params=SubscribeRequestParams(uri=uri))
                    try:
                        with anyio.fail_after(self._connect_timeout):
                            await session.send_request(request, EmptyResult)
                    except MCPError as exc:
                        if exc.error.code in TRANSPORT_ERROR_CODES:
                            raise
                        log.info("bot %s: re-subscribing to %s refused: %s", self.uid[:8], uri, exc)
        except Exception as exc:
            log.info("bot %s: re-subscribing resources failed: %s", self.uid[:8], describe_failure(exc))
