"""How a provider's :class:`~._registrant.Registrant` pays a directory: the
:class:`Payer` it is given, and :class:`ClientTipPayer`, one over brclient
tips."""

from __future__ import annotations

from typing import Protocol

from brmcp._ops.clock import Clock
from brmcp.clientrpc import Client, TipProgressEvent
from brmcp.clientrpc.tipmatcher import TipMatcher
from brmcp.clientrpc.tippayer import TipPayer

__all__ = ["ClientTipPayer", "Payer"]


class Payer(Protocol):
    """Moves money to a directory (like :class:`brmcp.bridge.Payer`):
    ``pay`` returns once ``atoms`` atoms reached ``payee_uid`` and raises
    with a human-readable reason otherwise."""

    async def pay(self, payee_uid: str, atoms: int) -> None:
        """Pay ``atoms`` atoms to ``payee_uid`` (64 lowercase hex)."""
        ...


class ClientTipPayer:
    """A :class:`Payer` over brclient tips (``PaymentsService.TipUser``
    through :class:`brmcp.bridge.TipPayer`, BRIDGE.md §Running the daemon),
    confirmed by the matching terminal tip-progress event. The host feeds
    every tip-progress event of ``client`` to :meth:`on_tip_progress`
    (``run_bot(..., on_tip_progress=payer.on_tip_progress)``)."""

    def __init__(self, client: Client, *, clock: Clock | None = None) -> None:
        self.matcher = TipMatcher()
        self._tips = TipPayer(client, self.matcher, clock=clock)

    async def pay(self, payee_uid: str, atoms: int) -> None:
        """Tip ``atoms`` atoms to ``payee_uid`` and wait for the outcome;
        raises :class:`brmcp.bridge.TipPaymentError` with the reason."""
        await self._tips.pay(payee_uid, atoms)

    def on_tip_progress(self, event: TipProgressEvent) -> None:
        """Hand one tip-progress event to the matcher: a terminal one
        resolves the payment waiting for it, a retried attempt ends that
        wait (the tip may still land)."""
        if not event.final:
            self.matcher.stall(event.uid, event.amount_matoms, event.attempt_err)
            return
        error = None if event.completed else (event.attempt_err or "tip attempt failed")
        self.matcher.resolve(event.uid, event.amount_matoms, error)
