"""The money of the bridge: one logical call's hard bound (BRIDGE.md §The
hard bound), funding and prepay, the payment loop, settling a payment, the
spend log ``mcpspend.json`` and the approvals queue, and pools' money.
Imports :mod:`~brmcp.bridge.base` and :mod:`~brmcp.bridge.links`."""

from __future__ import annotations

from ._approvals import (
    MAX_ARGUMENT_CHARS,
    EndedPayment,
    PendingPayment,
    describe_arguments,
    withdrawn_text,
)
from ._budget import (
    CallBudget,
    Listing,
    listing_of,
)
from ._decide import (
    APPROVAL_PROGRESS_INTERVAL,
    APPROVAL_PROGRESS_STEP,
    MAX_PAYMENTS,
    Decider,
)
from ._funding import (
    Funding,
)
from ._payloop import (
    POLL_ATTEMPTS,
    POLL_INTERVAL,
    STOPPING,
    PaymentLoop,
)
from ._paymaster import (
    AGENT_GONE_PAID,
    Payer,
)
from ._pools import (
    STILL_RUNNING_MAX_PAUSE,
    STILL_RUNNING_PAUSE,
    Pools,
    still_running_asks,
)
from ._settle import (
    Settler,
    cap_refusal,
    payment_scheduled,
)
from ._spend import (
    BOT_REPLAY_SECONDS,
    DAY_SECONDS,
    SPEND_FILE,
    STATUS_FAILED,
    STATUS_PAID,
    STATUS_PENDING,
    BotBalance,
    InDoubtSpend,
    SpendEntry,
    SpendLog,
    SpendSummary,
    arguments_hash,
)

__all__ = [
    "AGENT_GONE_PAID",
    "APPROVAL_PROGRESS_INTERVAL",
    "APPROVAL_PROGRESS_STEP",
    "BOT_REPLAY_SECONDS",
    "DAY_SECONDS",
    "MAX_ARGUMENT_CHARS",
    "MAX_PAYMENTS",
    "POLL_ATTEMPTS",
    "POLL_INTERVAL",
    "SPEND_FILE",
    "STATUS_FAILED",
    "STATUS_PAID",
    "STATUS_PENDING",
    "STILL_RUNNING_MAX_PAUSE",
    "STILL_RUNNING_PAUSE",
    "STOPPING",
    "BotBalance",
    "CallBudget",
    "Decider",
    "EndedPayment",
    "Funding",
    "InDoubtSpend",
    "Listing",
    "Payer",
    "PaymentLoop",
    "PendingPayment",
    "Pools",
    "Settler",
    "SpendEntry",
    "SpendLog",
    "SpendSummary",
    "arguments_hash",
    "cap_refusal",
    "describe_arguments",
    "listing_of",
    "payment_scheduled",
    "still_running_asks",
    "withdrawn_text",
]
