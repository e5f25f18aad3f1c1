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
from collections.abc import AsyncIterator, Awaitable, Callable
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
from pydantic import BaseModel

from ..conn import Conn, send_deadline
from ..router import Router
from .relay import Relay
from .retry import RetryPolicy, RttEstimator
from .subscriptions import Subscriptions

__all__ = [
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
        retry: RetryPolicy | None = None,
        own_uid: str | None = None,
    ) -> None:
        self.uid = uid
        self._router = router
        self._tg = task_group
        self._client_info = client_info
        self._connect_timeout = connect_timeout
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

    async def exchange(
        self,
        request: Any,
        result_type: type[_T],
        *,
        progress: ProgressFn | None = None,
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
            while not done.is_set():
                now = anyio.current_time()
                if now >= end:
                    break
                with anyio.move_on_after(max(0.0, min(due, end) - now)):
                    await _first_of(done, wakes[-1])
                if done.is_set():
                    break
                now = anyio.current_time()
                if now >= end:
                    break
                if wakes[-1].is_set():
                    # A copy failed in transport: send the next one soon, not at once.
                    wakes[-1] = anyio.Event()
                    due = min(due, max(now, last_send + self._retry.minimum))
                    continue
                if now < due:
                    continue
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
        raise DeadlineError(
            f"no reply from bot {self.uid[:8]} within {waited:.0f} s after {sends} send(s){why}",
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
            answer = min(self._retry.answer_timeout, self._connect_timeout)
            with anyio.move_on_after(answer):
                await state.ready.wait()
            if not state.ready.is_set():
                # The dial goes on in the background (re-sending initialize);
                # the next request joins it.
                raise LinkError(no_answer_hint(self.uid, answer, self._own_uid))
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
                result = await self._initialize(s)
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

    async def _initialize(self, session: ClientSession) -> Any:
        """``initialize``, sent again on the RTT-sized backoff until answered
        (the bot answers every copy; a lost PM or a bot that was offline is
        covered), for at most ``connect_timeout`` seconds (TimeoutError)."""
        start = anyio.current_time()
        end = start + self._connect_timeout
        gap = self.rtt.rto
        first = True
        while True:
            now = anyio.current_time()
            if now >= end:
                raise TimeoutError
            with anyio.move_on_after(min(gap, end - now)):
                result = await session.initialize()
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
            async with self.lease() as (_session, gen):
                try:
                    with anyio.fail_after(self._connect_timeout):
                        declared = self._capabilities
                        # A bot without tools (a resources-only server) has none to list.
                        tools = (
                            [] if declared is not None and declared.tools is None else await self._list_all()
                        )
                except Exception as exc:
                    self.reset(gen)
                    raise LinkError(f"tools/list: {_describe(exc)}") from exc
                current = self._current
                self._tools = tools
                self._by_name = {t.name: t for t in tools}
                self._stale = current is None or current.gen != gen
            return tools

    async def _list_all(self) -> list[Tool]:
        """Every page of ``tools/list``, each request re-sent on the backoff
        (:meth:`exchange`): a lost PM does not hang the snapshot."""
        tools: list[Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            params = PaginatedRequestParams(cursor=cursor) if cursor is not None else None
            page = await self.exchange(ListToolsRequest(params=params), ListToolsResult)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
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


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "no answer from the bot"
    return str(exc) or type(exc).__name__
