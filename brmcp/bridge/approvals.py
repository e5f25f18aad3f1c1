"""Payments parked for the user's decision (BRIDGE.md §Spend log and approvals).

Kept in memory only: a restart drops every parked payment, which denies it
(the waiting call dies with the process).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from .clock import Clock

__all__ = ["ApprovalQueue", "Decision", "PendingPayment"]

log = logging.getLogger("brmcp.bridge")

#: How a parked payment ended.
Decision = Literal["approved", "denied", "timeout"]


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
        self._on_change = on_change

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def pending(self) -> list[PendingPayment]:
        """Parked payments sorted by ``created``, then ``id``."""
        return sorted((p.payment for p in self._parked.values()), key=lambda p: (p.created, p.id))

    def resolve(self, payment_id: str, approve: bool) -> bool:
        """Deliver a decision. False for an unknown id; the first decision
        wins and repeats are ignored (still True while the payment is
        parked)."""
        parked = self._parked.get(payment_id)
        if parked is None:
            return False
        if not parked.event.is_set():
            parked.approved = approve
            parked.event.set()
        return True

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
        removed. The entry is removed however the wait ends (including
        cancellation of the calling task)."""
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
            log.info("payment %s %s", payment_id, outcome)
            self._changed()
