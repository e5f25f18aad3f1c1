"""A call refused before its handler ran, as a typed value (WIRE.md
§Payments, "Server order per call"): why (:class:`RefusalReason`) and, for a
``payment_required`` refusal, the tool, its price and the balance that could
not cover it.

The pipeline raises :class:`Refused` carrying a :class:`Refusal` and reads
its fields (the pay-alongside hold needs the balance); only its edge,
:meth:`~._pipeline.CallPipeline.call` (and the epoch drop answering waiting
duplicates), renders the answer with :meth:`Refusal.result`, so nothing is
ever parsed back from a rendered result. The rendered bytes are those the
harness always sent: the marked ``payment_required`` text of the Go harness
(:func:`~brmcp.protocol.payment.marked_payment_required_result`) or a tool
error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

from mcp.types import CallToolResult

from brmcp.protocol.payment import marked_payment_required_result
from brmcp.server.ratelimit import RATE_LIMITED_TEXT

from ._callkeys import error_result
from ._doubt import OUTCOME_UNKNOWN_TEXT
from ._guard import tool_error

__all__ = ["DROPPED_TEXT", "LEDGER_UNAVAILABLE_TEXT", "Refusal", "RefusalReason", "Refused"]

log = logging.getLogger("brmcp.server")

#: The answer of a held call dropped because its caller's process changed
#: (WIRE.md §Pay alongside): a tool error, never a refusal, so nobody pays for it.
DROPPED_TEXT = (
    "call dropped while held for its payment: the caller restarted (its brmcp/callerEpoch changed); "
    "nothing was charged; retry with the same callKey"
)
#: The answer when the ledger could not record a charge (nothing was charged).
LEDGER_UNAVAILABLE_TEXT = "payment could not be recorded; nothing was charged; retry later"


class RefusalReason(StrEnum):
    """Why a call was refused before running. The value is the reason a
    released callKey claim records (duplicates that find no answer say it)."""

    PAYMENT_REQUIRED = "payment required"
    RATE_LIMITED = "rate limited"
    PRICE_FAILED = "price function failed"
    LEDGER_UNAVAILABLE = "ledger unavailable"
    OUTCOME_UNKNOWN = "payment outcome unknown"
    CALLER_RESTARTED = "caller restarted"

    @property
    def metric_outcome(self) -> str:
        """The ``outcome`` label of the calls metric: ``payment_required``,
        ``rate_limited``, else ``refused``."""
        if self is RefusalReason.PAYMENT_REQUIRED:
            return "payment_required"
        if self is RefusalReason.RATE_LIMITED:
            return "rate_limited"
        return "refused"


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refusal before execution. ``tool``, ``price_atoms`` and
    ``balance_atoms`` (atoms) describe a ``payment_required`` refusal;
    ``text`` is the tool error of every other reason (for
    :attr:`RefusalReason.PRICE_FAILED` the price function's own text,
    defused by :func:`._guard.tool_error` when rendered). Build one with the
    class methods."""

    reason: RefusalReason
    tool: str = ""
    price_atoms: int = 0
    balance_atoms: int = 0
    text: str = ""

    @classmethod
    def payment_required(cls, tool: str, price_atoms: int, balance_atoms: int) -> Refusal:
        """The balance of ``balance_atoms`` cannot cover ``price_atoms`` for ``tool``."""
        return cls(RefusalReason.PAYMENT_REQUIRED, tool, price_atoms, balance_atoms)

    @classmethod
    def rate_limited(cls) -> Refusal:
        """The caller is over its rate limit (:data:`~.ratelimit.RATE_LIMITED_TEXT`)."""
        return cls(RefusalReason.RATE_LIMITED, text=RATE_LIMITED_TEXT)

    @classmethod
    def price_failed(cls, text: str) -> Refusal:
        """The tool's price function raised, saying ``text``."""
        return cls(RefusalReason.PRICE_FAILED, text=text)

    @classmethod
    def ledger_unavailable(cls) -> Refusal:
        """The debit could not be recorded (:data:`LEDGER_UNAVAILABLE_TEXT`)."""
        return cls(RefusalReason.LEDGER_UNAVAILABLE, text=LEDGER_UNAVAILABLE_TEXT)

    @classmethod
    def outcome_unknown(cls) -> Refusal:
        """The charge's commit was lost and the book stayed out of reach
        (:data:`~._doubt.OUTCOME_UNKNOWN_TEXT`; :mod:`._doubt`)."""
        return cls(RefusalReason.OUTCOME_UNKNOWN, text=OUTCOME_UNKNOWN_TEXT)

    @classmethod
    def caller_restarted(cls) -> Refusal:
        """A held call dropped by a new caller epoch (:data:`DROPPED_TEXT`)."""
        return cls(RefusalReason.CALLER_RESTARTED, text=DROPPED_TEXT)

    def result(self) -> CallToolResult:
        """The answer the caller gets: the harness's marked
        ``payment_required`` refusal (WIRE.md §Payments, "Genuine
        refusals"), or an ``isError`` tool result saying :attr:`text`."""
        if self.reason is RefusalReason.PAYMENT_REQUIRED:
            return marked_payment_required_result(self.tool, self.price_atoms, self.balance_atoms)
        if self.reason is RefusalReason.PRICE_FAILED:
            return tool_error(self.text)
        return error_result(self.text)

    def log_payment_required(self, peer: str) -> None:
        """The INFO line of a ``payment_required`` refusal to ``peer``."""
        log.info(
            "payment required: %s called %s for %s atoms with a balance of %s",
            peer,
            self.tool,
            f"{self.price_atoms:,}",
            f"{self.balance_atoms:,}",
        )


class Refused(Exception):
    """Raised inside the pipeline for a refusal before execution; the
    callKey claim is released with the rendered answer at the edge."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.reason.value)
        self.refusal = refusal
