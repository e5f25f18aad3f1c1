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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import anyio
import anyio.abc
from mcp import ClientSession
from mcp.client.session import IncomingMessage
from mcp.shared.dispatcher import ProgressFnT
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
    InitializedNotification,
    InitializeRequest,
    InitializeRequestParams,
    InitializeResult,
    ListToolsRequest,
    ListToolsResult,
    PaginatedRequestParams,
    PromptListChangedNotification,
    RequestParamsMeta,
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
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION
from pydantic import BaseModel

from ..conn import Conn, send_deadline
from ..eras import CAPABILITIES_META_KEY, LIST_TOOLS_KEY, MODERN_VERSIONS_KEY, TOOLS_KEY
from ..payment import PRICE_ATOMS_KEY
from ..router import Router
from .relay import Relay
from .retry import RetryPolicy, RttEstimator
from .snapshots import ERA_HANDSHAKE, ERA_MODERN, BotSnapshot, Era, SnapshotStore
from .subscriptions import Subscriptions

__all__ = [
    "CAPABILITIES_META_KEY",
    "MAX_PENDING_DROPS",
    "TRANSPORT_ERROR_CODES",
    "BotLink",
    "DeadlineError",
    "LinkError",
    "no_answer_hint",
]

_T = TypeVar("_T", bound=BaseModel)
ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]

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
#: What a bot whose capabilities are unknown is assumed to serve.
_TOOLS_ONLY = ServerCapabilities(tools=ToolsCapability(list_changed=False))


class LinkError(Exception):
    """The bot could not be reached: dialing, initialize or tools/list failed."""


class DeadlineError(LinkError):
    """No reply to a request (nor to any re-sent copy) before its deadline.
    ``sends`` counts the copies sent, ``seconds`` the time waited."""

    def __init__(self, message: str, *, sends: int, seconds: float) -> None:
        super().__init__(message)
        self.sends = sends
        self.seconds = seconds


def no_answer_hint(bot: str, seconds: float, own_uid: str | None) -> str:
    """The message an agent gets when a bot does not answer ``initialize``
    (issue 11 §6): the two usual causes, named."""
    mine = own_uid if own_uid else "(this bridge's uid)"
    return (
        f"no answer from bot {bot} in {seconds:g} s: "
        f"is it online, and is your uid {mine} on its allowed_uids?"
    )


