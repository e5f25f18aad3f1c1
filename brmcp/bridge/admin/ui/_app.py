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
* ``POST /ui/bot-requests/<id>/approve`` or ``…/deny``: decide an agent's
  request to add a bot (``POST /admin/bot-requests/<id>`` ``{"approve"}``);
  CSRF as above; JSON ``{"id", "outcome", "message"}`` when asked, the
  admin route's 404/409 ``{"error"}`` passed on; else 303 to the page;
* ``/ui/api/…`` (JSON in and out, the CSRF token in ``X-CSRF-Token``
  only): the "Find tools" view's calls, answered by the admin surface's own
  routes: ``POST /ui/api/find`` (``/admin/find``), ``GET
  /ui/api/contact/<uid>`` (``/admin/contact/<uid>``), ``POST
  /ui/api/introduce`` (``/admin/introduce``), ``POST /ui/api/wait-kx``
  (``/admin/wait-kx``), and ``POST /ui/api/add-bot`` ``{"uid",
  "perCallCapAtoms"?, "perDayCapAtoms"?}``: puts the uid on
  ``allowed_bots`` and sets the caps given, through ``PUT /admin/settings``
  (the path ``brmcp-bridge add`` takes); answers ``{"uid", "added",
  "perCallCapAtoms", "perDayCapAtoms", "mode", "message"}`` (never the
  token), 400 naming the field to fix;
* ``POST /ui/logout``: end the session;
* ``GET /ui/app.js``: the page's script.

The pending add-bot requests (``GET /admin/bot-requests``) are part of the
live state; a bridge without that route shows no such section. Nothing a
directory answers is acted on: an add is a request the user's click on the
confirmation makes.

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
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import parse_qs

import anyio
from starlette.types import Message, Receive, Scope, Send

from brmcp.bridge.base import (
    SETTINGS_FILE,
    PathHandler,
    Settings,
    header_values,
    is_uid,
    read_body,
    send_json,
)
from brmcp.bridge.pay import BotBalance, PendingPayment, SpendSummary
from brmcp.clientrpc.nicks import NickBook, NickSource

