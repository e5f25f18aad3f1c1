"""Payments parked for the user's decision (BRIDGE.md §Spend log and approvals).

Kept in memory only: a restart drops every parked payment, which denies it
(the waiting call dies with the process). A payment withdrawn because its
agent went away (or its call was cancelled) is remembered by id, at most
:data:`MAX_WITHDRAWN` of them, so that a decision arriving for it later is
refused with :func:`withdrawn_text` instead of "unknown payment".
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from .clock import Clock

__all__ = ["MAX_WITHDRAWN", "ApprovalQueue", "Decision", "PendingPayment", "withdrawn_text"]

log = logging.getLogger("brmcp.bridge")

#: How a parked payment ended.
Decision = Literal["approved", "denied", "timeout"]
#: Withdrawn payment ids remembered (oldest forgotten first).
MAX_WITHDRAWN = 256


def withdrawn_text(payment_id: str) -> str:
    """The refusal of a decision for a withdrawn payment (the admin API's
    409 ``error``, the CLI's line, the approvals page)."""
    return f"payment {payment_id} was withdrawn: the agent went away; nothing was paid"


@dataclass(frozen=True, slots=True)
class PendingPayment:
    """A payment waiting for approval: ``id`` (16 hex), payee ``bot`` uid,
    ``tool``, ``atoms`` and ``created`` (unix seconds, the bridge clock)."""

    id: str
    bot: str
    tool: str
    atoms: int
    created: int

    def to_dict(self) -> dict[str, Any]:
        """The JSON object in the Go key order."""
        return {
            "id": self.id,
            "bot": self.bot,
            "tool": self.tool,
            "atoms": self.atoms,
            "created": self.created,
        }


class _Parked:
    __slots__ = ("approved", "event", "payment")

    def __init__(self, payment: PendingPayment) -> None:
        self.payment = payment
        self.event = anyio.Event()
        self.approved = False


class ApprovalQueue:
    """Parks payments until :meth:`resolve`, a timeout, or cancellation."""

    def __init__(self, clock: Clock, on_change: Callable[[], None] | None = None) -> None:
        self._clock = clock
        self._parked: dict[str, _Parked] = {}
        self._withdrawn: OrderedDict[str, None] = OrderedDict()
        self._on_change = on_change

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def pending(self) -> list[PendingPayment]:
        """Parked payments sorted by ``created``, then ``id``."""
        return sorted((p.payment for p in self._parked.values()), key=lambda p: (p.created, p.id))

    def resolve(self, payment_id: str, approve: bool) -> bool:
        """Deliver a decision. False for an unknown or withdrawn id (see
        :meth:`withdrawn`); the first decision wins and repeats are ignored
        (still True while the payment is parked)."""
        parked = self._parked.get(payment_id)
        if parked is None:
            return False
        if not parked.event.is_set():
            parked.approved = approve
            parked.event.set()
        return True

    def withdrawn(self, payment_id: str) -> str | None:
        """:func:`withdrawn_text` when ``payment_id`` was withdrawn recently
        (its agent went away or its call was cancelled, so nothing was paid
        and a decision can no longer count), else None."""
        return withdrawn_text(payment_id) if payment_id in self._withdrawn else None

    def note_withdrawn(self, payment_id: str) -> None:
        """Remember ``payment_id`` as withdrawn (also one already decided:
        an approval that came while the agent's connection was detached,
        after which the agent did not come back). Keeps the newest
        :data:`MAX_WITHDRAWN`."""
        self._withdrawn[payment_id] = None
        self._withdrawn.move_to_end(payment_id)
        while len(self._withdrawn) > MAX_WITHDRAWN:
            self._withdrawn.popitem(last=False)

    async def wait(
        self,
        *,
        bot: str,
        tool: str,
        atoms: int,
        timeout_secs: float,
        on_parked: Callable[[PendingPayment], None] | None = None,
    ) -> Decision:
        """Park a payment and wait for a decision or ``timeout_secs`` seconds on
        the bridge clock; ``on_parked`` is called with the payment once it is
        listed, and the queue's ``on_change`` whenever a payment is listed or
        removed. The entry is removed however the wait ends; when the calling
        task is cancelled before a decision (its agent went away, the call
        was cancelled, the bridge is closing) the id is remembered as
        withdrawn (:meth:`withdrawn`)."""
        payment_id = secrets.token_hex(8)
        while payment_id in self._parked:
            payment_id = secrets.token_hex(8)
        payment = PendingPayment(payment_id, bot, tool, atoms, int(self._clock.now()))
        parked = _Parked(payment)
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
                self.note_withdrawn(payment_id)
            log.info("payment %s %s", payment_id, outcome)
            self._changed()