class _Session:
    __slots__ = (
        "conn",
        "done",
        "era",
        "error",
        "gen",
        "offer",
        "prefetched",
        "ready",
        "retired",
        "session",
        "stop",
        "switch",
        "users",
    )

    def __init__(self, gen: int, conn: Conn, era: Era, *, offer: bool = False) -> None:
        self.gen = gen
        self.conn = conn
        self.era: Era = era
        #: A first contact: initialize carries the ``brmcp/listTools`` mark.
        self.offer = offer
        #: The first contact found a modern bot: dial again in the modern era.
        self.switch = False
        #: Tools a first contact brought (used by the next ``tools/list``).
        self.prefetched: list[Tool] | None = None
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
        retry: RetryPolicy | None = None,
        own_uid: str | None = None,
    ) -> None:
        self.uid = uid
        self._router = router
        self._tg = task_group
        self._client_info = client_info
        self._connect_timeout = connect_timeout
        self._store = store
        self._clock = clock
        self._retry = retry or RetryPolicy()
        self._own_uid = own_uid
        #: Round trips measured to this bot (paces re-sends).
        self.rtt = RttEstimator(self._retry)
        #: Copies sent again because no reply came in time (observability).
        self.resends = 0
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
        #: When :meth:`doubt_tools` last asked for a look-up (monotonic s).
        self._doubted_at: float | None = None
        #: When the snapshot was last fetched from the bot (monotonic s).
        self._fetched_at: float | None = None
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

    async def exchange(
        self,
        request: Any,
        result_type: type[_T],
        *,
        progress: ProgressFn | None = None,
        quiet: anyio.Event | None = None,
        deadline: float | None = None,
    ) -> _T:
        """Send ``request`` and return the bot's reply, re-sending the same
        request (same params, so the same callKey) on the RTT-sized backoff
        of :mod:`.retry` until a reply arrives or the deadline passes. The
        deadline is the router's message TTL from the first send, and every
        copy's ``exp`` is capped at it, so the bot never runs a copy the
        bridge stopped waiting for. The first reply wins; the others are
        dropped (the bot replays one outcome per callKey).

        A copy that fails in transport resets the link (the next copy dials
        a fresh session) and is followed at once by another. An error the
        bot answered is final, except the first one, which resets the link
        and is tried once more on a fresh session (a bot that forgot the
        session answers with an error).

        ``quiet``: while this event is unset no copy is sent (the bot is
        expected to hold the request, e.g. until a payment lands).
        ``deadline`` (on :func:`anyio.current_time`) ends the wait earlier:
        the logical call's own deadline.

        Raises :class:`DeadlineError` at the deadline, :class:`LinkError`
        when the link is closed, and :class:`MCPError` for the bot's error."""
        start = anyio.current_time()
        ttl = self._router.options.ttl
        if deadline is not None:
            ttl = max(0.0, min(ttl, deadline - start))
        end = start + ttl
        # A bot accepts a part until floor(now) > exp (WIRE.md §Deadlines), up
        # to a second past exp: cap exp one second early so no copy can start
        # after the bridge stopped waiting.
        cap = self._router._clock() + (ttl - 1 if ttl > 2 else ttl)
        replies: list[_T | MCPError] = []
        done = anyio.Event()
        sends = 0
        bot_errors = 0
        heard = start
        last: list[BaseException] = []
        wakes = [anyio.Event()]

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            # Only asked for when the agent wants progress (the bot is not
            # asked for progress nobody reads); it also proves the bot is working.
            nonlocal heard
            heard = anyio.current_time()
            if progress is not None:
                await progress(value, total, message)

        callback = cast(ProgressFnT, on_progress) if progress is not None else None

        async def attempt() -> None:
            nonlocal sends, bot_errors
            token = send_deadline.set(cap)
            try:
                async with self.lease() as (session, gen):
                    sends += 1
                    first = sends == 1
                    sent = anyio.current_time()
                    try:
                        reply = await session.send_request(
                            request,
                            result_type,
                            progress_callback=callback,
                        )
                    except MCPError as exc:
                        if exc.error.code in TRANSPORT_ERROR_CODES:
                            self.reset(gen)
                            last.append(exc)
                            wakes[-1].set()
                            return
                        if self.era_refused(exc, gen):
                            # The bot wants the handshake era: the next copy
                            # (same request, same callKey) initializes first.
                            last.append(exc)
                            wakes[-1].set()
                            return
                        bot_errors += 1
                        if bot_errors == 1:
                            log.info("bot %s answered %s; trying a fresh session", self.uid[:8], exc)
                            self.reset(gen)
                            last.append(exc)
                            wakes[-1].set()
                            return
                        replies.append(exc)
                        done.set()
                        return
                    if first and sends == 1:
                        self.rtt.sample(anyio.current_time() - sent)
                    replies.append(reply)
                    done.set()
            except LinkError as exc:
                last.append(exc)
                if self._closed:
                    replies.append(exc)  # type: ignore[arg-type]
                    done.set()
            finally:
                send_deadline.reset(token)

        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt)
            gap = self.rtt.rto
            due = start + gap
            last_send = start
            held = quiet is not None and not quiet.is_set()
            while not done.is_set():
                now = anyio.current_time()
                if now >= end:
                    break
                with anyio.move_on_after(max(0.0, min(due, end) - now)):
                    if held:
                        assert quiet is not None
                        await _first_of(done, wakes[-1], quiet)
                    else:
                        await _first_of(done, wakes[-1])
                if done.is_set():
                    break
                now = anyio.current_time()
                if now >= end:
                    break
                if held and quiet is not None and quiet.is_set():
                    # The hold just ended: the bot answers one round trip from now.
                    held = False
                    heard = now
                    due = now + gap
                    continue
                if wakes[-1].is_set():
                    # A copy failed in transport: send the next one soon, not at once.
                    wakes[-1] = anyio.Event()
                    due = min(due, max(now, last_send + self._retry.minimum))
                    continue
                if now < due:
                    continue
                if quiet is not None and not quiet.is_set():
                    # A call the bot holds for a payment under way (WIRE.md
                    # §Pay alongside): its silence is expected until then.
                    heard = now
                if heard > due - gap:
                    due = heard + gap  # the bot is working on it: no copy yet
                    continue
                self.resends += 1
                tg.start_soon(attempt)
                last_send = now
                gap = self.rtt.clamp(gap * 2)
                due = now + gap
            tg.cancel_scope.cancel()
        if replies:
            reply = replies[0]
            if isinstance(reply, LinkError | MCPError):
                raise reply
            return reply
        waited = anyio.current_time() - start
        why = f" (last failure: {_describe(last[-1])})" if last else ""
        took = f"{waited:.0f}" if waited >= 1 else f"{waited:.1f}"
        text = f"no reply from bot {self.uid[:8]} within {took} s after {sends} send(s){why}"
        if sends == 0:
            text = f"the call's deadline passed before the request could be sent to bot {self.uid[:8]}{why}"
        raise DeadlineError(
            text,
            sends=sends,
            seconds=waited,
        )

    async def _acquire(self) -> _Session:
        async with self._lock:
            if self._closed:
                raise LinkError("link closed")
            state = self._current
            if state is not None and state.ready.is_set() and (state.done.is_set() or state.conn.closed):
                self._retire(state)
                state = None
            prefetched: list[Tool] | None = None
            for _dial in range(2):
                if state is None:
                    state = self._dial()
                    state.prefetched = prefetched
                answer = min(self._retry.answer_timeout, self._connect_timeout)
                with anyio.move_on_after(answer):
                    await state.ready.wait()
                if not state.ready.is_set():
                    # The dial goes on in the background (re-sending initialize);
                    # the next request joins it.
                    raise LinkError(no_answer_hint(self.uid, answer, self._own_uid))
                if not state.switch:
                    break
                # The first contact found a modern bot (or one that refuses
                # initialize): the era is known now; dial in it.
                prefetched = state.prefetched
                if self._current is state:
                    self._current = None
                self._retire(state)
                state = None
            assert state is not None
            if state.session is None:
                if self._current is state:
                    self._current = None
                error = state.error
                raise LinkError(_describe(error) if error is not None else "session closed")
            return state

    def _dial(self) -> _Session:
        """A new session in the bot's era (a first contact when unknown),
        made current; its task starts at once. Raises :class:`LinkError`."""
        try:
            conn = self._router.dial(self.uid)
        except RuntimeError as exc:
            raise LinkError(str(exc)) from None
        self._gen += 1
        self.dials += 1
        era = self._era
        state = _Session(self._gen, conn, era or ERA_HANDSHAKE, offer=era is None)
        self._current = state
        self._stale = True
        self._tg.start_soon(self._run, state, name=f"brmcp-bridge-link-{self.uid[:8]}")
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
                elif state.offer:
                    result = await self._first_contact(s, state)
                    if result is None:
                        return  # state.switch: the caller dials in the modern era
                    capabilities = result.capabilities
                else:
                    result = await self._initialize(s)
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

    async def _first_contact(self, session: ClientSession, state: _Session) -> InitializeResult | None:
        """Open a first contact (WIRE.md §Eras, "First contact"): a marked
        ``initialize``. A brmcp bot answers with its modern versions and its
        tools: a bot that pushes nothing unasked is then used in the modern
        era on a new sid (``state.switch``, tools in ``state.prefetched``;
        returns None, and this sid is abandoned). Any other answer goes on
        with the handshake here (``notifications/initialized``) and returns
        the result, exactly the reference's PMs. A bot that refuses
        ``initialize`` itself is tried in the modern era."""
        try:
            result: InitializeResult = await self._initialize(session, offer=True)
        except MCPError as exc:
            if exc.error.code in TRANSPORT_ERROR_CODES:
                raise
            log.info("bot %s refused initialize (%s); trying the modern era", self.uid[:8], _describe(exc))
            if self._current is state:
                self._era = ERA_MODERN
            state.switch = True
            return None
        offered = _offered_tools(result)
        if offered is not None and not _pushes(result.capabilities):
            if self._current is state:
                self._era = ERA_MODERN
                self._capabilities = result.capabilities
            state.prefetched = offered
            state.switch = True
            return None
        session.adopt(result)
        await session.send_notification(InitializedNotification())
        if self._current is state:
            self._era = ERA_HANDSHAKE
            self._capabilities = result.capabilities
        return result

    async def _initialize(self, session: ClientSession, *, offer: bool = False) -> Any:
        """``initialize``, sent again on the RTT-sized backoff until answered
        (the bot answers every copy; a lost PM or a bot that was offline is
        covered), for at most ``connect_timeout`` seconds (TimeoutError).
        ``offer``: the first-contact ``initialize`` (marked, not adopted,
        no ``notifications/initialized``; :meth:`_first_contact`)."""
        start = anyio.current_time()
        end = start + self._connect_timeout
        gap = self.rtt.rto
        first = True
        while True:
            now = anyio.current_time()
            if now >= end:
                raise TimeoutError
            with anyio.move_on_after(min(gap, end - now)):
                result = await (_offer(session, self._client_info) if offer else session.initialize())
                if first:
                    self.rtt.sample(anyio.current_time() - now)
                return result
            self.resends += 1
            first = False
            gap = self.rtt.clamp(gap * 2)

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
    def ttl(self) -> float:
        """Seconds a request to the bot may take: the router's message TTL."""
        return self._router.options.ttl

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
        return True

    def _install_tools(self, tools: list[Tool]) -> None:
        self._tools = tools
        self._by_name = {t.name: t for t in tools}

    async def refresh(self) -> list[Tool]:
        """Return the tool snapshot. With none yet it is fetched with
        ``tools/list`` (one round trip unless the bot paginates; on a first
        contact this request also tells the bot's era). A snapshot that is
        stale (remembered from an earlier run, or taken on a session since
        reset) is returned as it is and refreshed in the background after
        the next request that reaches the bot; so is one fetched more than
        :data:`SNAPSHOT_MAX_AGE` seconds ago (the agents get
        ``notifications/tools/list_changed`` when it differed). Raises
        :class:`LinkError`."""
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
                            tools, stated = [], None
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
                                tools, stated = [], DiscoverResult.model_validate(raw).capabilities
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


