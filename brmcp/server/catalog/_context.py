"""What a handler learns about the request it serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS

__all__ = ["CallContext", "PeerContext", "peer_of"]


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


@dataclass(frozen=True, slots=True)
class PeerContext:
    """Passed to resource, resource-template, prompt and completion handlers
    (all free: nothing is charged for them).

    ``peer``: the caller's BR uid (64 lowercase hex). ``target``: what the
    request names: the URI being read, the prompt's name, or, for a
    completion, the prompt name or URI template its reference names.
    ``request``: the MCP SDK's ``ServerRequestContext``, or None outside a
    live request.
    """

    peer: str
    target: str
    request: Any = None


def peer_of(ctx: ServerRequestContext[Any]) -> str:
    """The caller's BR uid of an SDK request: the ``request_context`` the
    transport attached (conn.py). Raises MCPError -32602 for a request that
    did not arrive over a BR session."""
    peer = ctx.request
    if not isinstance(peer, str):
        raise MCPError(code=INVALID_PARAMS, message="brmcp: request did not arrive over a BR session")
    return peer
