"""Relaying what a bot sends *during* a tool call back to the agent that
made the call: progress, log messages, sampling and elicitation requests
(BRIDGE.md §Relayed traffic).

All agents' calls to one bot share the link's single BR session, so the
bot's traffic has to be routed:

* **progress** is exact: the bridge asks the bot for progress only when the
  agent's ``tools/call`` carried a progress token, under a token of its own
  per bot request, and relays each update to that agent request. Values
  that do not increase (a reissue starting over) are dropped, because the
  agent's token must see increasing progress (MCP 2025-11-25, progress).
* **log messages** (``notifications/message``) name no request: each one
  goes to every agent HTTP session with a call in flight on the link (on the
  stream of its oldest call), filtered by the level that session chose with
  ``logging/setLevel`` and, for 2026-07-28 requests, the request's own
  log-level opt-in. With no call in flight the message is dropped.
* **sampling/createMessage** and **elicitation/create** name no request
  either: they are forwarded only when all calls in flight come from one
  agent session, which declared that capability; otherwise the bot gets a
  JSON-RPC error (it asked nobody, nothing is guessed).

The link declares the sampling and elicitation capabilities to every bot
(it cannot know which agent will be asking), and answers for the agent.

Log messages and progress are relayed within bounds (SECURITY.md "The
bridge against a hostile bot"): one over :data:`MAX_RELAYED_BYTES` is
dropped, and at most :data:`RELAY_BURST` at once, then :data:`RELAY_RATE`
per second, pass from one bot (:attr:`Relay.gate`); the rest are dropped
with one log line per run of drops.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar, get_args

import anyio
import anyio.lowlevel
from mcp.client.session import ClientRequestContext
from mcp.server import ServerRequestContext
from mcp.server.connection import allowed_log_levels
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    ClientCapabilities,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateMessageResultWithTools,
    ElicitationCapability,
    ElicitRequest,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    LoggingLevel,
    LoggingMessageNotification,
    LoggingMessageNotificationParams,
    SamplingCapability,
    ServerRequest,
)
from pydantic import BaseModel

from ._linkbase import RateGate, json_bytes

__all__ = [
    "SETTLE_TIMEOUT",
    "AgentCall",
    "AgentGone",
    "Relay",
    "agent_session_id",
    "strip_reserved_meta",
]

log = logging.getLogger("brmcp.bridge")

#: Most seconds a finished call waits for its relayed notifications to be written.
SETTLE_TIMEOUT = 2.0
#: Agent sessions whose ``logging/setLevel`` choice is remembered (least recently set dropped first).
MAX_LEVELS = 1024
#: Largest log message (its JSON: level, logger, data) or progress message
#: (UTF-8) relayed to agents, in bytes; a larger one is dropped. Logs and
#: progress are for people to read; 64 KiB is pages of text.
MAX_RELAYED_BYTES = 64 * 1024
#: Log messages and progress notifications relayed from one bot: this many
#: at once, then :data:`RELAY_RATE` per second; the rest are dropped (one
#: warning per run of drops). A log message goes to every agent session with
#: a call in flight on the bot, so a flood would be multiplied by them.
RELAY_BURST = 100
RELAY_RATE = 50.0

_LEVELS: tuple[LoggingLevel, ...] = get_args(LoggingLevel)  # severity ascending
_RESERVED_PREFIX = "io.modelcontextprotocol/"
_ResultT = TypeVar("_ResultT", bound=BaseModel)


def agent_session_id(ctx: ServerRequestContext[Any]) -> str | None:
    """The agent's ``Mcp-Session-Id`` (the HTTP request is ``ctx.request``)."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return None
    value = headers.get("mcp-session-id")
    return value if isinstance(value, str) and value else None


