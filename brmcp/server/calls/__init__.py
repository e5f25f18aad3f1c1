"""The path of one paid call through a harness (WIRE.md §Payments "Server
order"): refusals, rate limits and pay-alongside holds, callKey claims and
replay (§callKey), the money operations over the ledger, received tips,
commits in doubt, and the runs a harness owns. Imports the catalog and the
store."""

from __future__ import annotations

from ._accounts import (
    Accounts,
    is_store_error,
)
from ._callkeys import (
    NOT_RETAINED_TEXT,
    POLL_FIRST,
    POLL_MAX,
    REPLAY_WINDOW,
    SHARED_WAIT,
    STILL_RUNNING_TEXT,
    CallKeyRegistry,
    await_elsewhere,
    call_key_from_meta,
    error_result,
)
from ._doubt import (
    OUTCOME_UNKNOWN_TEXT,
    RESOLVE_ATTEMPTS,
    UNKNOWN_REFUNDED_TEXT,
)
from ._guard import (
    tool_error,
)
from ._holds import (
    HOLD_RECHECK,
)
from ._observed import (
    ObservedRead,
)
from ._pipeline import (
    OUTCOME_CAP,
    CallPipeline,
    outcome_json_for_error,
    response_overhead,
)
from ._received_tips import (
    ReceivedTips,
)
from ._refusal import (
    DROPPED_TEXT,
    LEDGER_UNAVAILABLE_TEXT,
    Refusal,
    RefusalReason,
)
from ._runs import (
    CURRENT_SESSION,
    Runs,
    SessionWatch,
    heartbeat,
)
from ._timer import (
    wait_event,
)

__all__ = [
    "CURRENT_SESSION",
    "DROPPED_TEXT",
    "HOLD_RECHECK",
    "LEDGER_UNAVAILABLE_TEXT",
    "NOT_RETAINED_TEXT",
    "OUTCOME_CAP",
    "OUTCOME_UNKNOWN_TEXT",
    "POLL_FIRST",
    "POLL_MAX",
    "REPLAY_WINDOW",
    "RESOLVE_ATTEMPTS",
    "SHARED_WAIT",
    "STILL_RUNNING_TEXT",
    "UNKNOWN_REFUNDED_TEXT",
    "Accounts",
    "CallKeyRegistry",
    "CallPipeline",
    "ObservedRead",
    "ReceivedTips",
    "Refusal",
    "RefusalReason",
    "Runs",
    "SessionWatch",
    "await_elsewhere",
    "call_key_from_meta",
    "error_result",
    "heartbeat",
    "is_store_error",
    "outcome_json_for_error",
    "response_overhead",
    "tool_error",
    "wait_event",
]
