"""What every part of a bot link shares (:mod:`.link`, :mod:`._exchange`,
:mod:`._toolsnap`, :mod:`._eras`, :mod:`.relay`, :mod:`.subscriptions`): its
error (:class:`LinkError`), the hint given when a bot does not answer, the
record of one BR session (:class:`Session`), what the link's components
use of its sessions (:class:`LinkSessions`, :class:`SnapshotSessions`), the
transport error codes and the connect limit, and the bounds on what a bot
sends (SECURITY.md "The bridge against a hostile bot"): the tool-list
bounds (:class:`ToolListBudget`, :class:`ToolListTooLarge`) and the rate
bound on relayed notifications (:class:`RateGate`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

import anyio
from mcp import ClientSession
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, ListToolsResult, Tool
from pydantic import BaseModel

from brmcp.protocol.payment import MARKS_REFUSALS_KEY
from brmcp.protocol.pool import PoolAnnouncement, pool_from_meta
from brmcp.protocol.receipts import receipt_key_from_meta
from brmcp.transport.conn import Conn

from ._snapshots import Era, ListedTools

__all__ = [
    "CONNECT_TIMEOUT",
    "MAX_TOOLS",
    "MAX_TOOL_BYTES",
    "MAX_TOOL_LIST_BYTES",
    "MAX_TOOL_PAGES",
    "TRANSPORT_ERROR_CODES",
    "HostOffline",
    "LinkError",
    "LinkSessions",
    "OfflineAware",
    "RateGate",
    "SnapshotSessions",
    "ToolListBudget",
    "ToolListTooLarge",
    "json_bytes",
    "no_answer_hint",
    "sender_offline",
]

log = logging.getLogger("brmcp.bridge")

#: Limit for initialize and for the tools/list snapshot (seconds).
CONNECT_TIMEOUT = 120.0
#: MCPError codes the SDK raises itself when the BR session failed (as
#: opposed to an error the bot answered with).
TRANSPORT_ERROR_CODES = frozenset({CONNECTION_CLOSED, REQUEST_TIMEOUT})


#: Most ``tools/list`` pages followed for one tool list.
MAX_TOOL_PAGES = 64
#: Most tools in one tool list (all pages together). Agents take far fewer:
#: OpenAI's API, for one, takes at most 128 functions per request.
MAX_TOOLS = 1024
#: Largest JSON of one tool (UTF-8 bytes: name, title, description, input
#: and output schemas, annotations, ``_meta``). A tool with an unusually
#: rich schema (an OpenAPI operation with nested objects) is a few KiB to a
#: few tens of KiB; 256 KiB is a schema no model could use.
MAX_TOOL_BYTES = 256 * 1024
#: Largest JSON of one tool list (UTF-8 bytes, all pages together: every
#: tool, every page's ``nextCursor`` and ``_meta``, the capabilities a
#: modern ``brmcp/capabilities`` states). Far above any real list: 1,024
#: tools of 4 KiB each (a long description and a rich schema) fit, and the
#: lists MCP servers serve in practice, tens of tools of 1 to 2 KiB, are
#: under 1 % of it. Far below memory concern: the snapshot holds at most
#: this (its Python objects a small multiple of it), a refused list at most
#: this plus the one page (one message, at most 16 MiB: SECURITY.md §1)
#: that went over, and the file written is at most
#: :data:`~.snapshots.MAX_SNAPSHOT_BYTES`.
MAX_TOOL_LIST_BYTES = 4 * 1024 * 1024


class LinkError(Exception):
    """The bot could not be reached: dialing, initialize or tools/list failed."""


class HostOffline(LinkError):
    """The bridge itself is off Bison Relay: its host's PM sender says it is
    offline (:class:`OfflineAware`; the daemon: its brclient is not
    connected, and a PM already waited out a reconnect,
    ``RECONNECT_WAIT``), so no request can reach any bot. A request then
    fails with this at once, its message the sender's reason (naming the
    bridge's own brclient, not the bot), instead of being re-sent until its
    deadline. ``sends``: copies of the request handed to a session before
    (a copy may have reached the bot before the connection went down)."""

    def __init__(self, message: str, *, sends: int = 0) -> None:
        super().__init__(message)
        self.sends = sends


@runtime_checkable
class OfflineAware(Protocol):
    """A :class:`~brmcp.PMSender` that can tell when it cannot reach Bison
    Relay at all (the daemon's :class:`~brmcp.clientrpc.patient.PatientSender`):
    ``offline_reason()`` is None while it can (or may), else one line saying
    why not and how to check, shown to the agent (no secret in it)."""

    def offline_reason(self) -> str | None: ...


def sender_offline(sender: object) -> str | None:
    """``sender.offline_reason()`` when ``sender`` is :class:`OfflineAware`
    and says it is offline, else None (also when asking it fails)."""
    if not isinstance(sender, OfflineAware):
        return None
    try:
        reason = sender.offline_reason()
    except Exception:
        return None
    return reason if isinstance(reason, str) and reason else None


class ToolListTooLarge(LinkError):
    """A bot's tool list (its ``tools/list`` pages, or the ``brmcp/tools``
    of a first-contact answer) is over one of :data:`MAX_TOOL_PAGES`,
    :data:`MAX_TOOLS`, :data:`MAX_TOOL_BYTES` or :data:`MAX_TOOL_LIST_BYTES`
    (the message names it). The list is refused as a whole: it is neither
    served nor persisted, and the snapshot in force (if any) stays."""


def json_bytes(model: BaseModel) -> int:
    """UTF-8 bytes of ``model`` as compact JSON by alias without None
    fields: the bot's JSON re-serialized (pydantic-core's encoder, one
    pass, nothing decoded), as the SDK writes it and a snapshot stores it."""
    return len(model.__pydantic_serializer__.to_json(model, by_alias=True, exclude_none=True))


class ToolListBudget:
    """One tool list counted against the bounds as its pages arrive:
    :meth:`page` raises :class:`ToolListTooLarge` at the first page that
    goes over, so a bot can make the link hold at most
    :data:`MAX_TOOL_LIST_BYTES` plus that page. ``what`` names the list in
    the error (``"tools/list"``, ``"first-contact brmcp/tools"``)."""

    __slots__ = ("bytes", "marks_refusals", "pages", "pool", "receipt_key", "tools", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        #: Pages, tools and JSON bytes (UTF-8) counted so far.
        self.pages = 0
        self.tools: list[Tool] = []
        self.bytes = 0
        #: The first page's ``_meta`` says ``"brmcp/marksRefusals": true``.
        self.marks_refusals = False
        #: The first page's ``brmcp/receiptKey`` (WIRE.md §Signed receipts), or None.
        self.receipt_key: str | None = None
        #: The first page's ``brmcp/pool`` announcement (WIRE.md §Pools), or None.
        self.pool: PoolAnnouncement | None = None

    def _refuse(self, detail: str) -> ToolListTooLarge:
        return ToolListTooLarge(f"{self.what}: {detail}; the whole list is refused")

    def page(self, page: ListToolsResult) -> None:
        """Count one page: its JSON (tools, ``nextCursor``, ``_meta``) and
        its tools. Raises :class:`ToolListTooLarge`."""
        self.pages += 1
        if self.pages > MAX_TOOL_PAGES:
            raise self._refuse(f"more than {MAX_TOOL_PAGES} pages (MAX_TOOL_PAGES)")
        if self.pages == 1:
            meta = page.meta
            self.marks_refusals = isinstance(meta, dict) and meta.get(MARKS_REFUSALS_KEY) is True
            self.receipt_key = receipt_key_from_meta(meta)
            self.pool = pool_from_meta(meta)
        if len(self.tools) + len(page.tools) > MAX_TOOLS:
            raise self._refuse(f"more than {MAX_TOOLS} tools (MAX_TOOLS)")
        size = json_bytes(page)
        if size > MAX_TOOL_BYTES:
            # Only a page this large can hold a tool over the bound.
            for tool in page.tools:
                one = json_bytes(tool)
                if one > MAX_TOOL_BYTES:
                    raise self._refuse(
                        f"tool {tool.name[:64]!r} is {one} bytes of JSON, over the "
                        f"{MAX_TOOL_BYTES}-byte bound on one tool (MAX_TOOL_BYTES)"
                    )
        self.bytes += size
        if self.bytes > MAX_TOOL_LIST_BYTES:
            raise self._refuse(
                f"over {MAX_TOOL_LIST_BYTES} bytes of JSON (MAX_TOOL_LIST_BYTES) "
                f"after {self.pages} page{'s' if self.pages > 1 else ''}"
            )
        self.tools.extend(page.tools)

    def more(self) -> None:
        """The last page named a next one: raises :class:`ToolListTooLarge`
        when :data:`MAX_TOOL_PAGES` pages were counted already (the next
        one is never asked for)."""
        if self.pages >= MAX_TOOL_PAGES:
            raise self._refuse(f"more than {MAX_TOOL_PAGES} pages (MAX_TOOL_PAGES)")

    def result(self) -> ListedTools:
        """The tools counted, with the list's ``marks_refusals``."""
        return ListedTools(
            self.tools, marks_refusals=self.marks_refusals, receipt_key=self.receipt_key, pool=self.pool
        )


