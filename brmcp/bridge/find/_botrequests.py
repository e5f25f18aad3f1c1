"""Add-bot requests parked for the user's decision (BRIDGE.md §Finding bots
through directories, "Agents discover, users decide").

An agent on the bridge's discovery endpoint (:mod:`.agentdiscovery`, tool
``request_bot``) asks for one bot uid to be added; the request waits here
until the user approves or denies it (``brmcp-bridge approvals``, the admin
route ``POST /admin/bot-requests/<id>``, the approvals page) or
``approval_timeout_secs`` pass on the bridge clock. Kept in memory only, as
parked payments are: a restart drops every pending request.

The rules:

* a uid the bridge already reaches (on ``allowed_bots`` or ``directories``)
  is answered at once, nothing parked;
* the same uid asked twice while pending is one request: every waiter gets
  the one decision;
* at most :data:`MAX_PENDING` requests wait at once; one more is refused at
  once (:class:`BotRequestRefused`);
* the reason is a stranger's text: characters that do not print are
  dropped and it is cut at :data:`MAX_REASON_CHARS` characters;
* approval only puts that one uid on ``allowed_bots`` through the host's
  settings commit (:meth:`BotRequestHost.allow_bot`, the path ``brmcp-bridge
  add`` takes); nothing in a request sets a cap or any other setting; when
  the bridge's brclient has no key exchange with the uid yet, the directory
  ``via`` (else each configured directory in turn) is asked for an
  introduction, as ``add`` does, and the answer tells the user to accept the
  KX suggestion in brclient;
* a waiter that goes away (its agent disconnected, cancelled the call or
  ended its session) withdraws its wait; when no waiter remains the request
  is withdrawn (outcome ``"withdrawn"``): like a parked payment, nothing is
  decided for an agent that is not there;
* every end (approved, denied, timed out, withdrawn) is logged at INFO and
  kept in :meth:`BotRequestQueue.recent` (the newest :data:`MAX_ENDED`).
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio
import anyio.abc

from brmcp._ops.clock import Clock, go_duration
from brmcp.bridge.base import Settings, is_uid

from ._answers import Introduction
from ._contacts import ContactsUnavailable
from ._discovery import DiscoveryError

__all__ = [
    "CONTACT_CHECK_TIMEOUT",
    "MAX_AGENT_CHARS",
    "MAX_ENDED",
    "MAX_PENDING",
    "MAX_REASON_CHARS",
    "BotRequest",
    "BotRequestAnswer",
    "BotRequestHost",
    "BotRequestQueue",
    "BotRequestRefused",
    "EndedBotRequest",
    "RequestEnded",
    "RequestOutcome",
    "UnknownRequest",
    "clean_text",
]

log = logging.getLogger("brmcp.bridge")

#: Most add-bot requests pending at once.
MAX_PENDING = 16
#: Longest reason kept (characters, after dropping those that do not print).
MAX_REASON_CHARS = 200
#: Longest agent name kept (the MCP client name and version it gave).
MAX_AGENT_CHARS = 64
#: Ended requests remembered (oldest forgotten first).
MAX_ENDED = 256
#: Wall seconds the contact look-up of a new request may take (then ``contact`` stays null).
CONTACT_CHECK_TIMEOUT = 5.0

#: How a request ended.
RequestOutcome = Literal["approved", "denied", "timed out", "withdrawn"]


def clean_text(value: str, limit: int) -> str:
    """``value`` with characters that do not print dropped, then cut to at
    most ``limit`` characters (a stranger's text for a terminal or a page)."""
    kept = "".join(ch for ch in value if ch.isprintable())
    return kept[:limit]


class BotRequestRefused(Exception):
    """A request that is not parked (too many pending, a ``via`` that is not
    a configured directory): the message is one line for the agent."""


class UnknownRequest(Exception):
    """No request with that id is pending or remembered (the admin route's 404)."""


class RequestEnded(Exception):
    """A decision for a request that already ended (the admin route's 409);
    ``outcome`` is how it ended."""

    def __init__(self, request_id: str, outcome: RequestOutcome) -> None:
        super().__init__(f"bot request {request_id} already ended ({outcome}); a decision no longer counts")
        self.outcome = outcome


class BotRequestHost(Protocol):
    """What the queue needs from the bridge (the :class:`~brmcp.bridge.Bridge`)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def cli_command(self) -> str: ...

    async def allow_bot(self, uid: str) -> None:
        """Put ``uid`` (64 lowercase hex) on ``allowed_bots`` and persist it,
        changing nothing else. Raises :class:`~.errors.BridgeError`."""
        ...

    async def bot_contact(self, uid: str) -> bool | None:
        """Whether brclient has a key exchange with ``uid``; None: it cannot
        tell. Raises :class:`~.discovery.ContactsUnavailable`."""
        ...

    async def introduce_bot(self, uid: str, via: str | None) -> Introduction:
        """Ask a directory for a KX suggestion toward ``uid``. Raises
        :class:`~.discovery.DiscoveryError`."""
        ...

    def _task_group(self) -> anyio.abc.TaskGroup: ...


@dataclass(frozen=True, slots=True)
class BotRequest:
    """A pending add-bot request: ``id`` (16 hex), the bot ``uid`` (64
    lowercase hex), the agent's ``reason`` (cleaned), ``via`` (a directory
    uid or None), ``agent`` (the MCP client name it gave, cleaned),
    ``requested_at`` and ``expires_at`` (unix seconds, the bridge clock) and
    ``contact`` (whether brclient has a key exchange with the uid; None:
    not known)."""

    id: str
    uid: str
    reason: str
    via: str | None
    agent: str
    requested_at: float
    expires_at: float
    contact: bool | None

    def to_dict(self) -> dict[str, Any]:
        """``{"id", "uid", "reason", "via", "agent", "requestedAt",
        "expiresAt", "contact"}`` (times in whole unix seconds)."""
        return {
            "id": self.id,
            "uid": self.uid,
            "reason": self.reason,
            "via": self.via,
            "agent": self.agent,
            "requestedAt": int(self.requested_at),
            "expiresAt": int(self.expires_at),
            "contact": self.contact,
        }


@dataclass(frozen=True, slots=True)
class EndedBotRequest:
    """How a request ended: ``outcome`` at ``ended_at`` (unix seconds, the
    bridge clock)."""

    request: BotRequest
    outcome: RequestOutcome
    ended_at: float

    def to_dict(self) -> dict[str, Any]:
        """``{"id", "uid", "outcome", "endedAt"}``."""
        return {
            "id": self.request.id,
            "uid": self.request.uid,
            "outcome": self.outcome,
            "endedAt": int(self.ended_at),
        }


@dataclass(frozen=True, slots=True)
class BotRequestAnswer:
    """What the agent is told: ``outcome`` (``"approved"``, ``"denied"``,
    ``"timed out"`` or ``"already allowed"``), the ``uid``, the request
    ``id`` (None when nothing was parked), whether the user still has to
    accept a KX suggestion in brclient (``kx_pending``) and ``text``, one
    paragraph saying all of it."""

    outcome: str
    uid: str
    id: str | None
    text: str
    kx_pending: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``{"outcome", "uid", "id", "kxPending", "text"}``."""
        return {
            "outcome": self.outcome,
            "uid": self.uid,
            "id": self.id,
            "kxPending": self.kx_pending,
            "text": self.text,
        }


