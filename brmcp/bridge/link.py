"""One bot link: the single BR session to a bot that every local HTTP session
for that bot shares (go-brmcp.md §4.4).

A link dials the bot over the bridge's client-role router, initializes an
MCP client session in the handshake era (2-minute limit), remembers the
capabilities the bot declared, and keeps a snapshot of the bot's tools from
one ``tools/list``. A transport failure *resets* the link: the next user
dials a fresh session (new sid, new initialize, fresh capabilities) and the
next HTTP request refreshes the snapshot. Calls still in flight on the old
session finish on it; it is closed when the last one is done.

The link also carries the bot's change notifications: resource updates and
list changes go to the agent sessions that asked for them
(:mod:`.subscriptions`), and a new session re-subscribes the bot to every
URI agents still watch.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
from mcp import ClientSession
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    EmptyResult,
    Implementation,
    ListToolsRequest,
    ListToolsResult,
    PaginatedRequestParams,
    PromptListChangedNotification,
    ResourceListChangedNotification,
    ResourceUpdatedNotification,
    ServerCapabilities,
    SubscribeRequest,
    SubscribeRequestParams,
    Tool,
    ToolListChangedNotification,
    UnsubscribeRequest,
    UnsubscribeRequestParams,
)

from ..conn import Conn
from ..router import Router
from .relay import Relay
from .subscriptions import Subscriptions

__all__ = ["MAX_PENDING_DROPS", "TRANSPORT_ERROR_CODES", "BotLink", "LinkError"]

log = logging.getLogger("brmcp.bridge")

#: Limit for initialize and for the tools/list snapshot (seconds).
CONNECT_TIMEOUT = 120.0
#: Most tools/list pages followed for one snapshot.
_MAX_PAGES = 64
#: MCPError codes the SDK raises itself when the BR session failed (as
#: opposed to an error the bot answered with).
TRANSPORT_ERROR_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT})
#: Most bot unsubscriptions queued at once; past it a URI is left alone until
#: its next update (a bot flooding updates for URIs nobody watches cannot
#: pile up tasks or hold the subscription lock for ever).
MAX_PENDING_DROPS = 32


class LinkError(Exception):
    """The bot could not be reached: dialing, initialize or tools/list failed."""


class _Session:
    __slots__ = ("conn", "done", "error", "gen", "ready", "retired", "session", "stop", "users")

    def __init__(self, gen: int, conn: Conn) -> None:
        self.gen = gen
        self.conn = conn
        self.session: ClientSession | None = None
        self.error: BaseException | None = None
        self.ready = anyio.Event()
        self.stop = anyio.Event()
        self.done = anyio.Event()
        self.users = 0
        self.retired = False


class BotLink:
    """The BR side of one bot. ``uid`` is the lowercase 64-hex bot uid;
    ``router`` the bridge's client-role router; ``task_group`` owns the
    session tasks; ``client_info`` is sent in initialize."""

    def __init__(
        self,
        uid: str,
        router: Router,
        task_group: anyio.abc.TaskGroup,
        client_info: Implementation,
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self.uid = uid
        self._router = router
        self._tg = task_group
        self._client_info = client_info
        self._connect_timeout = connect_timeout
        self._current: _Session | None = None
        self._gen = 0
        self._lock = anyio.Lock()
        self._snapshot_lock = anyio.Lock()
        self._tools: list[Tool] | None = None
        self._by_name: dict[str, Tool] = {}
        self._stale = True
        self._closed = False
        self._capabilities: ServerCapabilities | None = None
        self._dropping: set[str] = set()
        #: Sessions dialed so far (observability and tests).
        self.dials = 0
        #: Routes the bot's in-call traffic to the agent calls in flight.
        self.relay = Relay()
        #: The agent sessions that hear about the bot's resource and prompt changes.
        self.subscriptions = Subscriptions(on_orphan=self._schedule_drop)

    # -- sessions -------------------------------------------------------------

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[tuple[ClientSession, int]]:
        """Use the shared session, dialing and initializing it first when
        needed; yields ``(session, generation)``. Raises :class:`LinkError`
        when the bot cannot be reached."""
        state = await self._acquire()
        state.users += 1
        try:
            assert state.session is not None
            yield state.session, state.gen
        finally:
            state.users -= 1
            if state.retired and state.users == 0:
                state.stop.set()

    async def _acquire(self) -> _Session:
        async with self._lock:
            if self._closed:
                raise LinkError("link closed")
            state = self._current
            if state is not None and state.ready.is_set() and (state.done.is_set() or state.conn.closed):
                self._retire(state)
                state = None
            if state is None:
                try:
                    conn = self._router.dial(self.uid)
                except RuntimeError as exc:
                    raise LinkError(str(exc)) from None
                self._gen += 1
                self.dials += 1
                state = _Session(self._gen, conn)
                self._current = state
                self._stale = True
                self._tg.start_soon(self._run, state, name=f"brmcp-bridge-link-{self.uid[:8]}")
            await state.ready.wait()
            if state.session is None:
                if self._current is state:
                    self._current = None
                error = state.error
                raise LinkError(_describe(error) if error is not None else "session closed")
            return state

    async def _run(self, state: _Session) -> None:
        conn = state.conn
        try:
            relay = self.relay
            async with ClientSession(
                conn.read_stream,
                conn.write_stream,
                client_info=self._client_info,
                logging_callback=relay.on_log,
                sampling_callback=relay.on_sampling,
                elicitation_callback=relay.on_elicitation,
                message_handler=self._on_bot_message,
            ) as s:
                with anyio.fail_after(self._connect_timeout):
                    result = await s.initialize()
                if self._current is state:
                    self._capabilities = result.capabilities
                state.session = s
                state.ready.set()
                if self.subscriptions.uris() and _can_subscribe(result.capabilities):
                    self._tg.start_soon(self._resubscribe, state.gen)
                await state.stop.wait()
        except Exception as exc:
            state.error = exc
            log.info("bot %s: session ended: %s", self.uid[:8], _describe(exc))
        finally:
            state.session = None
            conn.close()
            state.ready.set()
            state.done.set()

    def _retire(self, state: _Session) -> None:
        state.retired = True
        if state.users == 0:
            state.stop.set()

    def reset(self, gen: int | None = None) -> bool:
        """Drop the current session (only if it is generation ``gen`` when
        given) so the next use dials afresh, and mark the tool snapshot
        stale. Returns True when something was reset."""
        state = self._current
        if state is None or (gen is not None and state.gen != gen):
            return False
        self._current = None
        self._stale = True
        self._retire(state)
        return True

    def close(self) -> None:
        """Close the BR session for good (de-listed bot or bridge closing)."""
        self._closed = True
        state = self._current
        self._current = None
        self._stale = True
        if state is not None:
            state.stop.set()
            state.conn.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def capabilities(self) -> ServerCapabilities | None:
        """The capabilities the bot declared in its last ``initialize`` (None
        before the first); a reset keeps them until the next session's."""
        return self._capabilities

    @property
    def connected(self) -> bool:
        """True while an initialized session is current."""
        state = self._current
        return state is not None and state.session is not None and not state.conn.closed

    # -- tools snapshot -------------------------------------------------------

    @property
    def tools(self) -> list[Tool] | None:
        """The last snapshot (None before the first one), possibly stale."""
        return self._tools

    def tool(self, name: str) -> Tool | None:
        return self._by_name.get(name)

    @property
    def stale(self) -> bool:
        """True when the snapshot must be fetched again before use (the link
        was reset, or the bot said its tool list changed)."""
        return self._stale

    async def refresh(self) -> list[Tool]:
        """Return the tool snapshot, fetching it with ``tools/list`` (one
        round trip unless the bot paginates) when there is none yet or the
        link was reset since. Raises :class:`LinkError`."""
        if self._tools is not None and not self._stale:
            return self._tools
        async with self._snapshot_lock:
            if self._tools is not None and not self._stale:
                return self._tools
            async with self.lease() as (session, gen):
                try:
                    with anyio.fail_after(self._connect_timeout):
                        declared = self._capabilities
                        # A bot without tools (a resources-only server) has none to list.
                        tools = (
                            []
                            if declared is not None and declared.tools is None
                            else await _list_all(session)
                        )
                except Exception as exc:
                    self.reset(gen)
                    raise LinkError(f"tools/list: {_describe(exc)}") from exc
                current = self._current
                self._tools = tools
                self._by_name = {t.name: t for t in tools}
                self._stale = current is None or current.gen != gen
            return tools

    # -- change notifications -----------------------------------------------

    def forget_agent(self, session_id: str) -> None:
        """An agent HTTP session ended: drop its subscriptions (the bot is
        unsubscribed from URIs nobody else watches)."""
        self.subscriptions.forget(session_id)

    async def _on_bot_message(self, message: IncomingMessage) -> None:
        """``message_handler`` of the link's ClientSession: relays resource
        updates to their subscribers and list changes to every agent session
        that used resources or prompts. An update nobody here asked for
        unsubscribes the bot from that URI."""
        if isinstance(message, ResourceUpdatedNotification):
            uri = message.params.uri
            delivered = await self.subscriptions.deliver_update(uri)
            if delivered == 0 and not self.subscriptions.subscribed(uri):
                self._schedule_drop(uri)
        elif isinstance(message, ResourceListChangedNotification):
            await self.subscriptions.broadcast(ResourceListChangedNotification())
        elif isinstance(message, PromptListChangedNotification):
            await self.subscriptions.broadcast(PromptListChangedNotification())
        elif isinstance(message, ToolListChangedNotification):
            # A bot whose tools change at run time (e.g. a brmcp gateway after
            # a prices.json reload): the next tools/list fetches them again.
            self._stale = True

    def _schedule_drop(self, uri: str) -> None:
        if uri in self._dropping or self._closed or not _can_subscribe(self._capabilities):
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
            async with self.subscriptions.lock:
                if self.subscriptions.subscribed(uri) or not self.connected:
                    return
                async with self.lease() as (session, _gen):
                    with anyio.fail_after(self._connect_timeout):
                        request = UnsubscribeRequest(params=UnsubscribeRequestParams(uri=uri))
                        await session.send_request(request, EmptyResult)
        except Exception as exc:
            log.debug("bot %s: unsubscribing from %s failed: %s", self.uid[:8], uri, _describe(exc))
        finally:
            self._dropping.discard(uri)

    async def _resubscribe(self, gen: int) -> None:
        """Subscribe a new session (generation ``gen``) to every URI agents
        still watch: the bot forgot the old session's subscriptions."""
        try:
            async with self.subscriptions.lock, self.lease() as (session, current):
                if current != gen:
                    return
                for uri in self.subscriptions.uris():
                    request = SubscribeRequest(params=SubscribeRequestParams(uri=uri))
                    try:
                        with anyio.fail_after(self._connect_timeout):
                            await session.send_request(request, EmptyResult)
                    except MCPError as exc:
                        if exc.error.code in TRANSPORT_ERROR_CODES:
                            raise
                        log.info("bot %s: re-subscribing to %s refused: %s", self.uid[:8], uri, exc)
        except Exception as exc:
            log.info("bot %s: re-subscribing resources failed: %s", self.uid[:8], _describe(exc))


def _can_subscribe(capabilities: ServerCapabilities | None) -> bool:
    resources = capabilities.resources if capabilities is not None else None
    return resources is not None and bool(resources.subscribe)


async def _list_all(session: ClientSession) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        params = PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        page = await session.send_request(ListToolsRequest(params=params), ListToolsResult)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "no answer from the bot"
    return str(exc) or type(exc).__name__