from .. import AdminHost, admin_handler
from .._sessions import SESSION_TTL, UISession, UISessions
from ._botrequests import BotRequests, bot_requests_from_json
from ._pagehttp import (
    API_HEADERS,
    UI_PREFIX,
    cookie_value,
    query_of,
    redirect,
    send_body,
    send_html,
    set_cookie,
    wants_json,
)
from ._pages import (
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

if TYPE_CHECKING:
    from brmcp.bridge.pay import Settler

__all__ = [
    "LONG_POLL_SECS",
    "UIHandler",
    "UIHost",
    "UIHostConfig",
    "nick_source_of",
    "ui_handler",
]

#: Longest wait of a ``/ui/state?after=N`` request (seconds).
LONG_POLL_SECS = 20.0
#: Largest form body accepted (bytes).
MAX_FORM_BYTES = 4096
#: Largest ``/ui/api/…`` request body accepted (bytes).
MAX_API_BYTES = 4096
#: The ``/ui/api/…`` calls answered by the admin route of the same name: (method, route).
_FORWARDED = {("POST", "find"), ("GET", "contact"), ("POST", "introduce"), ("POST", "wait-kx")}

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


def _bots_shown(host: UIHost, now: float) -> list[str]:
    """The uids of the bots the page is about to show."""
    spend = host.spend_log()
    bots = [p.bot for p in host.pending_payments()]
    bots += [e.payment.bot for e in host._settler.approvals.recent(now - RECENT_SECS, RECENT_ROWS)]
    bots += [e.bot for e in spend.entries[-SPEND_ROWS:]]
    bots += [e.bot for e in spend.entries if e.counts]
    bots += list(host.bot_balances())
    return bots


async def _forward(admin: PathHandler, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
    """Ask the admin surface's route ``path`` in-process (the page's session
    and CSRF token were checked instead of the admin token); returns its
    status and JSON answer (``{"error": text}`` when it answered no JSON)."""
    scope: Scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    status = 500
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await admin(scope, receive, send, path)
    raw = b"".join(chunks)
    try:
        value = json.loads(raw) if raw else {}
    except (ValueError, UnicodeDecodeError, RecursionError):
        value = {"error": raw.decode("utf-8", "replace")[:300]}
    return status, value


async def _bot_requests(admin: PathHandler) -> BotRequests | None:
    """The agents' add-bot requests, or None when the bridge serves none
    (the admin route answers anything but 200 with their shape)."""
    status, value = await _forward(admin, "GET", "/admin/bot-requests")
    return bot_requests_from_json(value) if status == 200 else None


async def _state(host: UIHost, nicks: NickBook, admin: PathHandler) -> PageState:
    """A snapshot of what the page shows, with the nicks of its bots (looked
    up first, within the book's time budget). The version is read before
    the parts, so a change made meanwhile is not missed by the long-poll."""
    await nicks.refresh(_bots_shown(host, host.clock_now()))
    requests = await _bot_requests(admin)
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
        bot_requests=requests,
    )


def nick_source_of(host: UIHost) -> NickSource | None:
    """The host's PM sender when it can name brclient's contacts, else None."""
    sender = host.config.sender
    return sender if isinstance(sender, NickSource) else None


def _admin_of(host: UIHost) -> PathHandler:
    """The admin surface's handler over ``host``, which is then also an
    :class:`~brmcp.bridge.admin.AdminHost` (the :class:`~brmcp.bridge.Bridge` is)."""
    return admin_handler(cast(AdminHost, host))


def ui_handler(host: UIHost, *, nicks: NickBook | None = None, admin: PathHandler | None = None) -> UIHandler:
    """The handler for ``/ui/…`` bound to ``host``; ``nicks`` defaults to a
    book over :func:`nick_source_of` ``host``; ``admin`` (the admin
    surface's handler, whose discovery, settings and add-bot request routes
    the page uses) defaults to one over ``host``."""
    book = nicks if nicks is not None else NickBook(nick_source_of(host))
    admin_routes = admin if admin is not None else _admin_of(host)
    add_lock = anyio.Lock()

    async def handle(scope: Scope, receive: Receive, send: Send, path: str) -> None:
        method = scope.get("method", "")
        if path == UI_PREFIX:
            await redirect(send, UI_PREFIX + "/")
            return
        route = path[len(UI_PREFIX) :]
        if route == "/app.js" and method == "GET":
            await send_body(send, 200, _script(), b"text/javascript; charset=utf-8")
            return
        if route == "/login" and method == "GET":
            ticket = (query_of(scope).get("ticket") or [""])[0]
            session = host.ui_sessions.redeem(ticket) if ticket else None
            if session is None:
                reason = "This login link is unknown, used or expired."
                await send_html(send, 401, render_login_needed(reason, host.cli_command))
                return
            await redirect(send, UI_PREFIX + "/", [set_cookie(session.sid, int(SESSION_TTL))])
            return
        session = host.ui_sessions.session(cookie_value(scope))
        if session is None:
            if route.startswith("/state") or wants_json(scope):
                error = f"not logged in; get a login link with: {host.cli_command} ui"
                await send_json(send, 401, {"error": error})
            else:
                reason = "You are not logged in (or the session ended)."
                await send_html(send, 401, render_login_needed(reason, host.cli_command))
            return
        if route == "/" and method == "GET":
            await send_html(send, 200, render_page(await _state(host, book, admin_routes), session.csrf))
            return
        if route == "/state" and method == "GET":
            await _state_answer(host, book, admin_routes, scope, send, session)
            return
        parts = [p for p in route.split("/") if p]
        if parts[:1] == ["api"]:
            await _api(host, admin_routes, add_lock, scope, receive, send, session, parts[1:])
            return
        if method == "POST" and len(parts) == 3 and parts[0] == "bot-requests":
            if not await _csrf_ok(scope, receive, session):
                await send_json(send, 403, {"error": "missing or wrong CSRF token; reload the page"})
                return
            if parts[2] not in ("approve", "deny"):
                await send_json(send, 404, {"error": "not found"})
                return
            await _decide_bot_request(admin_routes, scope, send, parts[1], parts[2] == "approve")
            return
        if method == "POST" and (parts == ["logout"] or (len(parts) == 3 and parts[0] == "approvals")):
            if not await _csrf_ok(scope, receive, session):
                await send_json(send, 403, {"error": "missing or wrong CSRF token; reload the page"})
                return
            if parts == ["logout"]:
                host.ui_sessions.end(session.sid)
                await redirect(send, UI_PREFIX + "/", [set_cookie("", 0)])
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
    if wants_json(scope):
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
        await send_html(send, 409, render_notice(late, UI_PREFIX + "/"))
        return
    await redirect(send, UI_PREFIX + "/")


async def _state_answer(
    host: UIHost, nicks: NickBook, admin: PathHandler, scope: Scope, send: Send, session: UISession
) -> None:
    after = (query_of(scope).get("after") or [""])[0]
    if after == str(host.change_version):
        changed = anyio.Event()
        unsubscribe = host.watch(changed.set)
        try:
            with anyio.move_on_after(LONG_POLL_SECS):
                await changed.wait()
        finally:
            unsubscribe()
    await send_json(send, 200, render_fragments(await _state(host, nicks, admin), session.csrf))


async def _csrf_ok(scope: Scope, receive: Receive, session: UISession) -> bool:
    given = [v.decode("latin-1") for v in header_values(scope, b"x-csrf-token")]
    if not given:
        body, _ = await read_body(receive, MAX_FORM_BYTES)
        if body:
            given = parse_qs(body.decode("utf-8", "replace")).get("csrf", [])
    return len(given) == 1 and hmac.compare_digest(given[0].encode(), session.csrf.encode())


async def _api(
    host: UIHost,
    admin: PathHandler,
    add_lock: anyio.Lock,
    scope: Scope,
    receive: Receive,
    send: Send,
    session: UISession,
    parts: list[str],
) -> None:
    """Serve ``/ui/api/…`` (the module docstring)."""
    method = scope.get("method", "")
    given = [v.decode("latin-1") for v in header_values(scope, b"x-csrf-token")]
    if len(given) != 1 or not hmac.compare_digest(given[0].encode(), session.csrf.encode()):
        await send_json(send, 403, {"error": "missing or wrong CSRF token; reload the page"})
        return
    route = parts[0] if parts else ""
    if parts == ["add-bot"] and method == "POST":
        body = await _api_body(receive, send)
        if body is not None:
            async with add_lock:
                await _add_bot(host, admin, send, body)
        return
    if (method, route) not in _FORWARDED or len(parts) != (2 if route == "contact" else 1):
        await send_json(send, 404, {"error": "not found"})
        return
    raw = b""
    if method == "POST":
        read, extra = await read_body(receive, MAX_API_BYTES)
        if read is None:
            if not extra:
                await send_json(send, 413, {"error": f"request body over {MAX_API_BYTES} bytes"})
            return
        raw = read
    status, value = await _forward(admin, method, "/admin/" + "/".join(parts), raw)
    await send_json(send, status, value, API_HEADERS)


async def _api_body(receive: Receive, send: Send) -> dict[str, Any] | None:
    """The request's JSON object, or None after answering 400 or 413 (or
    when the client went away)."""
    raw, extra = await read_body(receive, MAX_API_BYTES)
    if raw is None:
        if not extra:
            await send_json(send, 413, {"error": f"request body over {MAX_API_BYTES} bytes"})
        return None
    try:
        value = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        value = None
    if not isinstance(value, dict):
        await send_json(send, 400, {"error": "the body must be a JSON object"})
        return None
    return value


#: The caps ``/ui/api/add-bot`` may set: its key → the setting.
_ADD_CAPS = {"perCallCapAtoms": "per_call_cap_atoms", "perDayCapAtoms": "per_day_cap_atoms"}


async def _add_bot(host: UIHost, admin: PathHandler, send: Send, body: dict[str, Any]) -> None:
    """Put ``body["uid"]`` on ``allowed_bots`` and set the caps given, through
    ``PUT /admin/settings`` (as ``brmcp-bridge add`` does); the answer names
    the caps in force and never carries the token."""
    unknown = sorted(set(body) - {"uid", *_ADD_CAPS})
    if unknown:
        error = f"add-bot: unknown key {unknown[0]!r}; keys: uid, perCallCapAtoms, perDayCapAtoms"
        await send_json(send, 400, {"error": error})
        return
    given = body.get("uid")
    if not isinstance(given, str) or not is_uid(given.strip()):
        await send_json(
            send, 400, {"error": f"uid: {json.dumps(given)[:80]} is not a 64-hex Bison Relay uid"}
        )
        return
    uid = given.strip().lower()
    changes: dict[str, Any] = {}
    for key, setting in _ADD_CAPS.items():
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
            error = f"{key}: {json.dumps(value)[:40]} must be a whole number of atoms, 0 (never pay) or more"
            await send_json(send, 400, {"error": error})
            return
        changes[setting] = value
    allowed = list(host.settings.allowed_bots or ())
    added = uid not in {b.lower() for b in allowed}
    if added:
        changes["allowed_bots"] = [*allowed, uid]
    if changes:
        status, value = await _forward(admin, "PUT", "/admin/settings", json.dumps(changes).encode())
        if status != 200 or not isinstance(value, dict):
            refusal = value.get("error") if isinstance(value, dict) else None
            await send_json(send, status if status != 200 else 500, {"error": str(refusal or "not applied")})
            return
    settings = host.settings
    what = f"Added bot {uid} to allowed_bots" if added else f"Bot {uid} was already allowed"
    message = (
        f"{what}; caps for every bot: {settings.per_call_cap_atoms:,} atoms per call, "
        f"{settings.per_day_cap_atoms:,} atoms per day (mode {settings.mode}). Agents reach it at "
        f"/mcp/{uid} with the bridge's token ({host.cli_command} config-snippet {uid})."
    )
    answer = {
        "uid": uid,
        "added": added,
        "perCallCapAtoms": settings.per_call_cap_atoms,
        "perDayCapAtoms": settings.per_day_cap_atoms,
        "mode": settings.mode,
        "message": message,
    }
    await send_json(send, 200, answer, API_HEADERS)


async def _decide_bot_request(
    admin: PathHandler, scope: Scope, send: Send, request_id: str, approve: bool
) -> None:
    """Deliver the user's decision on an agent's add-bot request to
    ``POST /admin/bot-requests/<id>`` and answer it (the module docstring)."""
    before = await _bot_requests(admin)
    uid = next((r.uid for r in (before.pending if before else ()) if r.id == request_id), None)
    body = json.dumps({"approve": approve}).encode()
    status, value = await _forward(admin, "POST", f"/admin/bot-requests/{request_id}", body)
    answer = value if isinstance(value, dict) else {}
    if status == 200:
        outcome = str(answer.get("outcome") or ("approved" if approve else "denied"))
        verb = "Approved" if approve else "Denied"
        message = f"{verb}: the agent's request to add bot {uid or request_id}; outcome: {outcome}"
        result: dict[str, Any] = {"id": request_id, "outcome": outcome, "message": message}
    else:
        error = str(answer.get("error") or f"HTTP {status}")
        result = {"error": error}
    if wants_json(scope):
        await send_json(send, status, result, API_HEADERS)
        return
    if status != 200:
        await send_html(send, status, render_notice(result["error"], UI_PREFIX + "/"))
        return
    await redirect(send, UI_PREFIX + "/")
