"""What a tool handler learns about the call it serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CallContext"]


@dataclass(frozen=True, slots=True)
class CallContext:
    """Passed to every tool handler and price function.

    ``peer``: the caller's BR uid (64 lowercase hex), the account billed.
    ``tool``: the tool name. ``charged_atoms``: atoms debited for this call
    (0 for free calls and inside price functions). ``call_key``: the
    caller's ``brmcp/callKey`` when it was valid, else None.
    ``request``: the MCP SDK's ``ServerRequestContext`` (progress
    notifications, session), or None outside a live request.
    """

    peer: str
    tool: str
    charged_atoms: int = 0
    call_key: str | None = None
    request: Any = None
