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
notifications. Its parts live beside it: :mod:`._exchange` (the re-send
loop, :meth:`BotLink.exchange`, :class:`DeadlineError`), :mod:`._toolsnap`
(the tools snapshot: :meth:`BotLink.refresh`, :meth:`BotLink.snapshot`, the
background refresh; its timing constants ``REFRESH_DELAY``,
``SNAPSHOT_MAX_AGE`` and ``RECHECK_INTERVAL`` are defined and read there
only), :mod:`._eras` (first contact and era signs) and :mod:`._linkbase`
(:class:`LinkError` and the session record).
"""

from __future__ import annotations

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
    EmptyResult,
    Implementation,
    InitializedNotification,
    InitializeRequest,
    InitializeRequestParams,
    InitializeResult,
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
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

from .._ops.clock import Clock
from ..protocol.eras import CAPABILITIES_META_KEY
from ..transport.conn import send_receipt
from ..transport.router import Router
from ._eras import _handshake_only, _modern_discover, _offer, _offered_tools, _pushes
from ._exchange import DeadlineError, ExchangeMixin, ProgressFn, first_answer
from ._linkbase import (
    CONNECT_TIMEOUT,
    TRANSPORT_ERROR_CODES,
    LinkError,
    _describe,
    _Session,
    log,
    no_answer_hint,
)
from ._toolsnap import ToolsMixin
from .relay import Relay
from .retry import RetryPolicy, RttEstimator, relay_estimator
from .snapshots import ERA_HANDSHAKE, ERA_MODERN, BotSnapshot, Era, SnapshotStore
from .subscriptions import Subscriptions

__all__ = [
    "CAPABILITIES_META_KEY",
    "CONNECT_TIMEOUT",
    "MAX_PENDING_DROPS",
    "RTT_SAVE_INTERVAL",
    "RTT_SAVE_RATIO",
    "TRANSPORT_ERROR_CODES",
    "BotLink",
    "DeadlineError",
    "LinkError",
    "ProgressFn",
    "no_answer_hint",
]

#: Most bot unsubscriptions queued at once; past it a URI is left alone until
#: its next update (a bot flooding updates for URIs nobody watches cannot
#: pile up tasks or hold the subscription lock for ever).
MAX_PENDING_DROPS = 32
#: Least seconds (on the link's timer) between two snapshot writes made
#: because the measured RTT moved (:meth:`BotLink._rtt_sampled`); other
#: snapshot writes carry the RTT too.
RTT_SAVE_INTERVAL = 600.0
#: The measured RTO is written again once it is this many times the one on
#: disk, or less than its inverse.
RTT_SAVE_RATIO = 1.5


class BotLink(ExchangeMixin, ToolsMixin):
    """The BR side of one bot. ``uid`` is the lowercase 64-hex bot uid;
    ``router`` the bridge's client-role router; ``task_group`` owns the
    session tasks; ``client_info`` is sent in initialize (and in every
    modern envelope). ``store`` persists the snapshot (None: memory only);
    ``snapshot`` is the one remembered from an earlier run; ``clock``
    gives unix seconds for its ``updated`` stamp; ``timer`` (the bridge's
    :class:`~.clock.Clock`, None: anyio's) paces the snapshot refreshes and
    the rate bounds on what the bot sends (SECURITY.md §6).

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
        clock: Callable[[], float] = time.time,
        retry: RetryPolicy | None = None,
        own_uid: str | None = None,
        timer: Clock | None = None,
        relay_rtt: RttEstimator | None = None,
    ) -> None:
        self.uid = uid
        self._timer_clock = timer
        self._router = router
        self._tg = task_group
        self._client_info = client_info
        self._connect_timeout = connect_timeout
        self._store = store
        self._clock = clock
        self._retry = retry or RetryPolicy()
        self._own_uid = own_uid
        #: Round trips measured to this bot (paces re-sends); its prior is
        #: the relay's estimator, shared by every link of ``router``.
        self.rtt = RttEstimator(
            self._retry, prior=relay_rtt if relay_rtt is not None else relay_estimator(router, self._retry)
        )
        #: The RTO of the RTT last put in a snapshot, and when (link timer).
        self._rtt_saved: float | None = None
        self._rtt_saved_at: float | None = None
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
            if snapshot.rtt is not None:
                # Measured in an earlier run: this bot's first guess, and one
                # for the bots behind the same relay (RFC 9002 §6.2.2).
                self.rtt.seed(*snapshot.rtt)
                if self.rtt.prior is not None:
                    self.rtt.prior.seed(*snapshot.rtt)
                self._rtt_saved = self.rtt.measured
        #: Routes the bot's in-call traffic to the agent calls in flight.
        self.relay = Relay(clock=timer.now if timer is not None else None)
        #: The agent sessions that hear about the bot's resource and prompt changes.
        self.subscriptions = Subscriptions(
            on_orphan=self._schedule_drop, clock=timer.now if timer is not None else None
        )

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
                return await _offer(session, client_info)
            return await _ask_initialize(session, client_info)

        result = await first_answer(
            self.rtt,
            ask,
            limit=self._connect_timeout,
            on_resend=self._count_resend,
            on_sample=self._rtt_sampled,
        )
        if not offer:
            # What ClientSession.initialize does after its request.
            session.adopt(result)
            await session.send_notification(InitializedNotification())
        return result

    def _count_resend(self) -> None:
        self.resends += 1

    def _rtt_sampled(self) -> None:
        """A round trip to the bot was just measured: persist the RTT with
        the snapshot when none is on disk or the RTO moved by
        :data:`RTT_SAVE_RATIO` since, at most once per
        :data:`RTT_SAVE_INTERVAL` (other snapshot writes carry it too)."""
        measured = self.rtt.measured
        saved = self._rtt_saved
        if measured is None or self._store is None or self._closed:
            return
        if saved is not None and saved / RTT_SAVE_RATIO <= measured <= saved * RTT_SAVE_RATIO:
            return
        now = self._timer()[0]()
        if self._rtt_saved_at is not None and now - self._rtt_saved_at < RTT_SAVE_INTERVAL:
            return
        if ToolsMixin.snapshot(self) is None:
            return  # nothing to write yet: the first snapshot will carry it
        self._rtt_saved_at = now
        self._schedule_save()

    def snapshot(self) -> BotSnapshot | None:
        """What would be persisted now (None before the era is known), with
        the RTT measured to the bot (:meth:`.retry.RttEstimator.record`),
        which :meth:`_rtt_sampled` then counts as the one on disk."""
        snapshot = ToolsMixin.snapshot(self)
        if snapshot is not None:
            snapshot.rtt = self.rtt.record()
            self._rtt_saved = self.rtt.measured
        return snapshot

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

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in a task the bridge owns (cancelled when it closes)."""
        self._tg.start_soon(fn, *args)

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
