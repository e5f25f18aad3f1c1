"""A bot link's snapshot of the bot's tools (BRIDGE.md §Eras and
snapshots): served to agents without a PM when it is known, fetched with
``tools/list`` when it is not, refreshed in the background when it is stale
or old or the bot said its tools changed, looked up again when an agent's
call disagrees with it, and persisted per bot (:mod:`.snapshots`).
:class:`ToolSnapshot` is that snapshot, a component each
:class:`~.link.BotLink` owns: it also holds what else is persisted of the
bot (its era and capabilities), and reaches the bot through the link's
sessions (:class:`~._linkbase.SnapshotSessions`).

Every bot is a stranger (SECURITY.md "The bridge against a hostile bot"): a
tool list over :data:`MAX_TOOL_PAGES`, :data:`MAX_TOOLS`,
:data:`MAX_TOOL_BYTES` or :data:`MAX_TOOL_LIST_BYTES` is refused as a whole
(:class:`ToolListTooLarge`; the snapshot in force stays, nothing is
persisted), and background refreshes, whatever makes them (a flood of
``notifications/tools/list_changed``), are coalesced: one in flight, at
most one more queued, and at most one per :data:`RELIST_INTERVAL` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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

from brmcp._ops.clock import Clock
from brmcp.protocol.eras import CAPABILITIES_META_KEY
from brmcp.protocol.payment import PRICE_ATOMS_KEY

from ._eras import TOOLS_ONLY, pushes_unasked
from ._linkbase import (
    MAX_TOOL_BYTES,
    MAX_TOOL_LIST_BYTES,
    MAX_TOOL_PAGES,
    MAX_TOOLS,
    TRANSPORT_ERROR_CODES,
    HostOffline,
    LinkError,
    SnapshotSessions,
    ToolListBudget,
    ToolListTooLarge,
    describe_failure,
    json_bytes,
    log,
    no_answer_hint,
)
from ._retry import RetryPolicy
from ._snapshots import ERA_HANDSHAKE, ERA_MODERN, BotSnapshot, Era, ListedTools
from ._subscriptions import Subscriptions

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
    "ToolSnapshot",
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


def _nothing() -> None:
    return None


class ToolSnapshot:
    """The tools snapshot of one bot link, with the rest of what is known
    (and persisted) of the bot: its era and capabilities.

    ``uid`` is the bot's; ``sessions`` the link's sessions
    (:class:`~._linkbase.SnapshotSessions`), through which ``tools/list`` is
    asked; ``task_group`` owns the background refreshes; ``subscriptions``
    are told ``notifications/tools/list_changed`` when the tools changed;
    ``clock`` (the bridge's :class:`~brmcp._ops.clock.Clock`) stamps
    :meth:`record` (``updated``, unix seconds) and paces the background
    refreshes (:data:`RELIST_INTERVAL`); ``retry`` and ``connect_timeout``
    bound a ``tools/list`` (seconds); ``remembered`` is the snapshot of an
    earlier run (served until refreshed); ``on_change`` is called whenever
    what :meth:`record` returns changed and should be persisted."""

    def __init__(
        self,
        uid: str,
        sessions: SnapshotSessions,
        task_group: anyio.abc.TaskGroup,
        subscriptions: Subscriptions,
        *,
        clock: Clock,
        retry: RetryPolicy,
        connect_timeout: float,
        remembered: BotSnapshot | None = None,
        on_change: Callable[[], None] = _nothing,
    ) -> None:
        self.uid = uid
        self._sessions = sessions
        self._tg = task_group
        self._subscriptions = subscriptions
        self._clock = clock
        self._retry = retry
        self._connect_timeout = connect_timeout
        self._on_change = on_change
        self._lock = anyio.Lock()
        #: The bot's era: None until known (the link's next session tries modern).
        self.era: Era | None = None
        #: The era was told by the bot (or remembered), not guessed.
        self.era_confirmed = False
        #: The capabilities the bot declared (None before the first answer).
        self.capabilities: ServerCapabilities | None = None
        #: Refreshes of the tool snapshot that reached the bot.
        self.refreshes = 0
        self._tools: list[Tool] | None = None
        self._by_name: dict[str, Tool] = {}
        self._marks_refusals = False
        self._tools_bytes = 0
        self._stale = True
        #: A remembered snapshot waits for its first background refresh.
        self._refresh_wanted = False
        self._refreshing = False
        self._announce = False
        #: The bot said its tool list changed: fetch before serving it.
        self._changed = False
        #: When :meth:`doubt_tools` last asked for a look-up (monotonic s).
        self._doubted_at: float | None = None
        #: :meth:`doubt_tools` asked for a look-up that has not happened yet.
        self._doubted = False
        #: When the snapshot was last fetched from the bot (monotonic s).
        self._fetched_at: float | None = None
        #: When the last background refresh asked the bot (``clock``, s).
        self._relisted_at: float | None = None
        if remembered is not None:
            self.era = remembered.era
            self.era_confirmed = True
            self.capabilities = remembered.capabilities
            self._install_tools(remembered.tools)
            self._refresh_wanted = True

    def mark_stale(self) -> None:
        """The link's session was reset, redialed or closed: the snapshot is
        served as it is and refreshed in the background (:meth:`refresh`)."""
        self._stale = True

    def after_lease(self) -> None:
        """A request of the link reached the bot: a remembered snapshot's
        first background refresh starts now (unless the link is closed)."""
        if self._refresh_wanted and not self._sessions.closed:
            self._start_refresh()

    def list_changed(self) -> None:
        """The bot sent ``notifications/tools/list_changed``: refresh at once
        (coalesced, :data:`RELIST_INTERVAL`), then tell the agents."""
        self._changed = True
        self._announce = True
        self._start_refresh()

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
        """The snapshot's tool ``name`` (None: not listed)."""
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
                and not self._sessions.closed
            ):
                # Served as it is; checked at the bot in the background, and
                # the agents told (tools/list_changed) when it differs.
                self._start_refresh()
            if self._stale and self.era_confirmed:
                self._refresh_wanted = True
                if self.era == ERA_HANDSHAKE and not self._sessions.connected:
                    # Any request needs the handshake first: open the session
                    # now, so its initialize refreshes the capabilities.
                    async with self._sessions.lease():
                        pass
            if not self._stale or self.era_confirmed:
                return self._tools
        async with self._lock:
            if self._tools is not None and not self._changed and (not self._stale or self.era_confirmed):
                return self._tools
            before = self._tools
            tools = await self._fetch()
        if before is not None and tools != before and not self._sessions.closed:
            # Fetched for a call or a list that found the snapshot wrong (a
            # bot restarted with other tools sends no list change): the
            # agents that listed the old tools hear of the new ones, and of
            # their prices, as after a list change the bot announced.
            self._tg.start_soon(self._subscriptions.broadcast, ToolListChangedNotification())
        return tools

    async def _fetch(self) -> list[Tool]:
        """``tools/list`` now (holding the snapshot lock), switching to the
        handshake era once when the bot refuses the modern request, and
        asking once more on a fresh session when the bot answers it with an
        error (a bot restarted, or another program on its identity, forgets
        the handshake session: its SDK refuses a request before
        ``initialize``)."""
        fresh_tried = False
        for _attempt in range(3):
            async with self._sessions.lease() as (session, gen):
                era = self._sessions.session_era(gen) or ERA_HANDSHAKE
                # A modern session is ready at once: its first request is what
                # finds out whether the bot answers at all (as initialize does).
                limit = (
                    min(self._retry.answer_timeout, self._connect_timeout)
                    if era == ERA_MODERN
                    else self._connect_timeout
                )
                try:
                    with anyio.fail_after(limit):
                        declared = self.capabilities if era == ERA_HANDSHAKE else None
                        # A bot without tools (a resources-only server) has none to list.
                        tools: list[Tool]
                        stated: ServerCapabilities | None
                        if declared is not None and declared.tools is None:
                            tools, stated = ListedTools(), None
                        else:
                            prefetched = self._sessions.take_prefetched(gen)
                            try:
                                if prefetched is not None:
                                    # The first contact brought them: no PM.
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
                    offline = self._sessions.host_offline()
                    if era != ERA_MODERN:
                        self._sessions.reset(gen)
                        if offline is not None:
                            raise HostOffline(offline) from None
                        raise LinkError("tools/list: no answer from the bot") from None
                    if offline is not None:
                        raise HostOffline(offline) from None
                    # Kept: the request may still reach a bot that comes back.
                    raise LinkError(no_answer_hint(self.uid, limit, self._sessions.own_uid)) from None
                except Exception as exc:
                    if self._sessions.era_refused(exc, gen, probe=True):
                        continue
                    self._sessions.reset(gen)
                    offline = self._sessions.host_offline()
                    if offline is not None:
                        raise HostOffline(offline) from exc
                    if (
                        not fresh_tried
                        and era == ERA_HANDSHAKE
                        and isinstance(exc, MCPError)
                        and exc.error.code not in TRANSPORT_ERROR_CODES
                    ):
                        # The bot answered, but maybe for a session it forgot:
                        # the next lease initializes a new one first.
                        fresh_tried = True
                        log.info(
                            "bot %s answered tools/list with %s; asking again on a fresh session",
                            self.uid[:8],
                            describe_failure(exc),
                        )
                        continue
                    raise LinkError(f"tools/list: {describe_failure(exc)}") from exc
                self.refreshes += 1
                self._fetched_at = anyio.current_time()
                changed = self.era != era or not self.era_confirmed
                self.era = era
                self.era_confirmed = True
                if era == ERA_MODERN:
                    capabilities = stated if stated is not None else self.capabilities or TOOLS_ONLY
                    if capabilities != self.capabilities:
                        self.capabilities = capabilities
                        changed = True
                    if pushes_unasked(capabilities):
                        # Resource updates and list changes need the handshake
                        # era's standing session (2026-07-28 has none over BR),
                        # and a bot tells list changes to sessions that listed:
                        # list again there.
                        self._sessions.require_handshake(gen)
                        continue
                marks = isinstance(tools, ListedTools) and tools.marks_refusals
                changed = changed or tools != self._tools or marks != self._marks_refusals
                self._install_tools(tools)
                self._stale = not self._sessions.is_current(gen)
                self._changed = self._doubted = False
                self._refresh_wanted = False
                if changed:
                    self._on_change()
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
        now, sleep = self._clock.now, self._clock.sleep
        try:
            while not self._sessions.closed:
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
                    async with self._lock:
                        await self._fetch()
                except Exception as exc:
                    self._announce = self._announce or announce
                    if not isinstance(exc, ToolListTooLarge):  # already logged
                        log.info(
                            "bot %s: background tools/list failed: %s", self.uid[:8], describe_failure(exc)
                        )
                    return
                if self._announce:
                    # Announced again while it was fetched: an agent that lists
                    # meanwhile asks the bot itself; this task refreshes later.
                    self._changed = True
                if announce or before != self._tools:
                    await self._subscriptions.broadcast(ToolListChangedNotification())
                if not self._announce:
                    return
        finally:
            self._refreshing = False

    def record(self) -> BotSnapshot | None:
        """What would be persisted now, without the round trip (the link
        adds it): None before the era and the tools are known."""
        if self.era is None or self._tools is None:
            return None
        version = LATEST_MODERN_VERSION if self.era == ERA_MODERN else LATEST_HANDSHAKE_VERSION
        return BotSnapshot(
            bot=self.uid,
            era=self.era,
            protocol_version=version,
            capabilities=self.capabilities,
            tools=self._tools,
            updated=int(self._clock.now()),
            marks_refusals=self._marks_refusals,
        )


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