async def _first_of(*events: anyio.Event) -> None:
    """Return once any of ``events`` is set."""
    async with anyio.create_task_group() as tg:

        async def _wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(_wait, event)


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


async def _offer(session: ClientSession, client_info: Implementation) -> InitializeResult:
    """Send the first-contact ``initialize``: what ``session.initialize()``
    sends, plus ``params._meta["brmcp/listTools"] = true`` (WIRE.md §Eras).
    Raises RuntimeError for an answer in a version this client lacks."""
    params = InitializeRequestParams(
        protocol_version=LATEST_HANDSHAKE_VERSION,
        capabilities=session._build_capabilities(LATEST_HANDSHAKE_VERSION),
        client_info=client_info,
        _meta=cast(RequestParamsMeta, {LIST_TOOLS_KEY: True}),
    )
    result = await session.send_request(InitializeRequest(params=params), InitializeResult)
    if result.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        raise RuntimeError(f"Unsupported protocol version from the server: {result.protocol_version}")
    return result


def _offered_tools(result: InitializeResult) -> list[Tool] | None:
    """The tools a first-contact answer brought, when it also names a
    modern version this client speaks; None otherwise (a plain answer)."""
    meta = result.meta
    if not isinstance(meta, dict):
        return None
    versions = meta.get(MODERN_VERSIONS_KEY)
    if not isinstance(versions, list) or LATEST_MODERN_VERSION not in versions:
        return None
    try:
        return ListToolsResult.model_validate(meta.get(TOOLS_KEY)).tools
    except ValueError:
        return None


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
