"""One bot link: the single BR session to a bot that every local HTTP session
for that bot shares (README §How a paid call travels; the Go reference, karamble/brmcp, `bridge/session.go`).

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

This module holds :class:`BotLink` itself: its sessions, eras and change
notifications. It owns two components, each built with what it depends on
(the link's sessions reach them through the protocols of :mod:`._linkbase`):

* a :class:`~._exchange.Resender` (:mod:`._exchange`): the re-send loop,
  :meth:`BotLink.exchange`, :class:`DeadlineError`;
* a :class:`~._toolsnap.ToolSnapshot` (:mod:`._toolsnap`): the tools
  snapshot with the bot's era and capabilities, :meth:`BotLink.refresh`,
  the background refresh; its timing constants ``REFRESH_DELAY``,
  ``SNAPSHOT_MAX_AGE``, ``RECHECK_INTERVAL`` and ``RELIST_INTERVAL`` are
  defined and read there only;
* a :class:`~._changes.BotChanges` (:mod:`._changes`): the bot's change
  notifications, its unsubscriptions (``MAX_PENDING_DROPS``) and
  re-subscriptions.

:mod:`._eras` holds first contact and the era signs, :mod:`._linkbase`
:class:`LinkError`, the session record and the components' protocols.
Every part reads the time of day from the one
:class:`~brmcp._ops.clock.Clock` the link is given.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import (
    Implementation,
    InitializedNotification,
    InitializeRequest,
    InitializeRequestParams,
    InitializeResult,
    Tool,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import BaseModel

from brmcp._ops.clock import Clock, SystemClock
from brmcp.protocol.eras import CAPABILITIES_META_KEY
from brmcp.transport.conn import send_receipt
from brmcp.transport.router import Router

from ._changes import MAX_PENDING_DROPS, BotChanges, can_subscribe
from ._eras import era_offer, handshake_only, modern_discover, offered_tools, pushes_unasked
from ._exchange import DeadlineError, ProgressFn, Resender, first_answer
from ._linkbase import (
    CONNECT_TIMEOUT,
    TRANSPORT_ERROR_CODES,
    HostOffline,
    LinkError,
    Session,
    describe_failure,
    log,
    no_answer_hint,
    sender_offline,
)
from ._linktools import LinkTools
from ._relay import Relay
from ._retry import RetryPolicy, RttEstimator, relay_estimator
from ._snapshots import ERA_HANDSHAKE, ERA_MODERN, BotSnapshot, Era, SnapshotStore
from ._subscriptions import Subscriptions
from ._toolsnap import ToolSnapshot

__all__ = [
    "CAPABILITIES_META_KEY",
    "CONNECT_TIMEOUT",
    "MAX_PENDING_DROPS",
    "TRANSPORT_ERROR_CODES",
    "BotLink",
    "DeadlineError",
    "HostOffline",
    "LinkError",
    "ProgressFn",
    "no_answer_hint",
]


_T = TypeVar("_T", bound=BaseModel)


class BotLink(LinkTools):
    """The BR side of one bot. ``uid`` is the lowercase 64-hex bot uid;
    ``router`` the bridge's client-role router; ``task_group`` owns the
    session tasks; ``client_info`` is sent in initialize (and in every
    modern envelope). ``store`` persists the snapshot (None: memory only);
    ``snapshot`` is the one remembered from an earlier run; ``clock`` (the
    bridge's :class:`~brmcp._ops.clock.Clock`; None: a
    :class:`~brmcp._ops.clock.SystemClock`) is the one clock the link and
    its components share: it stamps the snapshot's ``updated`` (unix
    seconds), paces the snapshot refreshes and the RTT writes, and times
    the rate bounds on what the bot sends (SECURITY.md §6). (Round trips,
    re-send timers and request deadlines are durations on the event loop's
    clock, :func:`anyio.current_time`.) ``own_uid`` is this bridge's uid,
    named when a bot does not answer (:func:`no_answer_hint`).

    Re-sends follow :attr:`rtt`, this bot's estimator (:mod:`.retry`): its
    first guess is the RTT persisted in ``snapshot``, else the one measured
    across every link of ``router`` (``relay_rtt``, by default
    :func:`~.retry.relay_estimator` of ``router``), else ``retry.initial``."""

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
        clock: Clock | None = None,
        retry: RetryPolicy | None = None,
        own_uid: str | None = None,
        relay_rtt: RttEstimator | None = None,
    ) -> None:
        self.uid = uid
        clock = clock if clock is not None else SystemClock()
        self._clock = clock
        self._router = router
        self._tg = task_group
        self._client_info = client_info
        self._connect_timeout = connect_timeout
        self._store = store
        self._retry = retry or RetryPolicy()
        #: This bridge's own uid (64 hex), named in the hint an agent gets
        #: from a bot that does not answer; None: not known.
        self.own_uid = own_uid
        #: Round trips measured to this bot (paces re-sends); its prior is
        #: the relay's estimator, shared by every link of ``router``.
        self.rtt = RttEstimator(
            self._retry, prior=relay_rtt if relay_rtt is not None else relay_estimator(router, self._retry)
        )
        #: The RTO of the RTT last put in a snapshot, and when (link clock).
        self._rtt_saved: float | None = None
        self._rtt_saved_at: float | None = None
        self._current: Session | None = None
        self._gen = 0
        self._lock = anyio.Lock()
        self._closed = False
        #: Sessions dialed so far (observability and tests).
        self.dials = 0
        #: Routes the bot's in-call traffic to the agent calls in flight.
        self.relay = Relay(clock=clock.now)
        #: The agent sessions that hear about the bot's resource and prompt changes.
        self.subscriptions = Subscriptions(on_orphan=self._drop_orphan, clock=clock.now)
        self._resender = Resender(uid, self, router, self.rtt, self._retry, on_sample=self._rtt_sampled)
        self._toolsnap = ToolSnapshot(
            uid,
            self,
            task_group,
            self.subscriptions,
            clock=clock,
            retry=self._retry,
            connect_timeout=connect_timeout,
            remembered=snapshot,
            on_change=self._schedule_save,
        )
        self._changes = BotChanges(
            uid, self, task_group, self.subscriptions, self._toolsnap, connect_timeout=connect_timeout
        )
        if snapshot is not None and snapshot.rtt is not None:
            # Measured in an earlier run: this bot's first guess, and one
            # for the bots behind the same relay (RFC 9002 §6.2.2).
            self.rtt.seed(*snapshot.rtt)
            if self.rtt.prior is not None:
                self.rtt.prior.seed(*snapshot.rtt)
            self._rtt_saved = self.rtt.measured

    # -- the re-send loop (:mod:`._exchange`) -------------------------------------

    async def exchange(
        self,
        request: Any,
        result_type: type[_T],
        *,
        progress: ProgressFn | None = None,
        quiet: anyio.Event | None = None,
        deadline: float | None = None,
    ) -> _T:
        """Send ``request`` and return the bot's reply of ``result_type``,
        re-sent on the RTT-sized backoff until a reply or the deadline (the
        router's message TTL, or ``deadline`` on :func:`anyio.current_time`
        when sooner); no copy is sent while ``quiet`` is unset;
        ``progress`` gets the bot's progress. See
        :meth:`.Resender.exchange`. Raises :class:`DeadlineError`,
        :class:`LinkError` (link closed) and :class:`MCPError` (the bot's
        error)."""
        return await self._resender.exchange(
            request, result_type, progress=progress, quiet=quiet, deadline=deadline
        )

    @property
    def resends(self) -> int:
        """Copies sent again because no reply came in time (``initialize``
        and every :meth:`exchange`; observability)."""
        return self._resender.resends

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
            if not self._closed:
                self._toolsnap.after_lease()

    async def _acquire(self) -> Session:
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
                    offline = self.host_offline()
                    if offline is not None:
                        raise HostOffline(offline)
                    raise LinkError(no_answer_hint(self.uid, answer, self.own_uid))
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
                offline = self.host_offline()
                if offline is not None:
                    raise HostOffline(offline)
                error = state.error
                raise LinkError(describe_failure(error) if error is not None else "session closed")
            return state

    def _dial(self) -> Session:
        """A new session in the bot's era (a first contact when unknown),
        made current; its task starts at once. Raises :class:`LinkError`."""
        try:
            conn = self._router.dial(self.uid)
        except RuntimeError as exc:
            raise LinkError(str(exc)) from None
        self._gen += 1
        self.dials += 1
        era = self._toolsnap.era
        state = Session(self._gen, conn, era or ERA_HANDSHAKE, offer=era is None)
        self._current = state
        self._toolsnap.mark_stale()
        self._tg.start_soon(self._run, state, name=f"brmcp-bridge-link-{self.uid[:8]}")
        return state

    async def _run(self, state: Session) -> None:
        # Started from whichever task dialed (maybe a copy of a request that
        # waits for this session): that copy's receipt is not this session's.
        send_receipt.set(None)
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
                message_handler=self._changes.on_message,
                # 2026-07-28 logging is opt-in per request: take every level,
                # the relay filters per agent.
                log_level="debug" if modern else None,
            ) as s:
                if modern:
                    # No initialize: the first request carries the envelope.
                    s.adopt(modern_discover(self._toolsnap.capabilities))
                    capabilities = self._toolsnap.capabilities
                elif state.offer:
                    result = await self._first_contact(s, state)
                    if result is None:
                        return  # state.switch: the caller dials in the modern era
                    capabilities = result.capabilities
                else:
                    result = await self._initialize(s)
                    capabilities = result.capabilities
                    if self._current is state:
                        self._toolsnap.capabilities = capabilities
                state.session = s
                state.ready.set()
                if not modern and self.subscriptions.uris() and can_subscribe(capabilities):
                    self._tg.start_soon(self._changes.resubscribe, state.gen)
                await state.stop.wait()
        except Exception as exc:
            state.error = exc
            log.info("bot %s: session ended: %s", self.uid[:8], describe_failure(exc))
        finally:
            state.session = None
            conn.close()
            state.ready.set()
            state.done.set()

    async def _first_contact(self, session: ClientSession, state: Session) -> InitializeResult | None:
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
            log.info(
                "bot %s refused initialize (%s); trying the modern era", self.uid[:8], describe_failure(exc)
            )
            if self._current is state:
                self._toolsnap.era = ERA_MODERN
            state.switch = True
            return None
        offered = offered_tools(result)
        if offered is not None and not pushes_unasked(result.capabilities):
            if self._current is state:
                self._toolsnap.era = ERA_MODERN
                self._toolsnap.capabilities = result.capabilities
            state.prefetched = offered
            state.switch = True
            return None
        session.adopt(result)
        await session.send_notification(InitializedNotification())
        if self._current is state:
            self._toolsnap.era = ERA_HANDSHAKE
            self._toolsnap.capabilities = result.capabilities
        return result

    async def _initialize(self, session: ClientSession, *, offer: bool = False) -> InitializeResult:
        """``initialize``, sent again on the RTT-sized backoff until answered
        (:func:`~._exchange.first_answer`: the first answer to any copy
        wins, each copy being its own JSON-RPC request; the bot answers every
        copy; a lost PM or a bot that was offline is covered), for at most
        ``connect_timeout`` seconds (TimeoutError). The answer is then
        adopted and ``notifications/initialized`` sent, once. ``offer``: the
        first-contact ``initialize`` (marked, not adopted, no
        ``notifications/initialized``; :meth:`_first_contact`). Raises
        RuntimeError for an answer in a version this client lacks, and
        MCPError for the bot's error or a failed session."""
        client_info = self._client_info

        async def ask() -> InitializeResult:
            if offer:
                return await era_offer(session, client_info)
            return await _ask_initialize(session, client_info)

        result = await first_answer(
            self.rtt,
            ask,
            limit=self._connect_timeout,
            on_resend=self._resender.count_resend,
            on_sample=self._rtt_sampled,
        )
        if not offer:
            # What ClientSession.initialize does after its request.
            session.adopt(result)
            await session.send_notification(InitializedNotification())
        return result

    def _retire(self, state: Session) -> None:
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
        self._toolsnap.mark_stale()
        self._retire(state)
        return True

    def close(self) -> None:
        """Close the BR session for good (de-listed bot or bridge closing)."""
        self._closed = True
        state = self._current
        self._current = None
        self._toolsnap.mark_stale()
        if state is not None:
            state.stop.set()
            state.conn.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def host_offline(self) -> str | None:
        """Why this bridge cannot reach Bison Relay at all right now, as its
        PM sender says (:class:`~._linkbase.OfflineAware`: the daemon's
        brclient is down and a PM already waited out a reconnect), else None.
        A request then fails with :class:`HostOffline` instead of blaming
        the bot."""
        return sender_offline(self._router.sender)

    def session_era(self, gen: int) -> Era | None:
        """The era of session generation ``gen`` (None when it is gone)."""
        state = self._current
        return state.era if state is not None and state.gen == gen else None

    def is_current(self, gen: int) -> bool:
        """True while session generation ``gen`` is the current one."""
        state = self._current
        return state is not None and state.gen == gen

    def take_prefetched(self, gen: int) -> list[Tool] | None:
        """The tools the first contact of session ``gen`` brought (a
        :class:`~.snapshots.ListedTools` counted against the tool-list
        bounds), handed over once so the next ``tools/list`` needs no PM;
        None when there are none or ``gen`` is not current."""
        state = self._current
        if state is None or state.gen != gen:
            return None
        prefetched, state.prefetched = state.prefetched, None
        return prefetched

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
        if not handshake_only(exc, probe=probe):
            return False
        self.require_handshake(gen)
        return True

    def require_handshake(self, gen: int | None = None) -> None:
        """Use the handshake era with this bot from now on (persisted with
        the next snapshot) and reset the link so the next use initializes."""
        if self._toolsnap.era != ERA_HANDSHAKE:
            log.info("bot %s: using the handshake era", self.uid[:8])
        self._toolsnap.era = ERA_HANDSHAKE
        self._toolsnap.era_confirmed = True
        self.reset(gen)
        self._schedule_save()

    @property
    def ttl(self) -> float:
        """Seconds a request to the bot may take: the router's message TTL."""
        return self._router.options.ttl

    @property
    def connected(self) -> bool:
        """True while an initialized session is current."""
        state = self._current
        return state is not None and state.session is not None and not state.conn.closed

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in a task the bridge owns (cancelled when it closes)."""
        self._tg.start_soon(fn, *args)

    # -- change notifications -----------------------------------------------

    def forget_agent(self, session_id: str) -> None:
        """An agent HTTP session ended: drop its subscriptions (the bot is
        unsubscribed from URIs nobody else watches)."""
        self.subscriptions.forget(session_id)

    def _drop_orphan(self, uri: str) -> None:
        """No agent watches ``uri`` any more (``on_orphan`` of :attr:`subscriptions`)."""
        self._changes.schedule_drop(uri)


async def _ask_initialize(session: ClientSession, client_info: Implementation) -> InitializeResult:
    """One copy of ``initialize``: the request ``ClientSession.initialize``
    sends, without adopting its answer (the caller adopts the first answer
    of all copies once). Raises RuntimeError for an answer in a version
    this client lacks."""
    params = InitializeRequestParams(
        protocol_version=LATEST_HANDSHAKE_VERSION,
        capabilities=session._build_capabilities(LATEST_HANDSHAKE_VERSION),
        client_info=client_info,
    )
    result = await session.send_request(InitializeRequest(params=params), InitializeResult)
    if result.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        raise RuntimeError(f"Unsupported protocol version from the server: {result.protocol_version}")
    return result
