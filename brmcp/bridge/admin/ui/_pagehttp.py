"""The approvals page's HTTP plumbing: its path and session cookie, the
security headers every answer carries (no caching, no framing, a
Content-Security-Policy that allows only this origin's script), and the
small ASGI answers (HTML, redirects) and request reads (cookie, Accept,
query) the handler is written with."""

from __future__ import annotations

from collections.abc import Iterable
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from starlette.types import Scope, Send

from brmcp.bridge.base import header_values

__all__ = [
    "API_HEADERS",
    "COOKIE",
    "CSP",
    "SECURITY_HEADERS",
    "UI_PREFIX",
    "cookie_value",
    "query_of",
    "redirect",
    "send_body",
    "send_html",
    "set_cookie",
    "wants_json",
]

#: The page's path prefix.
UI_PREFIX = "/ui"
#: The session cookie's name.
COOKIE = "brmcp_ui"
#: The page's Content-Security-Policy: only this origin's script, no inline script.
CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
#: Sent with every answer of the page.
SECURITY_HEADERS = (
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy", CSP.encode()),
)
#: What JSON answers add to :func:`brmcp.bridge.base.send_json`'s own headers.
API_HEADERS = SECURITY_HEADERS[2:]


async def send_body(
    send: Send, status: int, body: bytes, ctype: bytes, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    """Answer with ``body`` of type ``ctype`` and the page's security headers."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", ctype),
                (b"content-length", str(len(body)).encode()),
                *SECURITY_HEADERS,
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_html(send: Send, status: int, text: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """Answer with the HTML ``text`` (UTF-8)."""
    await send_body(send, status, text.encode("utf-8"), b"text/html; charset=utf-8", headers)


async def redirect(send: Send, location: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """Answer 303 to ``location``."""
    await send_body(
        send, 303, b"", b"text/plain; charset=utf-8", [(b"location", location.encode()), *headers]
    )


def cookie_value(scope: Scope) -> str | None:
    """The session cookie's value in the request, or None."""
    for raw in header_values(scope, b"cookie"):
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw.decode("latin-1"))
        except CookieError:
            continue
        morsel = jar.get(COOKIE)
        if morsel is not None:
            return morsel.value
    return None


def set_cookie(value: str, max_age: int) -> tuple[bytes, bytes]:
    """The ``set-cookie`` header of the session cookie (``max_age`` seconds; 0 ends it)."""
    return (
        b"set-cookie",
        f"{COOKIE}={value}; Path={UI_PREFIX}; HttpOnly; SameSite=Strict; Max-Age={max_age}".encode(),
    )


def wants_json(scope: Scope) -> bool:
    """Whether the request accepts ``application/json``."""
    return any(b"application/json" in v for v in header_values(scope, b"accept"))


def query_of(scope: Scope) -> dict[str, list[str]]:
    """The request's query parameters (blank values kept)."""
    raw: bytes = scope.get("query_string", b"")
    return parse_qs(raw.decode("latin-1"), keep_blank_values=True)
