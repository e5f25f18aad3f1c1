"""The gate of the bridge's HTTP surface (BRIDGE.md §Security model; the
order is :mod:`.http`'s): whether a ``Host`` or ``Origin`` names this
machine (DNS-rebinding defence), whether an ``Authorization`` header
carries the token, and the answers of a refused request: the 401 with its
``WWW-Authenticate: Bearer`` challenge and where the token comes from, the
404 texts for a malformed or unlisted bot uid, and the 503 of a bot that
cannot be reached.
"""

from __future__ import annotations

import hmac
import json
from typing import Any
from urllib.parse import urlsplit

from mcp.types import INTERNAL_ERROR
from starlette.types import Send

from brmcp.bridge.base import send_json, send_text
from brmcp.bridge.links import HostOffline

__all__ = [
    "ADMIN_UNAUTHORIZED_HINT",
    "bearer_matches",
    "host_is_loopback",
    "malformed_uid_text",
    "not_allowed_hint",
    "origin_is_loopback",
    "send_jsonrpc_error",
    "send_unauthorized",
    "send_unavailable",
    "unauthorized_hint",
]

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
_LOOPBACK_ORIGIN_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def host_is_loopback(host: str | None) -> bool:
    """True for a ``Host`` header naming this machine: ``localhost``,
    ``127.0.0.1`` or ``[::1]``, optionally with a port."""
    if not host:
        return False
    host = host.lower()
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return False
        name, rest = host[: end + 1], host[end + 1 :]
    else:
        name, sep, port = host.partition(":")
        rest = sep + port
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and rest[1:].isascii()):
        return False
    return name in _LOOPBACK_NAMES


def origin_is_loopback(origin: str) -> bool:
    """True for an ``Origin`` whose scheme is http(s) and whose host is a
    loopback name (any port). ``null`` and anything unparsable are not."""
    try:
        parts = urlsplit(origin)
        hostname = parts.hostname
        parts.port  # noqa: B018  (raises ValueError for a bad port)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or hostname is None or "@" in parts.netloc:
        return False
    return hostname in _LOOPBACK_ORIGIN_HOSTS


def bearer_matches(header: bytes | None, token: str) -> bool:
    """True when ``header`` is ``Bearer <token>``: the scheme compared without
    case (RFC 9110 §11.1), one or more spaces after it, the token in
    constant time. A bare token without the scheme, another scheme, or an
    empty configured token never matches. (Go also accepts a bare token;
    that is deliberately refused here, BRIDGE.md "Differences".)"""
    if not token or header is None:
        return False
    scheme, sep, given = header.partition(b" ")
    if not sep or scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(given.lstrip(b" "), token.encode("utf-8"))


def unauthorized_hint(command: str = "brmcp-bridge") -> str:
    """Shown in every 401 of ``/mcp/…``: where the agent's token comes from.
    ``command`` is the bridge's command line (with ``--datadir`` when needed)."""
    return (
        "this endpoint needs the header 'Authorization: Bearer <token>'; print the token and a ready "
        f"configuration with: {command} config-snippet <bot uid>"
    )


#: Shown in every 401 of ``/admin/…``.
ADMIN_UNAUTHORIZED_HINT = (
    "the admin surface needs 'Authorization: Bearer <admin token>' with the token in "
    "<datadir>/mcpadmin.token (brmcp-bridge subcommands send it)"
)


async def send_unauthorized(send: Send, hint: str, *, credentials_sent: bool = True) -> None:
    """A 401 with ``WWW-Authenticate: Bearer`` (RFC 6750 §3) and a JSON body
    ``{"error": "unauthorized", "error_description": text}``. The challenge
    names no ``resource_metadata``, so MCP clients report an auth error
    instead of starting an OAuth flow the bridge does not offer. Without
    ``credentials_sent`` (no ``Authorization`` header) the challenge carries
    no error code (RFC 6750 §3.1) and ``text`` says the header is missing;
    with it, ``error="invalid_token"`` and ``text`` says the token sent was
    not accepted. Both end with ``hint``."""
    challenge = 'Bearer realm="brmcp-bridge"'
    if credentials_sent:
        text = f"the token sent was not accepted (wrong, old or not 'Bearer <token>'); {hint}"
        description = text.replace('"', "'")
        challenge += f', error="invalid_token", error_description="{description}"'
    else:
        text = f"no Authorization header was sent; {hint}"
    await send_json(
        send,
        401,
        {"error": "unauthorized", "error_description": text},
        headers=[(b"www-authenticate", challenge.encode("latin-1", "replace"))],
    )


def malformed_uid_text(path: str) -> str:
    """The 404 text for a path that is not ``/mcp/<64-hex uid>``: Go's
    ``unknown bot``, followed by what was wrong (the uid as sent, shortened
    and quoted, when the path starts with ``/mcp/``)."""
    if not path.startswith("/mcp/"):
        return "unknown bot: the endpoint is /mcp/<bot uid> (64 hex characters)"
    shown = path[len("/mcp/") :]
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return (
        f"unknown bot: malformed uid {json.dumps(shown)} in the path "
        "(a bot uid is 64 hex characters: /mcp/<bot uid>)"
    )


def not_allowed_hint(uid: str, command: str = "brmcp-bridge") -> str:
    """The 404 text for a well-formed bot uid missing from ``allowed_bots``.
    ``command`` is the bridge's command line (with ``--datadir`` when needed)."""
    return (
        f"unknown bot: {uid} is not on the bridge's allowed_bots; its user can allow it with: "
        f"{command} settings set allowed_bots=<the uids allowed now>,{uid}"
    )


async def send_jsonrpc_error(send: Send, status: int, code: int, message: str) -> None:
    """A JSON-RPC error answer (``id`` null) with HTTP ``status``."""
    await send_json(send, status, {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


async def send_unavailable(send: Send, exc: BaseException, message: dict[str, Any] | None) -> None:
    """503 for a bot that cannot be reached (``exc``, raised for the request
    ``message``; None: not a POST). When it did not answer (the
    hint of :func:`~brmcp.bridge.links._link.no_answer_hint`), or the bridge's own
    brclient is down (:class:`~._linkbase.HostOffline`, naming it), that
    text is the answer: a JSON-RPC error for the request (SDK clients show
    its message) or the plain-text body."""
    text = str(exc)
    if not isinstance(exc, HostOffline) and "no answer from bot" not in text:
        await send_text(send, 503, "bot unavailable")
        return
    request_id = message.get("id") if message is not None else None
    if message is not None and isinstance(request_id, str | int) and not isinstance(request_id, bool):
        error = {"code": INTERNAL_ERROR, "message": text}
        await send_json(send, 503, {"jsonrpc": "2.0", "id": request_id, "error": error})
        return
    await send_text(send, 503, text)
