"""The ASGI handler of the approvals page (``/ui/…``).

* ``GET /ui/login?ticket=T``: redeem a one-time ticket, set the session
  cookie, 303 to ``/ui/``;
* ``GET /ui/``: the page (a 401 page without a session);
* ``GET /ui/state[?after=N]``: the live parts as JSON
  (:func:`~.pages.render_fragments`); with ``after`` equal to the current
  version it waits up to :data:`LONG_POLL_SECS` s for a change;
* ``POST /ui/approvals/<id>/approve`` or ``…/deny``: decide; the CSRF token
  in ``X-CSRF-Token`` or the ``csrf`` form field; a JSON answer when asked
  (``Accept: application/json``): 200 ``{"id", "approved", "message"}``
  with ``message`` the confirmation to show (``Approved: 500 atoms to …
  for tool …``); 409 ``{"error"}`` when the decision comes too late: the
  payment timed out (``too late: payment <id> timed out after 2m0s …``),
  was withdrawn because its agent went away (``payment <id> was withdrawn:
  the agent went away; nothing was paid``) or was already decided the other
  way; 404 for an unknown id. Else 303 to the page, which lists the
  decision under "Recent decisions" (a 409 page with the same text when
  too late);
* ``POST /ui/logout``: end the session;
* ``GET /ui/app.js``: the page's script.

Bots are shown with the nick brclient has for them when the host's PM
sender can ask (:class:`~.nicks.NickSource`, e.g. the daemon's), next to
their uid; the nicks are cached (:class:`~.nicks.NickBook`).

Host and Origin were checked by the bridge's gate. The cookie is
``HttpOnly; SameSite=Strict; Path=/ui``; every POST also needs the
session's CSRF token; pages are sent with a Content-Security-Policy that
allows only this origin's script.
"""

from __future__ import annotations

import functools
import hmac
import importlib.resources
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from http.cookies import CookieError, SimpleCookie
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs

import anyio
from starlette.types import Receive, Scope, Send

from .._asgi import header_values, read_body, send_json
from ..approvals import PendingPayment
from ..settings import SETTINGS_FILE, Settings
from ..spend import BotBalance, SpendSummary
from .nicks import NickBook, NickSource
from .pages import (
    RECENT_ROWS,
    RECENT_SECS,
    SPEND_ROWS,
    PageState,
    decision_text,
    render_fragments,
    render_login_needed,
    render_notice,
    render_page,
)
from .sessions import SESSION_TTL, UISession, UISessions

if TYPE_CHECKING:
    from ..settle import Settler

__all__ = [
    "COOKIE",
    "LONG_POLL_SECS",
    "UI_PREFIX",
    "UIHandler",
    "UIHost",
    "UIHostConfig",
    "nick_source_of",
    "ui_handler",
]

#: The page's path prefix.
UI_PREFIX = "/ui"
#: The session cookie's name.
COOKIE = "brmcp_ui"
#: Longest wait of a ``/ui/state?after=N`` request (seconds).
LONG_POLL_SECS = 20.0
#: Largest form body accepted (bytes).
MAX_FORM_BYTES = 4096

_CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
    "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SECURITY_HEADERS = (
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy", _CSP.encode()),
)

#: Serves one ``/ui/…`` request; the last argument is the path.
UIHandler = Callable[[Scope, Receive, Send, str], Awaitable[None]]


class UIHostConfig(Protocol):
    """What the page reads of the host's configuration (a
    :class:`~brmcp.bridge.BridgeConfig`)."""

    @property
    def data_dir(self) -> str | os.PathLike[str]: ...

    @property
    def sender(self) -> object:
        """The PM sender; when it is a :class:`~.nicks.NickSource` the page
        shows brclient's nicks."""
        ...


