"""The payer's word that the wallet took a payment: how a payer (the
daemon's tip payer, or a host's own) tells the bridge, from inside ``pay``,
that the money is now the wallet's to deliver. Below both the bridge and
clientrpc so that neither imports the other for it."""

from __future__ import annotations

import contextvars
from collections.abc import Callable

__all__ = ["SCHEDULED_CALLBACK", "payment_scheduled"]

#: The callback :func:`payment_scheduled` runs in the payer's task.
SCHEDULED_CALLBACK: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "brmcp_payment_scheduled", default=None
)


def payment_scheduled() -> None:
    """Called by a payer (:class:`brmcp.bridge.Payer`) from inside ``pay`` once the wallet has
    taken the payment (brclient's ``TipUser`` returned: the tip is stored,
    survives a restart and its outcome will be reported). The spend entry
    is then marked ``"scheduled": true`` on disk, so that after a crash the
    next start knows the payment exists and pays nothing more for its tool
    until its outcome is known (BRIDGE.md §The hard bound). A no-op outside
    a payment."""
    callback = SCHEDULED_CALLBACK.get()
    if callback is not None:
        callback()