class RateGate:
    """A token bucket bounding the notifications relayed from one bot: up
    to ``burst`` at once, then ``rate`` per second on ``clock`` (seconds;
    anyio's monotonic clock when None). :meth:`take` says whether one more
    may pass; the rest are dropped, and a run of drops is logged once (at
    warning level when it starts, at info level with its count when a
    notification passes again). ``what`` names the notifications in those
    lines."""

    __slots__ = ("_at", "_run", "_tokens", "burst", "clock", "dropped", "rate", "what")

    def __init__(
        self, what: str, *, burst: int, rate: float, clock: Callable[[], float] | None = None
    ) -> None:
        self.what = what
        self.burst = burst
        self.rate = rate
        #: The time source (seconds); replaceable, e.g. by a test's clock.
        self.clock: Callable[[], float] = clock if clock is not None else anyio.current_time
        self._tokens = float(burst)
        self._at: float | None = None
        self._run = 0
        #: Notifications dropped so far (observability and tests).
        self.dropped = 0

    def take(self) -> bool:
        """True when one more notification may pass now (it is counted)."""
        now = self.clock()
        if self._at is not None and now > self._at:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now if self._at is None else max(now, self._at)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            if self._run:
                log.info("bridge: %d %s dropped (over the rate bound)", self._run, self.what)
                self._run = 0
            return True
        if self._run == 0:
            log.warning(
                "bridge: a bot sent %s faster than %d at once and %g per second; dropping the rest",
                self.what,
                self.burst,
                self.rate,
            )
        self._run += 1
        self.dropped += 1
        return False