class UIHost(Protocol):
    """What the page needs from the bridge."""

    @property
    def config(self) -> UIHostConfig: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def ui_sessions(self) -> UISessions: ...

    @property
    def cli_command(self) -> str:
        """``brmcp-bridge``, with ``--datadir`` when the data dir is not the default."""
        ...

    @property
    def change_version(self) -> int:
        """Bumped whenever the approvals or the spend log change."""
        ...

    def pending_payments(self) -> list[PendingPayment]: ...

    def resolve_payment(self, payment_id: str, approve: bool) -> bool: ...

    @property
    def _settler(self) -> Settler:
        """Its payments (the approval queue remembers withdrawn ids)."""
        ...

    def spend_log(self) -> SpendSummary: ...

    def bot_balances(self) -> Mapping[str, BotBalance]: ...

    def clock_now(self) -> float: ...

    def watch(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` on every change; returns the unsubscriber."""
        ...


@functools.cache
def _script() -> bytes:
    return importlib.resources.files(__package__).joinpath("app.js").read_bytes()


async def _send(
    send: Send, status: int, body: bytes, ctype: bytes, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", ctype),
                (b"content-length", str(len(body)).encode()),
                *_SECURITY_HEADERS,
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _html(send: Send, status: int, text: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await _send(send, status, text.encode("utf-8"), b"text/html; charset=utf-8", headers)


async def _redirect(send: Send, location: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await _send(send, 303, b"", b"text/plain; charset=utf-8", [(b"location", location.encode()), *headers])


def _cookie_value(scope: Scope) -> str | None:
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


def _set_cookie(value: str, max_age: int) -> tuple[bytes, bytes]:
    return (
        b"set-cookie",
        f"{COOKIE}={value}; Path={UI_PREFIX}; HttpOnly; SameSite=Strict; Max-Age={max_age}".encode(),
    )


def _wants_json(scope: Scope) -> bool:
    return any(b"application/json" in v for v in header_values(scope, b"accept"))


def _query(scope: Scope) -> dict[str, list[str]]:
    raw: bytes = scope.get("query_string", b"")
    return parse_qs(raw.decode("latin-1"), keep_blank_values=True)


def _bots_shown(host: UIHost, now: float) -> list[str]:
    """The uids of the bots the page is about to show."""
    spend = host.spend_log()
    bots = [p.bot for p in host.pending_payments()]
    bots += [e.payment.bot for e in host._settler.approvals.recent(now - RECENT_SECS, RECENT_ROWS)]
    bots += [e.bot for e in spend.entries[-SPEND_ROWS:]]
    bots += [e.bot for e in spend.entries if e.counts]
    bots += list(host.bot_balances())
    return bots


async def _state(host: UIHost, nicks: NickBook) -> PageState:
    """A snapshot of what the page shows, with the nicks of its bots (looked
    up first, within the book's time budget). The version is read before
    the parts, so a change made meanwhile is not missed by the long-poll."""
    await nicks.refresh(_bots_shown(host, host.clock_now()))
    version = host.change_version
    now = host.clock_now()
    bots = _bots_shown(host, now)
    return PageState(
        settings=host.settings,
        pending=tuple(host.pending_payments()),
        spend=host.spend_log(),
        balances=dict(host.bot_balances()),
        now=now,
        version=version,
        command=host.cli_command,
        nicks=nicks.known(bots),
        recent=tuple(host._settler.approvals.recent(now - RECENT_SECS, RECENT_ROWS)),
        settings_file=os.path.join(host.config.data_dir, SETTINGS_FILE),
    )


def nick_source_of(host: UIHost) -> NickSource | None:
    """The host's PM sender when it can name brclient's contacts, else None."""
    sender = host.config.sender
    return sender if isinstance(sender, NickSource) else None


def ui_handler(host: UIHost, *, nicks: NickBook | None = None) -> UIHandler:
    """The handler for ``/ui/…`` bound to ``host``; ``nicks`` defaults to a
    book over :func:`nick_source_of` ``host``."""
    book = nicks if nicks is not None else NickBook(nick_source_of(host))

    async def handle(scope: Scope, receive: Receive, send: Send, path: str) -> None:
        method = scope.get("method", "")
        if path == UI_PREFIX:
            await _redirect(send, UI_PREFIX + "/")
            return
        route = path[len(UI_PREFIX) :]
        if route == "/app.js" and method == "GET":
            await _send(send, 200, _script(), b"text/javascript; charset=utf-8")
            return
        if route == "/login" and method == "GET":
            ticket = (_query(scope).get("ticket") or [""])[0]
            session = host.ui_sessions.redeem(ticket) if ticket else None
            if session is None:
                reason = "This login link is unknown, used or expired."
                await _html(send, 401, render_login_needed(reason, host.cli_command))
                return
            await _redirect(send, UI_PREFIX + "/", [_set_cookie(session.sid, int(SESSION_TTL))])
            return
        session = host.ui_sessions.session(_cookie_value(scope))
        if session is None:
            if route.startswith("/state") or _wants_json(scope):
                error = f"not logged in; get a login link with: {host.cli_command} ui"
                await send_json(send, 401, {"error": error})
            else:
                reason = "You are not logged in (or the session ended)."
                await _html(send, 401, render_login_needed(reason, host.cli_command))
            return
        if route == "/" and method == "GET":
            await _html(send, 200, render_page(await _state(host, book), session.csrf))
            return
        if route == "/state" and method == "GET":
            await _state_answer(host, book, scope, send, session)
            return
        parts = [p for p in route.split("/") if p]
        if method == "POST" and (parts == ["logout"] or (len(parts) == 3 and parts[0] == "approvals")):
            if not await _csrf_ok(scope, receive, session):
                await send_json(send, 403, {"error": "missing or wrong CSRF token; reload the page"})
                return
            if parts == ["logout"]:
                host.ui_sessions.end(session.sid)
                await _redirect(send, UI_PREFIX + "/", [_set_cookie("", 0)])
                return
            verb = parts[2]
            if verb not in ("approve", "deny"):
                await send_json(send, 404, {"error": "not found"})
                return
            await _decide(host, book, scope, send, parts[1], verb == "approve")
            return
        await send_json(send, 404 if method in ("GET", "POST") else 405, {"error": "not found"})

    return handle


async def _decide(
    host: UIHost, nicks: NickBook, scope: Scope, send: Send, payment_id: str, approve: bool
) -> None:
    """Deliver a decision from the page and answer it (the module docstring)."""
    queue = host._settler.approvals
    known = host.resolve_payment(payment_id, approve)
    ended = queue.ended(payment_id)
    late: str | None = None
    if ended is not None and (not known or ended.outcome != ("approved" if approve else "denied")):
        # Timed out or withdrawn before the decision, or decided already (the
        # other way, or by an earlier click): this decision does not count.
        late = ended.late_text()
    if _wants_json(scope):
        if late is not None:
            await send_json(send, 409, {"error": late})
        elif not known or ended is None:
            await send_json(send, 404, {"error": "unknown payment: nothing with that ID waits for approval"})
        else:
            await nicks.refresh([ended.payment.bot])
            message = decision_text(ended, nicks.known([ended.payment.bot]))
            await send_json(send, 200, {"id": payment_id, "approved": approve, "message": message})
        return
    if late is not None:
        await _html(send, 409, render_notice(late, UI_PREFIX + "/"))
        return
    await _redirect(send, UI_PREFIX + "/")


async def _state_answer(host: UIHost, nicks: NickBook, scope: Scope, send: Send, session: UISession) -> None:
    after = (_query(scope).get("after") or [""])[0]
    if after == str(host.change_version):
        changed = anyio.Event()
        unsubscribe = host.watch(changed.set)
        try:
            with anyio.move_on_after(LONG_POLL_SECS):
                await changed.wait()
        finally:
            unsubscribe()
    await send_json(send, 200, render_fragments(await _state(host, nicks), session.csrf))


async def _csrf_ok(scope: Scope, receive: Receive, session: UISession) -> bool:
    given = [v.decode("latin-1") for v in header_values(scope, b"x-csrf-token")]
    if not given:
        body, _ = await read_body(receive, MAX_FORM_BYTES)
        if body:
            given = parse_qs(body.decode("utf-8", "replace")).get("csrf", [])
    return len(given) == 1 and hmac.compare_digest(given[0].encode(), session.csrf.encode())
