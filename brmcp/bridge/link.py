"""One bot link: the single BR session to a bot that every local HTTP session
for that bot shares (go-brmcp.md §4.4).

A link dials the bot over the bridge's client-role router and opens an MCP
client session in the bot's era (BRIDGE.md §Eras and snapshots):

* **modern** (2026-07-28) — no initialize: the session is ready at once and
  every request carries its own envelope, so the first request to a bot is
  answered in one round trip. A bot whose era is unknown is tried this way
  first; a handshake-only answer (the Go reference, older SDKs) switches
  the link to the handshake era, and the era is remembered;
* **handshake** — ``initialize`` first (2-minute limit), as the reference.

The link keeps a snapshot of the bot's tools, era and capabilities, persisted
per bot (:mod:`.snapshots`) so that after a restart ``tools/list`` is served
from it with no PM; a remembered snapshot is refreshed in the background
after the first request that reaches the bot, and whenever the bot sends
``notifications/tools/list_changed`` (relayed to the agents once the
snapshot is fresh). A transport failure *resets* the link: the next user
dials a fresh session (new sid). Calls still in flight on the old session
finish on it; it is closed when the last one is done.

The link also carries the bot's change notifications: resource updates and
list changes go to the agent sessions that asked for them
(:mod:`.subscriptions`), and a new session re-subscribes the bot to every
URI agents still watch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
from mcp import ClientSession
from mcp.client.session import IncomingMessage
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    DiscoverResult,
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
    ToolsCapability,
    UnsubscribeRequest,
    UnsubscribeRequestParams,
)
from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION

from ..conn import Conn
from ..payment import PRICE_ATOMS_KEY
from ..router import Router
from .relay import Relay
from .snapshots import ERA_HANDSHAKE, ERA_MODERN, BotSnapshot, Era, SnapshotStore
from .subscriptions import Subscriptions

__all__ = ["CAPABILITIES_META_KEY", "MAX_PENDING_DROPS", "TRANSPORT_ERROR_CODES", "BotLink", "LinkError"]

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
#: ``tools/list`` result ``_meta`` key under which a brmcp harness states, on
#: modern-era sessions, the capabilities it would declare (WIRE.md §Eras):
#: it spares the ``server/discover`` round trip.
CAPABILITIES_META_KEY = "brmcp/capabilities"
#: Seconds a remembered snapshot's background refresh waits after the
#: request that triggered it (so it never competes with that request).
REFRESH_DELAY = 1.0
#: What a bot whose capabilities are unknown is assumed to serve.
_TOOLS_ONLY = ServerCapabilities(tools=ToolsCapability(list_changed=False))


class LinkError(Exception):
    """The bot could not be reached: dialing, initialize or tools/list failed."""


class _Session:
    __slots__ = ("conn", "done", "era", "error", "gen", "ready", "retired", "session", "stop", "users")

    def __init__(self, gen: int, conn: Conn, era: Era) -> None:
        self.gen = gen
        self.conn = conn
        self.era: Era = era
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
    session tasks; ``client_info`` is sent in initialize (and in every
    modern envelope). ``store`` persists the snapshot (None: memory only);
    ``snapshot`` is the one remembered from an earlier run; ``clock``
    gives unix seconds for its ``updated`` stamp."""

    def __init__(
        self,
        uid: str,
        router: Router,
        task_group: anyio.abc.TaskGroup,
        client_info: Implementation,
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        store: SnapshotStore | None = None,
        snapshot: BotSnapshot | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.uid = uid
        self._router = router
        self._tg = task_group
        self._client_info = client_info
        self._connect_timeout = connect_timeout
        self._store = store
        self._clock = clock
        self._current: _Session | None = None
        self._gen = 0
        self._lock = anyio.Lock()
        self._snapshot_lock = anyio.Lock()
        self._tools: list[Tool] | None = None
        self._by_name: dict[str, Tool] = {}
        self._stale = True
        self._closed = False
        self._capabilities: ServerCapabilities | None = None
        #: The bot's era: None until known (the next session tries modern).
        self._era: Era | None = None
        self._era_confirmed = False
        #: A remembered snapshot waits for its first background refresh.
        self._refresh_wanted = False
        self._refreshing = False
        self._announce = False
        #: The bot said its tool list changed: fetch before serving it.
        self._changed = False
        self._dropping: set[str] = set()
        #: Sessions dialed so far (observability and tests).
        self.dials = 0
        #: Refreshes of the tool snapshot that reached the bot.
        self.refreshes = 0
        if snapshot is not None:
            self._era = snapshot.era
            self._era_confirmed = True
            self._capabilities = snapshot.capabilities
            self._install_tools(snapshot.tools)
            self._refresh_wanted = True
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
            if self._refresh_wanted and not self._closed:
                self._start_refresh()

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
                state = _Session(self._gen, conn, self._era or ERA_MODERN)
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
            modern = state.era == ERA_MODERN
            async with ClientSession(
                conn.read_stream,
                conn.write_stream,
                client_info=self._client_info,
                logging_callback=relay.on_log,
                sampling_callback=relay.on_sampling,
                elicitation_callback=relay.on_elicitation,
                message_handler=self._on_bot_message,
                # 2026-07-28 logging is opt-in per request: take every level,
                # the relay filters per agent.
                log_level="debug" if modern else None,
            ) as s:
                if modern:
                    # No initialize: the first request carries the envelope.
                    s.adopt(_modern_discover(self._capabilities))
                    capabilities = self._capabilities
                else:
                    with anyio.fail_after(self._connect_timeout):
                        result = await s.initialize()
                    capabilities = result.capabilities
                    if self._current is state:
                        self._capabilities = capabilities
                state.session = s
                state.ready.set()
                if not modern and self.subscriptions.uris() and _can_subscribe(capabilities):
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
    def era(self) -> Era | None:
        """The bot's era as far as known (None: not yet contacted)."""
        return self._era

    def session_era(self, gen: int) -> Era | None:
        """The era of session generation ``gen`` (None when it is gone)."""
        state = self._current
        return state.era if state is not None and state.gen == gen else None

    def era_refused(self, exc: BaseException, gen: int, *, probe: bool = False) -> bool:
        """True when ``exc``, the bot's answer to a request on session
        ``gen``, says the bot does not take modern-era requests (handshake
        only), or that the request needs the handshake era (a server
        request back-channel, resource subscriptions). The link then
        switches to the handshake era (remembered) and resets, so the caller
        may send the request again. ``probe``: the request was a
        ``tools/list``, so any invalid-request/params answer counts."""
        state = self._current
        if state is None or state.gen != gen or state.era != ERA_MODERN:
            return False
        if not _handshake_only(exc, probe=probe):
            return False
        self.require_handshake(gen)
        return True

    def require_handshake(self, gen: int | None = None) -> None:
        """Use the handshake era with this bot from now on (persisted with
        the next snapshot) and reset the link so the next use initializes."""
        if self._era != ERA_HANDSHAKE:
            log.info("bot %s: using the handshake era", self.uid[:8])
        self._era = ERA_HANDSHAKE
        self._era_confirmed = True
        self.reset(gen)
        self._schedule_save()

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

    def fixed_price(self, name: str) -> int | None:
        """The fixed price of tool ``name`` in atoms from the snapshot's
        ``brmcp/priceAtoms`` (a whole number > 0), else None (free,
        dynamic, unknown)."""
        tool = self._by_name.get(name)
        meta = tool.meta if tool is not None else None
        value = meta.get(PRICE_ATOMS_KEY) if isinstance(meta, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if isinstance(value, float) and not value.is_integer():
            return None
        price = int(value)
        return price if price > 0 else None

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in a task the bridge owns (cancelled when it closes)."""
        self._tg.start_soon(fn, *args)

    @property
    def stale(self) -> bool:
        """True when the snapshot is not known to be current: the link was
        reset or restarted (it is served and refreshed in the background),
        or the bot said its tool list changed (:meth:`refresh` fetches it
        before answering)."""
        return self._stale or self._changed

    def _install_tools(self, tools: list[Tool]) -> None:
        self._tools = tools
        self._by_name = {t.name: t for t in tools}

    async def refresh(self) -> list[Tool]:
        """Return the tool snapshot. With none yet it is fetched with
        ``tools/list`` (one round trip unless the bot paginates; on a first
        contact this request also tells the bot's era). A snapshot that is
        stale (remembered from an earlier run, or taken on a session since
        reset) is returned as it is and refreshed in the background after
        the next request that reaches the bot. Raises :class:`LinkError`."""
        if self._tools is not None and not self._changed:
            if self._stale and self._era_confirmed:
                self._refresh_wanted = True
                if self._era == ERA_HANDSHAKE and not self.connected:
                    # Any request needs the handshake first: open the session
                    # now, so its initialize refreshes the capabilities.
                    async with self.lease():
                        pass
            if not self._stale or self._era_confirmed:
                return self._tools
        async with self._snapshot_lock:
            if self._tools is not None and not self._changed and (not self._stale or self._era_confirmed):
                return self._tools
            return await self._fetch()

    async def _fetch(self) -> list[Tool]:
        """``tools/list`` now (holding the snapshot lock), switching to the
        handshake era once when the bot refuses the modern request."""
        for _attempt in range(3):
            async with self.lease() as (session, gen):
                era = self.session_era(gen) or ERA_HANDSHAKE
                try:
                    with anyio.fail_after(self._connect_timeout):
                        declared = self._capabilities if era == ERA_HANDSHAKE else None
                        # A bot without tools (a resources-only server) has none to list.
                        tools: list[Tool]
                        stated: ServerCapabilities | None
                        if declared is not None and declared.tools is None:
                            tools, stated = [], None
                        else:
                            try:
                                tools, stated = await _list_all(session)
                            except MCPError as exc:
                                if era != ERA_MODERN or exc.error.code != METHOD_NOT_FOUND:
                                    raise
                                # A modern bot without tools: ask what it serves.
                                raw = await session.send_discover(LATEST_MODERN_VERSION)
                                tools, stated = [], DiscoverResult.model_validate(raw).capabilities
                except Exception as exc:
                    if self.era_refused(exc, gen, probe=True):
                        continue
                    self.reset(gen)
                    raise LinkError(f"tools/list: {_describe(exc)}") from exc
                self.refreshes += 1
                changed = self._era != era or not self._era_confirmed
                self._era = era
                self._era_confirmed = True
                if era == ERA_MODERN:
                    capabilities = stated if stated is not None else self._capabilities or _TOOLS_ONLY
                    if capabilities != self._capabilities:
                        self._capabilities = capabilities
                        changed = True
                    if _pushes(capabilities):
                        # Resource updates and list changes need the handshake
                        # era's standing session (2026-07-28 has none over BR),
                        # and a bot tells list changes to sessions that listed:
                        # list again there.
                        self.require_handshake(gen)
                        continue
                changed = changed or tools != self._tools
                current = self._current
                self._install_tools(tools)
                self._stale = current is None or current.gen != gen
                self._changed = False
                self._refresh_wanted = False
                if changed:
                    self._schedule_save()
            return tools
        raise LinkError("tools/list: the bot refused both eras")

    def _start_refresh(self) -> None:
        """Refresh the snapshot in a background task (once at a time)."""
        if self._refreshing:
            return
        self._refreshing = True
        self._refresh_wanted = False
        self._tg.start_soon(self._background_refresh, name=f"brmcp-bridge-refresh-{self.uid[:8]}")

    async def _background_refresh(self) -> None:
        try:
            if not self._announce:
                # Let the request that triggered it be answered first.
                await anyio.sleep(REFRESH_DELAY)
            before = self._tools
            async with self._snapshot_lock:
                await self._fetch()
            if self._announce or before != self._tools:
                self._announce = False
                await self.subscriptions.broadcast(ToolListChangedNotification())
        except Exception as exc:
            log.info("bot %s: background tools/list failed: %s", self.uid[:8], _describe(exc))
        finally:
            self._refreshing = False

    def snapshot(self) -> BotSnapshot | None:
        """What would be persisted now (None before the era is known)."""
        if self._era is None or self._tools is None:
            return None
        version = LATEST_MODERN_VERSION if self._era == ERA_MODERN else LATEST_HANDSHAKE_VERSION
        return BotSnapshot(
            bot=self.uid,
            era=self._era,
            protocol_version=version,
            capabilities=self._capabilities,
            tools=list(self._tools),
            updated=int(self._clock()),
        )

    def _schedule_save(self) -> None:
        store, snapshot = self._store, self.snapshot()
        if store is None or snapshot is None or self._closed:
            return
        self._tg.start_soon(_save, store, snapshot)

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
            # a prices.json reload): refreshed at once, then relayed, so
            # agents that re-list get the new tools.
            self._changed = True
            self._announce = True
            self._start_refresh()

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


async def _list_all(session: ClientSession) -> tuple[list[Tool], ServerCapabilities | None]:
    """Every page of ``tools/list``, and the capabilities a brmcp harness
    states in the first page's ``_meta`` (None when absent or invalid)."""
    tools: list[Tool] = []
    stated: ServerCapabilities | None = None
    cursor: str | None = None
    for page_no in range(_MAX_PAGES):
        params = PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        page = await session.send_request(ListToolsRequest(params=params), ListToolsResult)
        if page_no == 0:
            stated = _stated_capabilities(page.meta)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools, stated


def _pushes(capabilities: ServerCapabilities) -> bool:
    """True when a bot serves resources or prompts, or declares that its
    tool list changes: it may send notifications unasked (resource updates,
    list changes), which only a handshake-era session carries over BR. (A
    modern ``server/discover`` reports its subscribe and listChanged flags
    for ``subscriptions/listen`` only, so they cannot tell.)"""
    tools = capabilities.tools
    return (
        capabilities.resources is not None
        or capabilities.prompts is not None
        or (tools is not None and bool(tools.list_changed))
    )


def _stated_capabilities(meta: Any) -> ServerCapabilities | None:
    raw = meta.get(CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
    if not isinstance(raw, dict):
        return None
    try:
        return ServerCapabilities.model_validate(raw)
    except ValueError:
        return None


def _modern_discover(capabilities: ServerCapabilities | None) -> DiscoverResult:
    """What a modern session adopts instead of asking ``server/discover``."""
    return DiscoverResult(
        supported_versions=[LATEST_MODERN_VERSION],
        capabilities=capabilities or _TOOLS_ONLY,
        result_type="complete",
        ttl_ms=0,
        cache_scope="public",
    )


#: Words in a bot's error that mean "this request needs the handshake era".
_HANDSHAKE_HINTS = ("initializ", "handshake", "back-channel")


def _handshake_only(exc: BaseException, *, probe: bool) -> bool:
    """See :meth:`BotLink.era_refused`."""
    if not isinstance(exc, MCPError) or exc.error.code in TRANSPORT_ERROR_CODES:
        return False
    message = exc.error.message.lower()
    if any(hint in message for hint in _HANDSHAKE_HINTS):
        return True
    return probe and exc.error.code in (INVALID_REQUEST, INVALID_PARAMS, 0)


async def _save(store: SnapshotStore, snapshot: BotSnapshot) -> None:
    try:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(store.save, snapshot)
    except OSError as exc:
        log.warning("bot %s: snapshot not written: %s", snapshot.bot[:8], exc)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "no answer from the bot"
    return str(exc) or type(exc).__name__
