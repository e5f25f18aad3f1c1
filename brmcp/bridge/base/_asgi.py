"""Small ASGI helpers shared by the bridge's HTTP surfaces (the MCP
endpoint, the admin surface and the approvals page): headers, bodies and
plain-text or JSON answers. Imports nothing else of the bridge, so those
modules depend on it and never on each other."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.types import Message, Receive, Scope, Send

__all__ = [
    "MAX_ADMIN_BODY_BYTES",
    "PathHandler",
    "header_values",
    "read_body",
    "replay_body",
    "route_path",
    "send_json",
    "send_text",
]

#: Largest accepted admin request body (bytes).
MAX_ADMIN_BODY_BYTES = 64 * 1024

#: Serves one request under a prefix; the last argument is the path.
PathHandler = Callable[[Scope, Receive, Send, str], Awaitable[None]]


def header_values(scope: Scope, name: bytes) -> list[bytes]:
    """Every value of header ``name`` (lowercase bytes) in ``scope``."""
    return [value for key, value in scope.get("headers", ()) if key.lower() == name]


def route_path(scope: Scope) -> str:
    """The request path below the app's ``root_path``."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path


async def send_text(
    send: Send, status: int, message: str, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    """A plain-text error like Go's ``http.Error`` (trailing newline)."""
    body = (message + "\n").encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"x-content-type-options", b"nosniff"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, value: Any, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """A JSON answer (``application/json``, ``no-store``, ``nosniff``)."""
    body = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"cache-control", b"no-store"),
                (b"x-content-type-options", b"nosniff"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, limit: int) -> tuple[bytes | None, list[Message]]:
    """Read a request body of at most ``limit`` bytes. Returns (body or None
    when too large or the client left, extra messages received after it)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None, [message]
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None, []
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), []


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A receive callable that yields ``body`` once, then defers to ``receive``."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