class AgentGone(anyio.Event):
    """The :attr:`AgentCall.gone` event: an :class:`anyio.Event`, set once
    nobody is left to receive the call's outcome, which also tells whether
    the agent's connection is closed right now and may still be resumed
    (:attr:`detached`, BRIDGE.md §Resumability).

    Set by: the resume grace running out on a detached call (TCP reset or
    FIN from the agent), an HTTP session DELETE the SDK accepted, a re-send
    that takes the call over, and the call's task being cancelled (the
    agent's ``notifications/cancelled``, its session ending, the bridge
    closing). Payments honour both states (:mod:`.settle`): none starts
    while the call is detached, and a payment parked for approval is
    withdrawn once it is set."""

    __slots__ = ("_changed", "_detached", "_event")

    def __new__(cls) -> AgentGone:
        return object.__new__(cls)

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._changed = anyio.Event()
        self._detached = False

    def set(self) -> None:
        """Nobody is left to receive the outcome (idempotent)."""
        self._event.set()
        self._poke()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    def statistics(self) -> anyio.EventStatistics:
        return self._event.statistics()

    @property
    def detached(self) -> bool:
        """True while the agent's connection is closed and not resumed."""
        return self._detached

    def detach(self) -> None:
        """The agent's connection closed before the answer was written."""
        self._detached = True
        self._poke()

    def reattach(self) -> None:
        """The agent resumed the call's stream."""
        self._detached = False
        self._poke()

    async def changed(self) -> None:
        """Return at the next change of state (detached, resumed or gone)."""
        await self._changed.wait()

    async def wait_attached(self) -> bool:
        """Return True as soon as the connection is attached (at once when it
        is), False as soon as the agent is gone."""
        while True:
            if self._event.is_set():
                return False
            if not self._detached:
                return True
            await self._changed.wait()

    def _poke(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()


class AgentCall:
    """One agent ``tools/call`` in flight on a link. ``ctx`` is the agent
    request's SDK context; relays to it are counted so the call can wait
    for them (:meth:`settle`) before its result is written."""

    __slots__ = (
        "_gate",
        "_idle",
        "_last_progress",
        "_pending",
        "agent",
        "call_key",
        "ctx",
        "ended",
        "fingerprint",
        "gone",
        "seq",
        "unknown",
    )

    def __init__(self, ctx: ServerRequestContext[Any], seq: int, gate: RateGate | None = None) -> None:
        self.ctx = ctx
        self.seq = seq
        #: The link's rate bound on relayed notifications (None: unbounded).
        self._gate = gate
        sid = agent_session_id(ctx)
        #: The agent's HTTP session; a call without one is its own agent.
        self.agent: object = sid if sid is not None else self
        self._pending = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._last_progress: float | None = None
        #: Set when nobody is left to receive the outcome, whatever the
        #: reason (see :class:`AgentGone`); also says whether the agent's
        #: connection is detached right now.
        self.gone = AgentGone()
        #: The logical call's callKey and what identifies a re-send of it
        #: (set by the proxy).
        self.call_key = ""
        self.fingerprint: str | None = None
        #: Set when the call left the link (answered, failed or cancelled).
        self.ended = anyio.Event()
        #: True when the call ended without knowing whether the bot ran it
        #: (its deadline passed): a re-send must reuse its callKey.
        self.unknown = False

    @property
    def detached(self) -> bool:
        """True while the agent's connection is closed and not resumed."""
        return self.gone.detached

    @detached.setter
    def detached(self, value: bool) -> None:
        if value:
            self.gone.detach()
        else:
            self.gone.reattach()

    @property
    def last_progress(self) -> float | None:
        """The last progress value relayed to the agent, if any."""
        return self._last_progress

    @property
    def request_id(self) -> Any:
        """The agent's JSON-RPC request id."""
        return self.ctx.request_id

    @property
    def wants_progress(self) -> bool:
        """True when the agent's request carried a progress token."""
        meta = self.ctx.meta
        return meta is not None and meta.get("progress_token") is not None

    def begin_relay(self) -> None:
        """Count one relay to this call as started (call before the first
        await of the code that relays, so :meth:`settle` sees it)."""
        if self._pending == 0:
            self._idle = anyio.Event()
        self._pending += 1

    def end_relay(self) -> None:
        """Count one relay as written (or failed)."""
        self._pending -= 1
        if self._pending == 0:
            self._idle.set()

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Progress callback for the bot request: relays increasing values
        to the agent request, within the link's rate bound (shared with log
        messages, :data:`RELAY_BURST`, :data:`RELAY_RATE`); one whose
        ``message`` is over :data:`MAX_RELAYED_BYTES` is dropped."""
        if self._last_progress is not None and progress <= self._last_progress:
            return
        if self._gate is not None and not self._gate.take():
            return
        if message is not None and len(message.encode("utf-8", "replace")) > MAX_RELAYED_BYTES:
            log.debug("bot progress dropped: its message is over %d bytes", MAX_RELAYED_BYTES)
            return
        self._last_progress = progress
        self.begin_relay()
        try:
            await self.ctx.session.report_progress(progress, total, message)
        except Exception as exc:
            log.debug("progress relay failed: %s", exc)
        finally:
            self.end_relay()

    async def send_log(self, notification: LoggingMessageNotification) -> None:
        """Write a log message on this call's stream; pairs with a prior
        :meth:`begin_relay`. Failures are logged and dropped."""
        try:
            await self.ctx.session.send_notification(notification, related_request_id=self.ctx.request_id)
        except Exception as exc:
            log.debug("log relay failed: %s", exc)
        finally:
            self.end_relay()

    async def settle(self, limit: float = SETTLE_TIMEOUT) -> None:
        """Wait (at most ``limit`` seconds) until every relay started for
        this call has been written, so they precede the call's result."""
        await anyio.lowlevel.checkpoint()
        with anyio.move_on_after(limit):
            await self._idle.wait()