def no_answer_hint(bot: str, seconds: float, own_uid: str | None) -> str:
    """The message an agent gets when a bot does not answer ``initialize``
    (BRIDGE.md §Deadlines and re-sends, "Unanswered bots"): the two usual
    causes, named, with this bridge's own uid when it is known."""
    mine = own_uid if own_uid else "(this bridge's uid)"
    return (
        f"no answer from bot {bot} in {seconds:g} s: "
        f"is it online, and is your uid {mine} on its allowed_uids?"
    )


class LinkSessions(Protocol):
    """What the re-send loop (:class:`~._exchange.Resender`) uses of the
    sessions of its bot link (:class:`~.link.BotLink` provides it)."""

    @property
    def closed(self) -> bool:
        """True once the link is closed for good."""
        ...

    def lease(self) -> AbstractAsyncContextManager[tuple[ClientSession, int]]:
        """Use the shared session (dialing it first when needed): yields
        ``(session, generation)``; raises :class:`LinkError`."""
        ...

    def reset(self, gen: int | None = None) -> bool:
        """Drop session ``gen`` (the current one when None) so the next use
        dials afresh; True when something was reset."""
        ...

    def is_current(self, gen: int) -> bool:
        """True while session generation ``gen`` is the link's current one."""
        ...

    def era_refused(self, exc: BaseException, gen: int, *, probe: bool = False) -> bool:
        """True when ``exc`` (the bot's answer on session ``gen``) says the
        request needs the handshake era; the link then switches to it."""
        ...

    def host_offline(self) -> str | None:
        """Why the bridge cannot reach Bison Relay at all right now (its
        own brclient is down), or None (see :class:`HostOffline`)."""
        ...


class SnapshotSessions(LinkSessions, Protocol):
    """What the tool snapshot (:class:`~._toolsnap.ToolSnapshot`) uses of
    the sessions of its bot link, beyond :class:`LinkSessions`."""

    @property
    def own_uid(self) -> str | None:
        """This bridge's own uid, named in :func:`no_answer_hint` (None: unknown)."""
        ...

    @property
    def connected(self) -> bool:
        """True while an initialized session is current."""
        ...

    def session_era(self, gen: int) -> Era | None:
        """The era of session ``gen`` (None when it is gone)."""
        ...

    def is_current(self, gen: int) -> bool:
        """True while session ``gen`` is the link's current one."""
        ...

    def take_prefetched(self, gen: int) -> list[Tool] | None:
        """The tools the first contact of session ``gen`` brought (a
        :class:`~.snapshots.ListedTools`), handed over once; None when
        there are none (or ``gen`` is not current)."""
        ...

    def require_handshake(self, gen: int | None = None) -> None:
        """Use the handshake era with the bot from now on and reset session ``gen``."""
        ...


class Session:
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
        #: Tools a first contact brought (used by the next ``tools/list``): a
        #: :class:`~.snapshots.ListedTools` counted by :class:`ToolListBudget`.
        self.prefetched: list[Tool] | None = None
        self.session: ClientSession | None = None
        self.error: BaseException | None = None
        self.ready = anyio.Event()
        self.stop = anyio.Event()
        self.done = anyio.Event()
        self.users = 0
        self.retired = False


def describe_failure(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return describe_failure(exc.exceptions[0])
    if isinstance(exc, TimeoutError):
        return "no answer from the bot"
    return str(exc) or type(exc).__name__
