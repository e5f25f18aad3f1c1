"""Payments parked for the user's decision (BRIDGE.md §Spend log and approvals).

Kept in memory only: a restart drops every parked payment, which denies it
(the waiting call dies with the process). How each payment ended (approved,
denied, timed out, or withdrawn because its agent went away or its call was
cancelled) is remembered by id, at most :data:`MAX_ENDED` of them, so that
the approvals page can confirm a decision and a decision arriving later is
refused with the reason (:meth:`ApprovalQueue.late`) instead of "unknown
payment".

A parked payment carries the arguments of the tool call it pays for, as
bounded, display-safe JSON text (:func:`describe_arguments`): the code that
parks a call's payment wraps it in :func:`call_arguments`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Literal

import anyio

from brmcp._ops.clock import Clock, go_duration

from ._spend import SpendEntry, SpendTicket

__all__ = [
    "MAX_ARGUMENT_CHARS",
    "MAX_ENDED",
    "MAX_WITHDRAWN",
    "ApprovalQueue",
    "Decision",
    "EndedPayment",
    "Outcome",
    "PendingPayment",
    "call_arguments",
    "describe_arguments",
    "withdrawn_text",
]

log = logging.getLogger("brmcp.bridge")

#: How a parked payment's wait ended, as :meth:`ApprovalQueue.wait` returns it.
Decision = Literal["approved", "denied", "timeout"]
#: How a parked payment ended, as :class:`EndedPayment` records it.
Outcome = Literal["approved", "denied", "timeout", "withdrawn"]
#: Ended payments remembered (oldest forgotten first).
MAX_ENDED = 256
#: The former name of :data:`MAX_ENDED` (withdrawn ids are among the ended ones).
MAX_WITHDRAWN = MAX_ENDED
#: Longest argument text kept with a parked payment (characters, about 4 KiB).
MAX_ARGUMENT_CHARS = 4096
#: Longest string value (and key) shown in the arguments, in characters.
MAX_VALUE_CHARS = 256
#: Most items shown of one array or object in the arguments.
MAX_ITEMS = 32
#: Deepest nesting shown in the arguments.
MAX_DEPTH = 8

_CALL_ARGUMENTS: ContextVar[Mapping[str, Any] | None] = ContextVar("brmcp_call_arguments", default=None)


def withdrawn_text(payment_id: str) -> str:
    """The refusal of a decision for a withdrawn payment (the admin API's
    409 ``error``, the CLI's line, the approvals page)."""
    return f"payment {payment_id} was withdrawn: the agent went away; nothing was paid"


@contextlib.contextmanager
def call_arguments(arguments: Mapping[str, Any] | None) -> Iterator[None]:
    """Within this block (and the tasks started in it), a payment parked by
    :meth:`ApprovalQueue.wait` without explicit ``arguments`` shows these:
    the arguments of the tool call the payment is for."""
    token = _CALL_ARGUMENTS.set(arguments)
    try:
        yield
    finally:
        _CALL_ARGUMENTS.reset(token)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit} chars)"


