"""A bot link's snapshot of the bot's tools (BRIDGE.md §Eras and
snapshots): served to agents without a PM when it is known, fetched with
``tools/list`` when it is not, refreshed in the background when it is stale
or old or the bot said its tools changed, looked up again when an agent's
call disagrees with it, and persisted per bot (:mod:`.snapshots`).
:class:`ToolsMixin` gives :class:`~.link.BotLink` these methods.

Every bot is a stranger (SECURITY.md "The bridge against a hostile bot"): a
tool list over :data:`MAX_TOOL_PAGES`, :data:`MAX_TOOLS`,
:data:`MAX_TOOL_BYTES` or :data:`MAX_TOOL_LIST_BYTES` is refused as a whole
(:class:`ToolListTooLarge`; the snapshot in force stays, nothing is
persisted), and background refreshes, whatever makes them (a flood of
``notifications/tools/list_changed``), are coalesced: one in flight, at
most one more queued, and at most one per :data:`RELIST_INTERVAL` seconds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import (
    METHOD_NOT_FOUND,
    DiscoverResult,
    ListToolsRequest,
    ListToolsResult,
    PaginatedRequestParams,
    ServerCapabilities,
    Tool,
    ToolListChangedNotification,
)
from mcp_types.version import LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION

from .._ops.clock import Clock
from ..protocol.eras import CAPABILITIES_META_KEY
from ..protocol.payment import PRICE_ATOMS_KEY
from ._eras import _TOOLS_ONLY, _pushes
from ._linkbase import (
    MAX_TOOL_BYTES,
    MAX_TOOL_LIST_BYTES,
    MAX_TOOL_PAGES,
    MAX_TOOLS,
    LinkError,
    ToolListBudget,
    ToolListTooLarge,
    _describe,
    _Session,
    json_bytes,
    log,
    no_answer_hint,
)
from .retry import RetryPolicy
from .snapshots import ERA_HANDSHAKE, ERA_MODERN, BotSnapshot, Era, ListedTools, SnapshotStore
from .subscriptions import Subscriptions

__all__ = [
    "MAX_TOOLS",
    "MAX_TOOL_BYTES",
    "MAX_TOOL_LIST_BYTES",
    "MAX_TOOL_PAGES",
    "RECHECK_INTERVAL",
    "REFRESH_DELAY",
    "RELIST_INTERVAL",
    "SNAPSHOT_MAX_AGE",
    "ToolListTooLarge",
    "ToolsMixin",
]

#: Seconds a remembered snapshot's background refresh waits after the
#: request that triggered it (so it never competes with that request).
REFRESH_DELAY = 1.0
#: Least seconds between two look-ups at the bot caused by a snapshot that
#: disagrees with an agent's call (:meth:`BotLink.doubt_tools`).
RECHECK_INTERVAL = 10.0
#: Seconds after which a snapshot served to an agent is refreshed in the
#: background (a bot that restarted with other tools sends no list change;
#: an agent that only lists would otherwise never see them).
SNAPSHOT_MAX_AGE = 300.0
#: Least seconds between the starts of two background refreshes of one
#: bot's snapshot, on the link's clock. A bot may send
#: ``notifications/tools/list_changed`` at any rate; each costs the bot's
#: ``tools/list`` (up to :data:`MAX_TOOL_PAGES` pages of it) and a
#: notification to every agent session, so they are coalesced instead: the
#: first after a quiet spell is fetched at once, the ones that arrive while
#: it is fetched or waited for make one more, this many seconds after it.
#: A real bot changes its tools on an operator's reload, minutes apart.
RELIST_INTERVAL = 10.0


class ToolsMixin:
    """The tools snapshot of :class:`~.link.BotLink`, which sets the state
    declared here (in its constructor) and defines the methods declared
    under TYPE_CHECKING."""

    uid: str
    #: Refreshes of the tool snapshot that reached the bot.
    refreshes: int
    subscriptions: Subscriptions
    _tg: anyio.abc.TaskGroup
    _store: SnapshotStore | None
    _clock: Callable[[], float]
    _timer_clock: Clock | None
    _retry: RetryPolicy
    _connect_timeout: float
    _own_uid: str | None
    _current: _Session | None
    _snapshot_lock: anyio.Lock
    _tools: list[Tool] | None
    _by_name: dict[str, Tool]
    _stale: bool
    _closed: bool
    _capabilities: ServerCapabilities | None
    _era: Era | None
    _era_confirmed: bool
    _refresh_wanted: bool
    _refreshing: bool
    _announce: bool
    _changed: bool
    _doubted_at: float | None
    _fetched_at: float | None
    #: Set by :meth:`_install_tools` (defaults until the first snapshot).
    _marks_refusals: bool = False
    _tools_bytes: int = 0
    #: When the last background refresh asked the bot (link clock, s).
    _relisted_at: float | None = None
    #: :meth:`doubt_tools` asked for a look-up that has not happened yet.
    _doubted: bool = False

    if TYPE_CHECKING:

        def lease(self) -> AbstractAsyncContextManager[tuple[ClientSession, int]]: ...

        def reset(self, gen: int | None = None) -> bool: ...

        def session_era(self, gen: int) -> Era | None: ...

        def era_refused(self, exc: BaseException, gen: int, *, probe: bool = False) -> bool: ...

        def require_handshake(self, gen: int | None = None) -> None: ...

        @property
        def connected(self) -> bool: ...

    @property
    def tools(self) -> list[Tool] | None:
        """The last snapshot (None before the first one), possibly stale."""
        return self._tools

    @property
    def marks_refusals(self) -> bool:
        """True when the tool list in force said ``"brmcp/marksRefusals":
        true`` in its ``_meta`` (the first ``tools/list`` page's, or the
        first-contact ``brmcp/tools`` object's; persisted with the
        snapshot): the bot marks its genuine ``payment_required`` refusals
        with ``brmcp/refusal``, so an unmarked refusal-shaped result from it
        is tool output (:data:`brmcp.protocol.payment.MARKS_REFUSALS_KEY`). It stays
        true until a list without the mark replaces the snapshot; a refused
        list (over a bound) changes nothing."""
        return self._marks_refusals

    @property
    def tools_bytes(self) -> int:
        """UTF-8 bytes of the JSON of the snapshot's tools (each as on the
        wire and in the snapshot file; 0 before the first snapshot): what
        the link holds. At most :data:`MAX_TOOL_LIST_BYTES` for a list
        fetched from the bot; one read from a snapshot file is bounded by
        :data:`~.snapshots.MAX_SNAPSHOT_BYTES`."""
        return self._tools_bytes

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

    @property
    def stale(self) -> bool:
        """True when the snapshot is not known to be current: the link was
        reset or restarted (it is served and refreshed in the background),
        or the bot said its tool list changed (:meth:`refresh` fetches it
        before answering, unless a background refresh is under way)."""
        return self._stale or self._changed

    def doubt_tools(self) -> bool:
        """The snapshot may be wrong: an agent called a tool it lacks, or the
        bot answered that it does not know a tool it lists. A bot that
        restarted with other tools (a new brmcp-serve, a gateway in front of
        another upstream) forgets the bridge's session and sends no
        ``notifications/tools/list_changed``, so nothing else would tell.
        The next :meth:`refresh` then fetches ``tools/list`` before answering
        (one round trip), at most once per :data:`RECHECK_INTERVAL` seconds
        so an agent repeating an unknown name costs no more. Returns True
        when it will."""
        now = anyio.current_time()
        if self._doubted_at is not None and now - self._doubted_at < RECHECK_INTERVAL:
            return False
        self._doubted_at = now
        self._changed = True
        self._doubted = True
        return True

    def _install_tools(self, tools: list[Tool]) -> None:
        """Put ``tools`` in force; a :class:`ListedTools` (what a fetch, a
        first contact and a snapshot file give) brings ``marks_refusals``,
        a plain list means no mark."""
        self._tools = tools
        self._by_name = {t.name: t for t in tools}
        self._marks_refusals = isinstance(tools, ListedTools) and tools.marks_refusals
        self._tools_bytes = sum(json_bytes(t) for t in tools)

    async def refresh(self) -> list[Tool]:
        """Return the tool snapshot. With none yet it is fetched with
        ``tools/list`` (one round trip unless the bot paginates; on a first
        contact this request also tells the bot's era). A snapshot that is
        stale (remembered from an earlier run, or taken on a session since
        reset) is returned as it is and refreshed in the background after
        the next request that reaches the bot; so is one fetched more than
        :data:`SNAPSHOT_MAX_AGE` seconds ago (the agents get
        ``notifications/tools/list_changed`` when it differed). A snapshot
        the bot announced a change of is returned as it is while a
        background refresh is under way or waiting out
        :data:`RELIST_INTERVAL` (it tells the agents when it lands), unless
        :meth:`doubt_tools` asked for a look-up. Raises :class:`LinkError`
        (:class:`ToolListTooLarge` for a list over a bound: the snapshot in
        force, if any, stays and is served from then on)."""
        if self._tools is not None and self._changed and self._refreshing and not self._doubted:
            return self._tools
        if self._tools is not None and not self._changed:
            fetched = self._fetched_at
            if (
                not self._stale
                and fetched is not None
                and anyio.current_time() - fetched > SNAPSHOT_MAX_AGE
                and not self._closed
            ):
                # Served as it is; checked at the bot in the background, and
                # the agents told (tools/list_changed) when it differs.
                self._start_refresh()
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
                # A modern session is ready at once: its first request is what
                # finds out whether the bot answers at all (as initialize does).
                limit = (
                    min(self._retry.answer_timeout, self._connect_timeout)
                    if era == ERA_MODERN
                    else self._connect_timeout
                )
                try:
                    with anyio.fail_after(limit):
                        declared = self._capabilities if era == ERA_HANDSHAKE else None
                        # A bot without tools (a resources-only server) has none to list.
                        tools: list[Tool]
                        stated: ServerCapabilities | None
                        if declared is not None and declared.tools is None:
                            tools, stated = ListedTools(), None
                        else:
                            current = self._current
                            prefetched = (
                                current.prefetched if current is not None and current.gen == gen else None
                            )
                            try:
                                if prefetched is not None:
                                    # The first contact brought them: no PM.
                                    assert current is not None
                                    current.prefetched = None
                                    tools, stated = prefetched, None
                                else:
                                    tools, stated = await _list_all(session)
                            except MCPError as exc:
                                if era != ERA_MODERN or exc.error.code != METHOD_NOT_FOUND:
                                    raise
                                # A modern bot without tools: ask what it serves.
                                raw = await session.send_discover(LATEST_MODERN_VERSION)
                                tools = ListedTools()
                                stated = DiscoverResult.model_validate(raw).capabilities
                except ToolListTooLarge as exc:
                    # Refused as a whole; the snapshot in force stays (served,
                    # not asked for again by every request) and the session is
                    # kept (the bot answered, only too much).
                    log.warning("bot %s: %s", self.uid[:8], exc)
                    if self._tools is not None:
                        self._changed = self._doubted = False
                    raise
                except TimeoutError:
                    if era != ERA_MODERN:
                        self.reset(gen)
                        raise LinkError("tools/list: no answer from the bot") from None
                    # Kept: the request may still reach a bot that comes back.
                    raise LinkError(no_answer_hint(self.uid, limit, self._own_uid)) from None
                except Exception as exc:
                    if self.era_refused(exc, gen, probe=True):
                        continue
                    self.reset(gen)
                    raise LinkError(f"tools/list: {_describe(exc)}") from exc
                self.refreshes += 1
                self._fetched_at = anyio.current_time()
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
                marks = isinstance(tools, ListedTools) and tools.marks_refusals
                changed = changed or tools != self._tools or marks != self._marks_refusals
                current = self._current
                self._install_tools(tools)
                self._stale = current is None or current.gen != gen
                self._changed = self._doubted = False
                self._refresh_wanted = False
                if changed:
                    self._schedule_save()
            return tools
        raise LinkError("tools/list: the bot refused both eras")

    def _start_refresh(self) -> None:
        """Refresh the snapshot in a background task (one at a time). Called
        while one runs, it does nothing more: a ``tools/list_changed``
        (which sets ``_announce`` first) is taken by the running task, which
        refreshes once more after it, :data:`RELIST_INTERVAL` seconds after
        its own start."""
        if self._refreshing:
            return
        self._refreshing = True
        self._refresh_wanted = False
        self._tg.start_soon(self._background_refresh, name=f"brmcp-bridge-refresh-{self.uid[:8]}")

    async def _background_refresh(self) -> None:
        """Refresh rounds: each fetches ``tools/list`` and tells the agents
        (``tools/list_changed``) when the bot announced a change or the list
        differs; another round follows while the bot announced a change
        during one. A failed round ends it (logged), the announcement kept
        for the next."""
        now, sleep = self._timer()
        try:
            while not self._closed:
                announce = self._announce
                if not announce:
                    # Let the request that triggered it be answered first.
                    await anyio.sleep(REFRESH_DELAY)
                last = self._relisted_at
                if last is not None:
                    # Never more than RELIST_INTERVAL, even if the clock went back.
                    wait = min(last + RELIST_INTERVAL - now(), RELIST_INTERVAL)
                    if wait > 0:
                        await sleep(wait)
                announce = announce or self._announce
                self._announce = False
                self._relisted_at = now()
                before = self._tools
                try:
                    async with self._snapshot_lock:
                        await self._fetch()
                except Exception as exc:
                    self._announce = self._announce or announce
                    if not isinstance(exc, ToolListTooLarge):  # already logged
                        log.info("bot %s: background tools/list failed: %s", self.uid[:8], _describe(exc))
                    return
                if self._announce:
                    # Announced again while it was fetched: an agent that lists
                    # meanwhile asks the bot itself; this task refreshes later.
                    self._changed = True
                if announce or before != self._tools:
                    await self.subscriptions.broadcast(ToolListChangedNotification())
                if not self._announce:
                    return
        finally:
            self._refreshing = False

    def _timer(self) -> tuple[Callable[[], float], Callable[[float], Awaitable[None]]]:
        """``(now, sleep)`` of the link's timer (the bridge's
        :class:`~.clock.Clock`; a test's :class:`~.clock.ManualClock`), else
        anyio's monotonic clock."""
        timer = self._timer_clock
        if timer is not None:
            return timer.now, timer.sleep
        return anyio.current_time, anyio.sleep

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
            tools=self._tools,
            updated=int(self._clock()),
            marks_refusals=self._marks_refusals,
        )

    def _schedule_save(self) -> None:
        store, snapshot = self._store, self.snapshot()
        if store is None or snapshot is None or self._closed:
            return
        self._tg.start_soon(_save, store, snapshot)