class _Pending:
    __slots__ = ("answer", "contact", "deciding", "done", "ended", "request", "waiters")

    def __init__(self, request: BotRequest) -> None:
        self.request = request
        self.contact = request.contact
        self.waiters = 0
        self.deciding = False
        self.ended: EndedBotRequest | None = None
        self.answer: BotRequestAnswer | None = None
        #: Set once the outcome and its answer (after any introduction) are known.
        self.done = anyio.Event()

    def shown(self) -> BotRequest:
        return BotRequest(
            self.request.id,
            self.request.uid,
            self.request.reason,
            self.request.via,
            self.request.agent,
            self.request.requested_at,
            self.request.expires_at,
            self.contact,
        )


class BotRequestQueue:
    """Parks add-bot requests of agents until the user decides
    (:meth:`decide`), ``approval_timeout_secs`` pass on ``clock``, or every
    waiter went away. ``on_change`` is called whenever a request is listed
    or ends (the approvals page's change notifier)."""

    def __init__(
        self, host: BotRequestHost, clock: Clock, on_change: Callable[[], None] | None = None
    ) -> None:
        self._host = host
        self._clock = clock
        self._on_change = on_change
        self._pending: dict[str, _Pending] = {}
        self._ended: OrderedDict[str, EndedBotRequest] = OrderedDict()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def pending(self) -> list[BotRequest]:
        """Pending requests, oldest first (then by id)."""
        return sorted((p.shown() for p in self._pending.values()), key=lambda r: (r.requested_at, r.id))

    def recent(self, limit: int = 32) -> list[EndedBotRequest]:
        """At most ``limit`` ended requests, the newest first."""
        return list(reversed(self._ended.values()))[:limit]

    def ended(self, request_id: str) -> EndedBotRequest | None:
        """How ``request_id`` ended, or None while pending, unknown or forgotten."""
        return self._ended.get(request_id)

    def _by_uid(self, uid: str) -> _Pending | None:
        return next((p for p in self._pending.values() if p.request.uid == uid), None)

    def _end(self, parked: _Pending, outcome: RequestOutcome) -> EndedBotRequest:
        ended = EndedBotRequest(parked.shown(), outcome, self._clock.now())
        parked.ended = ended
        self._pending.pop(parked.request.id, None)
        self._ended[parked.request.id] = ended
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)
        log.info("bot request %s for %s: %s", parked.request.id, parked.request.uid[:16], outcome)
        self._changed()
        return ended

    async def request(
        self, uid: str, *, reason: str = "", via: str | None = None, agent: str = ""
    ) -> BotRequestAnswer:
        """Ask for ``uid`` (64 hex) to be added and wait for the outcome.
        ``reason`` and ``agent`` are cleaned (:func:`clean_text`); ``via``
        must be a configured directory. Raises ValueError for a malformed
        uid or ``via``, :class:`BotRequestRefused` when
        :data:`MAX_PENDING` wait already or ``via`` is not configured.
        Cancellation (the agent went away) withdraws this wait."""
        if not is_uid(uid):
            raise ValueError(f"uid: {uid[:80]!r} is not a 64-hex Bison Relay uid")
        uid = uid.lower()
        settings = self._host.settings
        if settings.allows(uid):
            return BotRequestAnswer(
                "already allowed",
                uid,
                None,
                f"bot {uid} is already reachable through this bridge at /mcp/{uid}; nothing was asked",
            )
        if via is not None:
            if not is_uid(via):
                raise ValueError(f"via: {via[:80]!r} is not a 64-hex directory uid")
            via = via.lower()
            if not settings.is_directory(via):
                raise BotRequestRefused(
                    f"via: {via} is not one of the directories this bridge's user configured"
                )
        parked = self._by_uid(uid)
        if parked is None:
            if len(self._pending) >= MAX_PENDING:
                raise BotRequestRefused(
                    f"{MAX_PENDING} add-bot requests already wait for the user's decision; ask again "
                    "once the user has decided some"
                )
            request_id = secrets.token_hex(8)
            while request_id in self._pending or request_id in self._ended:
                request_id = secrets.token_hex(8)
            now = self._clock.now()
            timeout = float(settings.normalized().approval_timeout_secs)
            parked = _Pending(
                BotRequest(
                    request_id,
                    uid,
                    clean_text(reason, MAX_REASON_CHARS),
                    via,
                    clean_text(agent, MAX_AGENT_CHARS),
                    now,
                    now + timeout,
                    None,
                )
            )
            self._pending[request_id] = parked
            log.info(
                "bot request %s: an agent asks to add %s; decide with: %s approvals approve %s (or deny)",
                request_id,
                uid[:16],
                self._host.cli_command,
                request_id,
            )
            self._changed()
        parked.waiters += 1
        try:
            if parked.waiters == 1 and parked.contact is None:
                self._host._task_group().start_soon(self._look_up_contact, parked)
            return await self._wait(parked)
        finally:
            parked.waiters -= 1
            if parked.waiters == 0 and parked.ended is None and not parked.deciding:
                self._end(parked, "withdrawn")
                parked.done.set()

    async def _look_up_contact(self, parked: _Pending) -> None:
        try:
            with anyio.move_on_after(CONTACT_CHECK_TIMEOUT):
                contact = await self._host.bot_contact(parked.request.uid)
                if parked.ended is None:
                    parked.contact = contact
                    self._changed()
        except ContactsUnavailable as exc:
            log.info("bot request %s: cannot tell whether it is a contact: %s", parked.request.id, exc)

    async def _wait(self, parked: _Pending) -> BotRequestAnswer:
        async with anyio.create_task_group() as tg:

            async def expire() -> None:
                await self._clock.sleep(max(0.0, parked.request.expires_at - self._clock.now()))
                if parked.ended is None and not parked.deciding:
                    self._end(parked, "timed out")
                    parked.done.set()

            tg.start_soon(expire)
            await parked.done.wait()
            tg.cancel_scope.cancel()
        return self._answer(parked)

    def _answer(self, parked: _Pending) -> BotRequestAnswer:
        if parked.answer is not None:
            return parked.answer
        assert parked.ended is not None
        uid, rid = parked.request.uid, parked.request.id
        outcome = parked.ended.outcome
        if outcome == "denied":
            text = (
                f"the user denied adding bot {uid} (request {rid}); do not ask again for it unless "
                "the user says so"
            )
        elif outcome == "timed out":
            waited = go_duration(parked.request.expires_at - parked.request.requested_at)
            text = (
                f"the user did not decide on adding bot {uid} (request {rid}) within {waited}; "
                "it was not added"
            )
        else:
            text = f"request {rid} for bot {uid} ended: {outcome}"
        return BotRequestAnswer(outcome, uid, rid, text)

    async def decide(self, request_id: str, approve: bool) -> EndedBotRequest:
        """The user's decision. Approval puts the uid on ``allowed_bots``
        (and nothing else) before this returns; an introduction, when the
        bridge's brclient has no key exchange with it, then runs in the
        bridge's task group and the waiting agents are answered once it is
        done. Raises :class:`UnknownRequest`, :class:`RequestEnded` (already
        decided, timed out or withdrawn) or, when the settings cannot be
        written, the host's :class:`~.errors.BridgeError` (the request stays
        pending)."""
        ended = self._ended.get(request_id)
        if ended is not None:
            raise RequestEnded(request_id, ended.outcome)
        parked = self._pending.get(request_id)
        if parked is None:
            raise UnknownRequest(f"unknown bot request {request_id[:40]!r}")
        if parked.deciding:
            raise RequestEnded(request_id, "approved")  # an approval is being applied
        if not approve:
            result = self._end(parked, "denied")
            parked.done.set()
            return result
        parked.deciding = True
        try:
            # Shielded: once the uid is on allowed_bots the request must end approved.
            with anyio.CancelScope(shield=True):
                await self._host.allow_bot(parked.request.uid)
        except Exception:
            parked.deciding = False
            if parked.waiters == 0 and parked.ended is None:
                self._end(parked, "withdrawn")
                parked.done.set()
            raise
        result = self._end(parked, "approved")
        try:
            self._host._task_group().start_soon(self._after_approval, parked)
        except RuntimeError:
            # The bridge is closing: the waiters are told the bare decision.
            parked.done.set()
        return result

    async def _after_approval(self, parked: _Pending) -> None:
        """Introduce when there is no key exchange yet, then answer the waiters."""
        uid, rid, via = parked.request.uid, parked.request.id, parked.request.via
        base = f"the user approved adding bot {uid} (request {rid}); call it at /mcp/{uid} of this bridge"
        kx_pending = False
        try:
            try:
                contact = await self._host.bot_contact(uid)
            except ContactsUnavailable as exc:
                contact = None
                log.info("bot request %s: cannot tell whether %s is a contact: %s", rid, uid[:16], exc)
            if contact is False:
                kx_pending = True
                try:
                    intro = await self._host.introduce_bot(uid, via)
                    text = (
                        f"{base} once the user has accepted the KX suggestion directory {intro.via} sent "
                        "(in brclient: the /mi command it shows); until then calls fail as unreachable"
                    )
                except DiscoveryError as exc:
                    text = (
                        f"{base} once a key exchange with it exists; no directory could introduce it "
                        f"({clean_text(str(exc), 300)}); the user must KX with it in brclient"
                    )
            else:
                text = base
            parked.answer = BotRequestAnswer("approved", uid, rid, text, kx_pending=kx_pending)
        finally:
            if parked.answer is None:
                parked.answer = BotRequestAnswer("approved", uid, rid, base, kx_pending=kx_pending)
            parked.done.set()