def _bounded(value: Any, depth: int) -> Any:
    """``value`` with long strings clipped, long arrays and objects cut and
    deep nesting elided (a marker string says what was left out)."""
    if isinstance(value, str):
        return _clip(value, MAX_VALUE_CHARS)
    if isinstance(value, bool | int | float) or value is None:
        return value
    if depth >= MAX_DEPTH:
        return "… (nested too deep)"
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for index, (key, item) in enumerate(value.items()):
            if index >= MAX_ITEMS:
                out["…"] = f"(+{len(value) - MAX_ITEMS} more keys)"
                break
            out[_clip(str(key), MAX_VALUE_CHARS)] = _bounded(item, depth + 1)
        return out
    if isinstance(value, list | tuple):
        items = [_bounded(item, depth + 1) for item in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            items.append(f"… (+{len(value) - MAX_ITEMS} more items)")
        return items
    return _clip(str(value), MAX_VALUE_CHARS)


def _visible(ch: str) -> str:
    """``ch`` itself when it prints (or is a line break), else its JSON
    escape (control, format and bidi characters such as U+202E)."""
    if ch.isprintable() or ch == "\n":
        return ch
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def describe_arguments(arguments: Mapping[str, Any] | None) -> str | None:
    """A tool call's ``arguments`` as indented JSON for the user to read:
    strings and keys clipped at :data:`MAX_VALUE_CHARS` characters, arrays
    and objects at :data:`MAX_ITEMS` items, nesting at :data:`MAX_DEPTH`,
    characters that do not print escaped (``\\uXXXX``), and the whole text at
    :data:`MAX_ARGUMENT_CHARS` characters (then ending with a line saying
    so). None when there are no arguments to show (``None``). The text is
    what an agent sent: display it as text, never as markup."""
    if arguments is None:
        return None
    text = json.dumps(_bounded(arguments, 0), indent=2, ensure_ascii=False, default=str)
    text = "".join(_visible(ch) for ch in text)
    if len(text) > MAX_ARGUMENT_CHARS:
        text = f"{text[:MAX_ARGUMENT_CHARS]}\n… (cut at {MAX_ARGUMENT_CHARS} of {len(text)} characters)"
    return text


@dataclass(frozen=True, slots=True)
class PendingPayment:
    """A payment waiting for approval: ``id`` (16 hex), payee ``bot`` uid,
    ``tool``, ``atoms`` and ``created`` (unix seconds, the bridge clock);
    ``arguments``: the call's arguments from :func:`describe_arguments`
    (None: not known, e.g. a prepayment); ``expires``: when the wait ends
    unanswered (unix seconds, the bridge clock; None: not known)."""

    id: str
    bot: str
    tool: str
    atoms: int
    created: int
    arguments: str | None = None
    expires: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object in the Go key order (the Go reference's fields only)."""
        return {
            "id": self.id,
            "bot": self.bot,
            "tool": self.tool,
            "atoms": self.atoms,
            "created": self.created,
        }


@dataclass(frozen=True, slots=True)
class EndedPayment:
    """How a parked payment ended: ``outcome``, at ``ended`` (unix seconds,
    the bridge clock), after waiting at most ``timeout_secs`` seconds. For
    an approved payment, what became of it once approved (as
    :meth:`ApprovalQueue.ended` and :meth:`ApprovalQueue.recent` read it,
    at that moment): ``spend``, its entry in the spend log (``status``
    ``pending``, ``paid`` or ``failed``, with ``err``), ``paying`` while
    this process makes it, or ``not_paid``, why it was not made after all
    (a cap lowered or the bot de-listed meanwhile; None when it was, or
    when it is still waiting to start)."""

    payment: PendingPayment
    outcome: Outcome
    ended: float
    timeout_secs: float
    spend: SpendEntry | None = None
    paying: bool = False
    not_paid: str | None = None

    def late_text(self) -> str:
        """Why a decision for this payment no longer counts (the 409 text)."""
        pid = self.payment.id
        if self.outcome == "withdrawn":
            return withdrawn_text(pid)
        if self.outcome == "timeout":
            return (
                f"too late: payment {pid} timed out after {go_duration(self.timeout_secs)} without a "
                "decision; nothing was paid and the agent was told the approval timed out"
            )
        return f"payment {pid} was already {self.outcome}; a second decision does not count"


class _Parked:
    __slots__ = ("approved", "event", "payment", "timeout_secs")

    def __init__(self, payment: PendingPayment, timeout_secs: float) -> None:
        self.payment = payment
        self.timeout_secs = timeout_secs
        self.event = anyio.Event()
        self.approved = False


class ApprovalQueue:
    """Parks payments until :meth:`resolve`, a timeout, or cancellation."""

    def __init__(self, clock: Clock, on_change: Callable[[], None] | None = None) -> None:
        self._clock = clock
        self._parked: dict[str, _Parked] = {}
        self._ended: OrderedDict[str, EndedPayment] = OrderedDict()
        #: Approved payment id → its spend entry (as it changes), or why it was not made.
        self._spends: dict[str, SpendTicket] = {}
        self._not_paid: dict[str, str] = {}
        self._on_change = on_change

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def pending(self) -> list[PendingPayment]:
        """Parked payments sorted by ``created``, then ``id``."""
        return sorted((p.payment for p in self._parked.values()), key=lambda p: (p.created, p.id))

    def resolve(self, payment_id: str, approve: bool) -> bool:
        """Deliver a decision. False for an unknown or ended id (see
        :meth:`late`); the first decision wins and repeats are ignored
        (still True while the payment is parked; :meth:`ended` tells which
        decision counted)."""
        parked = self._parked.get(payment_id)
        if parked is None:
            return False
        if not parked.event.is_set():
            parked.approved = approve
            parked.event.set()
            self._remember(parked.payment, "approved" if approve else "denied", parked.timeout_secs)
        return True

    def ended(self, payment_id: str) -> EndedPayment | None:
        """How ``payment_id`` ended (a decision counts from the moment it is
        made), or None while it waits or when it is unknown or forgotten;
        an approved one with what became of it so far (:class:`EndedPayment`)."""
        ended = self._ended.get(payment_id)
        return self._with_spend(ended) if ended is not None else None

    def note_spend(self, payment_id: str, ticket: SpendTicket) -> None:
        """The approved payment ``payment_id`` was recorded in the spend log
        as ``ticket`` and is being made: its outcome is read from there."""
        if payment_id in self._ended:
            self._spends[payment_id] = ticket
            self._changed()

    def note_not_paid(self, payment_id: str, reason: str) -> None:
        """The approved payment ``payment_id`` was not made after all
        (``reason``, e.g. the per-call cap was lowered meanwhile)."""
        if payment_id in self._ended:
            self._spends.pop(payment_id, None)
            self._not_paid[payment_id] = reason
            self._changed()

    def _with_spend(self, ended: EndedPayment) -> EndedPayment:
        pid = ended.payment.id
        ticket = self._spends.get(pid)
        if ticket is not None:
            return replace(ended, spend=ticket.entry, paying=ticket.live)
        reason = self._not_paid.get(pid)
        return replace(ended, not_paid=reason) if reason is not None else ended

    def recent(self, since: float, limit: int) -> list[EndedPayment]:
        """At most ``limit`` payments that ended at or after ``since`` (unix
        seconds, the bridge clock), the newest first (a withdrawn id whose
        payment was already forgotten is left out)."""
        out: list[EndedPayment] = []
        for ended in reversed(self._ended.values()):
            if len(out) >= limit:
                break
            if ended.ended >= since and ended.payment.bot:
                out.append(self._with_spend(ended))
        return out

    def late(self, payment_id: str) -> str | None:
        """Why a decision for ``payment_id`` can no longer count
        (:meth:`EndedPayment.late_text`) when it ended recently, else None."""
        ended = self._ended.get(payment_id)
        return ended.late_text() if ended is not None else None

    def withdrawn(self, payment_id: str) -> str | None:
        """:func:`withdrawn_text` when ``payment_id`` was withdrawn recently
        (its agent went away or its call was cancelled, so nothing was paid
        and a decision can no longer count), else None."""
        ended = self._ended.get(payment_id)
        return withdrawn_text(payment_id) if ended is not None and ended.outcome == "withdrawn" else None

    def note_withdrawn(self, payment_id: str) -> None:
        """Remember ``payment_id`` as withdrawn (also one already decided:
        an approval that came while the agent's connection was detached,
        after which the agent did not come back). Keeps the newest
        :data:`MAX_ENDED` ended payments."""
        known = self._ended.get(payment_id)
        if known is not None:
            self._remember(known.payment, "withdrawn", known.timeout_secs)
        else:
            self._remember(PendingPayment(payment_id, "", "", 0, 0), "withdrawn", 0.0)
        self._changed()

    def _remember(self, payment: PendingPayment, outcome: Outcome, timeout_secs: float) -> None:
        self._ended[payment.id] = EndedPayment(payment, outcome, self._clock.now(), timeout_secs)
        self._ended.move_to_end(payment.id)
        while len(self._ended) > MAX_ENDED:
            forgotten, _ = self._ended.popitem(last=False)
            self._spends.pop(forgotten, None)
            self._not_paid.pop(forgotten, None)

    async def wait(
        self,
        *,
        bot: str,
        tool: str,
        atoms: int,
        timeout_secs: float,
        on_parked: Callable[[PendingPayment], None] | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> Decision:
        """Park a payment and wait for a decision or ``timeout_secs`` seconds on
        the bridge clock; ``on_parked`` is called with the payment once it is
        listed, and the queue's ``on_change`` whenever a payment is listed or
        removed. ``arguments`` are the call's (default: those of the
        enclosing :func:`call_arguments`), shown through
        :func:`describe_arguments`. The entry is removed however the wait
        ends, and how it ended is remembered (:meth:`ended`); when the
        calling task is cancelled before a decision (its agent went away,
        the call was cancelled, the bridge is closing) it counts as
        withdrawn (:meth:`withdrawn`)."""
        payment_id = secrets.token_hex(8)
        while payment_id in self._parked or payment_id in self._ended:
            payment_id = secrets.token_hex(8)
        shown = describe_arguments(arguments if arguments is not None else _CALL_ARGUMENTS.get())
        now = self._clock.now()
        payment = PendingPayment(payment_id, bot, tool, atoms, int(now), shown, now + timeout_secs)
        parked = _Parked(payment, timeout_secs)
        self._parked[payment_id] = parked
        outcome = "withdrawn (the call ended)"
        try:
            if on_parked is not None:
                on_parked(payment)
            self._changed()
            decided = False
            async with anyio.create_task_group() as tg:

                async def _await_decision() -> None:
                    nonlocal decided
                    await parked.event.wait()
                    decided = True
                    tg.cancel_scope.cancel()

                tg.start_soon(_await_decision)
                await self._clock.sleep(timeout_secs)
                tg.cancel_scope.cancel()
            if not decided and parked.event.is_set():
                decided = True
            if not decided:
                outcome = "timed out"
                return "timeout"
            outcome = "approved" if parked.approved else "denied"
            return "approved" if parked.approved else "denied"
        finally:
            self._parked.pop(payment_id, None)
            if outcome.startswith("withdrawn"):
                self._remember(payment, "withdrawn", timeout_secs)
            elif outcome == "timed out":
                self._remember(payment, "timeout", timeout_secs)
            log.info("payment %s %s", payment_id, outcome)
            self._changed()