class Relay:
    """The in-flight agent calls of one link, and the link session's
    callbacks for the bot's log messages, sampling and elicitation
    requests (see the module docstring for the routing rules)."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._calls: dict[int, AgentCall] = {}
        self._seq = itertools.count()
        self._levels: OrderedDict[str, LoggingLevel] = OrderedDict()
        #: The rate bound on the log messages and progress relayed from the
        #: bot (``clock``: seconds, anyio's by default; replaceable on it).
        self.gate = RateGate(
            "log messages and progress notifications", burst=RELAY_BURST, rate=RELAY_RATE, clock=clock
        )

    @contextmanager
    def track(self, ctx: ServerRequestContext[Any] | None) -> Iterator[AgentCall | None]:
        """Register the agent call ``ctx`` for the duration of the block
        (yields None when there is no agent request, e.g. a direct call)."""
        if ctx is None:
            yield None
            return
        call = AgentCall(ctx, next(self._seq), self.gate)
        self._calls[call.seq] = call
        try:
            yield call
        except anyio.get_cancelled_exc_class():
            # Cancelled (the agent's notifications/cancelled, its session
            # ended, the bridge closing): nobody receives the outcome.
            call.gone.set()
            raise
        finally:
            del self._calls[call.seq]
            call.ended.set()

    @contextmanager
    def lend(self, call: AgentCall | None) -> Iterator[None]:
        """Register ``call``, tracked by another link's relay, here too for
        the duration of the block: a pool sibling serving it (WIRE.md
        §Pools) has its log messages, sampling and elicitation requests
        routed to that agent call. None: nothing to register."""
        if call is None:
            yield
            return
        key = next(self._seq)
        self._calls[key] = call
        try:
            yield
        finally:
            del self._calls[key]

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    def calls_of(self, session_id: str) -> list[AgentCall]:
        """The calls in flight from one agent HTTP session, oldest first."""
        return sorted((c for c in self._calls.values() if c.agent == session_id), key=lambda c: c.seq)

    def _find(self, session_id: str, request_id: Any) -> list[AgentCall]:
        return [
            call
            for call in self._calls.values()
            if call.agent == session_id and str(call.request_id) == str(request_id)
        ]

    def detach(self, session_id: str, request_id: Any) -> list[AgentCall]:
        """The agent's connection for request ``request_id`` of HTTP session
        ``session_id`` closed before the answer was written: mark those
        calls detached (no payment starts for them meanwhile) and return
        them (the HTTP layer sets :attr:`AgentCall.gone` unless they are
        resumed in time)."""
        calls = self._find(session_id, request_id)
        for call in calls:
            call.detached = True
        return calls

    def abandon(self, session_id: str) -> list[AgentCall]:
        """The agent's HTTP session ``session_id`` ended (a DELETE the SDK
        accepted): every call of it is gone at once (nothing can resume
        it). Returns those calls."""
        calls = self.calls_of(session_id)
        for call in calls:
            call.gone.set()
        return calls

    def reattach(self, session_id: str, request_id: Any) -> bool:
        """The agent resumed the stream of ``request_id``: its calls are
        attached again (unless already given up). True when one was found."""
        calls = self._find(session_id, request_id)
        for call in calls:
            call.detached = False
        return bool(calls)

    def set_level(self, ctx: ServerRequestContext[Any], level: LoggingLevel) -> None:
        """Remember the agent session's minimum log level (``logging/setLevel``)."""
        sid = agent_session_id(ctx)
        if sid is None:
            return
        self._levels[sid] = level
        self._levels.move_to_end(sid)
        while len(self._levels) > MAX_LEVELS:
            self._levels.popitem(last=False)

    def _per_agent(self) -> list[AgentCall]:
        """The oldest in-flight call of each agent session, oldest first."""
        chosen: dict[object, AgentCall] = {}
        for call in sorted(self._calls.values(), key=lambda c: c.seq):
            chosen.setdefault(call.agent, call)
        return list(chosen.values())

    def _wants_log(self, call: AgentCall, level: LoggingLevel) -> bool:
        if level not in allowed_log_levels(call.ctx.protocol_version, call.ctx.meta):
            return False
        threshold = self._levels.get(call.agent) if isinstance(call.agent, str) else None
        return threshold is None or _LEVELS.index(level) >= _LEVELS.index(threshold)

    # -- link session callbacks -------------------------------------------------

    async def on_log(self, params: LoggingMessageNotificationParams) -> None:
        """``logging_callback`` of the link's ClientSession. Within the rate
        bound (:attr:`gate`); a message whose JSON (level, logger, data) is
        over :data:`MAX_RELAYED_BYTES` is dropped."""
        targets = [call for call in self._per_agent() if self._wants_log(call, params.level)]
        if not targets:
            log.debug("bot log message dropped: no agent call wants it")
            return
        if not self.gate.take():
            return
        clean = params.model_copy(update={"meta": None})
        if json_bytes(clean) > MAX_RELAYED_BYTES:
            log.debug("bot log message dropped: over %d bytes", MAX_RELAYED_BYTES)
            return
        notification = LoggingMessageNotification(params=clean)
        for call in targets:  # counted before the first await: settle() sees them all
            call.begin_relay()
        for call in targets:
            await call.send_log(notification)

    async def on_sampling(
        self, context: ClientRequestContext, params: CreateMessageRequestParams
    ) -> CreateMessageResult | CreateMessageResultWithTools | ErrorData:
        """``sampling_callback`` of the link's ClientSession."""
        call = self._asker("sampling/createMessage", ClientCapabilities(sampling=SamplingCapability()))
        if isinstance(call, ErrorData):
            return call
        request = CreateMessageRequest(
            params=params.model_copy(update={"meta": strip_reserved_meta(params.meta)})
        )
        if params.tools or params.tool_choice is not None:
            return await self._forward(call, request, CreateMessageResultWithTools)
        return await self._forward(call, request, CreateMessageResult)

    async def on_elicitation(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        """``elicitation_callback`` of the link's ClientSession."""
        call = self._asker("elicitation/create", ClientCapabilities(elicitation=ElicitationCapability()))
        if isinstance(call, ErrorData):
            return call
        request = ElicitRequest(params=params.model_copy(update={"meta": strip_reserved_meta(params.meta)}))
        return await self._forward(call, request, ElicitResult)

    def _asker(self, method: str, capability: ClientCapabilities) -> AgentCall | ErrorData:
        agents = self._per_agent()
        if not agents:
            return ErrorData(code=INVALID_REQUEST, message=f"{method}: no agent call is in flight")
        if len(agents) > 1:
            return ErrorData(
                code=INVALID_REQUEST,
                message=f"{method}: calls from several agents are in flight; cannot tell which one to ask",
            )
        call = agents[0]
        session = call.ctx.session
        if not session.check_client_capability(capability) or not session.can_send_request:
            return ErrorData(code=METHOD_NOT_FOUND, message=f"{method}: the agent does not support it")
        return call

    @staticmethod
    async def _forward(
        call: AgentCall, request: ServerRequest, result_type: type[_ResultT]
    ) -> _ResultT | ErrorData:
        try:
            return await call.ctx.session.send_request(
                request, result_type, metadata=ServerMessageMetadata(related_request_id=call.ctx.request_id)
            )
        except MCPError as exc:
            return exc.error
        except Exception as exc:
            return ErrorData(code=INTERNAL_ERROR, message=f"the agent did not answer: {exc}")


def strip_reserved_meta(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``meta`` without SDK-managed ``io.modelcontextprotocol/*`` keys and
    ``progress_token`` (BRIDGE.md §Resources, prompts and completions); None
    when nothing is left."""
    if not meta:
        return None
    kept = {
        k: v for k, v in dict(meta).items() if not k.startswith(_RESERVED_PREFIX) and k != "progress_token"
    }
    return kept or None
