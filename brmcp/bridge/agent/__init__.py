"""The agents' surface: the HTTP app behind the gate (BRIDGE.md §Security
model), the MCP server that mirrors one bot, its resumable streams, and the
bridge's own ``/mcp/discover`` endpoint. Imports base, links, pay and find."""

from __future__ import annotations

from ._discover import (
    AgentDiscovery,
)
from ._gate import (
    bearer_matches,
)
from ._http import (
    MAX_BODY_BYTES,
    RETRY_INTERVAL_MS,
    BridgeApp,
)
from ._proxy import (
    TWIN_GRACE,
    BotProxy,
)

__all__ = [
    "MAX_BODY_BYTES",
    "RETRY_INTERVAL_MS",
    "TWIN_GRACE",
    "AgentDiscovery",
    "BotProxy",
    "BridgeApp",
    "bearer_matches",
]
