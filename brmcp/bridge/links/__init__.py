"""Bot links: the one BR session per bot that every agent session shares
(BRIDGE.md §The payment flow), with its re-sends (§Deadlines and re-sends), eras and
tool snapshots (WIRE.md §Eras), change notifications and what a call relays
back to its agent. Imports only :mod:`brmcp.bridge.base` of the bridge."""

from __future__ import annotations

from ._changes import (
    MAX_PENDING_DROPS,
)
from ._exchange import (
    CallTally,
    DeadlineError,
    ProgressFn,
    tally_call,
)
from ._link import (
    BotLink,
)
from ._linkbase import (
    CONNECT_TIMEOUT,
    MAX_TOOL_BYTES,
    MAX_TOOL_LIST_BYTES,
    MAX_TOOL_PAGES,
    MAX_TOOLS,
    TRANSPORT_ERROR_CODES,
    HostOffline,
    LinkError,
    RateGate,
    ToolListTooLarge,
    json_bytes,
    no_answer_hint,
)
from ._relay import (
    MAX_RELAYED_BYTES,
    RELAY_BURST,
    RELAY_RATE,
    AgentCall,
    AgentGone,
    Relay,
    agent_session_id,
    strip_reserved_meta,
)
from ._retry import (
    SAMPLE_LIMIT,
    RetryPolicy,
    RttEstimator,
    relay_estimator,
)
from ._snapshots import (
    ERA_MODERN,
    MAX_SNAPSHOT_BYTES,
    SNAPSHOT_DIR,
    BotSnapshot,
    ListedTools,
    SnapshotStore,
    SnapshotTooLarge,
)
from ._subscriptions import (
    LIST_CHANGED_BURST,
    LIST_CHANGED_RATE,
    MAX_URI_BYTES,
    UPDATES_BURST,
    UPDATES_RATE,
    Subscriptions,
)
from ._toolsnap import (
    RELIST_INTERVAL,
)

__all__ = [
    "CONNECT_TIMEOUT",
    "ERA_MODERN",
    "LIST_CHANGED_BURST",
    "LIST_CHANGED_RATE",
    "MAX_PENDING_DROPS",
    "MAX_RELAYED_BYTES",
    "MAX_SNAPSHOT_BYTES",
    "MAX_TOOLS",
    "MAX_TOOL_BYTES",
    "MAX_TOOL_LIST_BYTES",
    "MAX_TOOL_PAGES",
    "MAX_URI_BYTES",
    "RELAY_BURST",
    "RELAY_RATE",
    "RELIST_INTERVAL",
    "SAMPLE_LIMIT",
    "SNAPSHOT_DIR",
    "TRANSPORT_ERROR_CODES",
    "UPDATES_BURST",
    "UPDATES_RATE",
    "AgentCall",
    "AgentGone",
    "BotLink",
    "BotSnapshot",
    "CallTally",
    "DeadlineError",
    "HostOffline",
    "LinkError",
    "ListedTools",
    "ProgressFn",
    "RateGate",
    "Relay",
    "RetryPolicy",
    "RttEstimator",
    "SnapshotStore",
    "SnapshotTooLarge",
    "Subscriptions",
    "ToolListTooLarge",
    "agent_session_id",
    "json_bytes",
    "no_answer_hint",
    "relay_estimator",
    "strip_reserved_meta",
    "tally_call",
]