async def _list_all(session: ClientSession) -> tuple[ListedTools, ServerCapabilities | None]:
    """Every page of ``tools/list`` (with the first page's
    ``brmcp/marksRefusals``), and the capabilities a brmcp harness states
    in the first page's ``_meta`` (None when absent or invalid). Each page
    is counted as it arrives (:class:`ToolListBudget`; the stated
    capabilities are in the page's JSON), so a list over a bound stops
    being fetched at the page that goes over: raises
    :class:`ToolListTooLarge`."""
    budget = ToolListBudget("tools/list")
    stated: ServerCapabilities | None = None
    cursor: str | None = None
    while True:
        params = PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        page = await session.send_request(ListToolsRequest(params=params), ListToolsResult)
        budget.page(page)
        if budget.pages == 1:
            stated = _stated_capabilities(page.meta)
        cursor = page.next_cursor
        if not cursor:
            return budget.result(), stated
        budget.more()


def _stated_capabilities(meta: Any) -> ServerCapabilities | None:
    raw = meta.get(CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
    if not isinstance(raw, dict):
        return None
    try:
        return ServerCapabilities.model_validate(raw)
    except ValueError:
        return None


async def _save(store: SnapshotStore, snapshot: BotSnapshot) -> None:
    try:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(store.save, snapshot)
    except (OSError, ValueError) as exc:  # ValueError: over MAX_SNAPSHOT_BYTES
        log.warning("bot %s: snapshot not written: %s", snapshot.bot[:8], exc)
