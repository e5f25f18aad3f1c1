"""The bridge's HTTP surface: a pure ASGI app (BRIDGE.md §Security model: the
reference's gate plus the hardening listed there).

Every request passes the gate in this order:

1. bridge disabled → 404 ``not found`` (any path, any method);
2. ``Host`` not a loopback name (``localhost``, ``127.0.0.1``, ``[::1]``,
   any port) → 421; an ``Origin`` that is present and not loopback → 403
   (DNS-rebinding defence);
3. ``/mcp/…``: ``Authorization: Bearer <token>`` (scheme without case,
   token in constant time; an empty configured token never authorizes, a
   bare token is refused) → 401 with ``WWW-Authenticate: Bearer`` and a JSON
   body saying where the token comes from; ``/admin/…``: the admin token →
   the same 401;
4. path ``/mcp/<64-hex uid>`` (case-insensitive) else 404 ``unknown bot:
   malformed uid …`` saying a uid is 64 hex characters;
   a uid not on ``allowed_bots`` → 404 naming the command that allows it;
5. method not GET/POST/DELETE → 405; a POST body that is not
   ``application/json`` → 415, larger than the limit → 413, not JSON → 400
   with JSON-RPC -32700, a JSON array (batch) or non-object → 400 with
   -32600 — before anything reaches the bot session;
6. pre-flight: the bot link and its tool snapshot, else 503 ``bot
   unavailable``;
7. the SDK's streamable-HTTP session manager of that bot's proxy server;
   ``/mcp/discover`` (the bridge's own endpoint, :mod:`.agentdiscovery`)
   takes steps 1 to 3 and 5, then its own SDK server;
   after a DELETE it accepted (the agent ended its session) the bot link
   forgets that session's resource subscriptions.

Plain-text errors are written like Go's ``http.Error`` (``text/plain;
charset=utf-8``, ``X-Content-Type-Options: nosniff``, trailing newline).
The checks and refusals of steps 2 to 4 and 6 (loopback names, the bearer
token, the 401/404/503 answers) are :mod:`._gate`'s; this module runs the
gate in order and serves what passes it; a large ``tools/call`` answer is
rewritten from SSE to JSON by :mod:`._largeanswer`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import OrderedDict
from typing import Any, Protocol

import anyio
import anyio.abc
from mcp.types import INVALID_REQUEST, PARSE_ERROR
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import Message, Receive, Scope, Send

from brmcp.bridge.base import (
    MAX_ADMIN_BODY_BYTES,
    PathHandler,
    Settings,
    header_values,
    read_body,
    replay_body,
    route_path,
    send_json,
    send_text,
)
from brmcp.bridge.links import AgentCall, LinkError

from ._events import ResumableSessionManager
from ._gate import (
    ADMIN_UNAUTHORIZED_HINT,
    bearer_matches,
    host_is_loopback,
    malformed_uid_text,
    not_allowed_hint,
    origin_is_loopback,
    send_jsonrpc_error,
    send_unauthorized,
    send_unavailable,
    unauthorized_hint,
)
from ._largeanswer import LargeAsJson
from ._proxy import BotProxy

__all__ = [
    "MAX_ADMIN_BODY_BYTES",
    "MAX_BODY_BYTES",
    "AdminHandler",
    "BridgeApp",
    "EndpointHost",
    "read_body",
    "send_json",
    "send_text",
]

log = logging.getLogger("brmcp.bridge")

#: Largest accepted MCP request body (bytes).
MAX_BODY_BYTES = 4 * 1024 * 1024

_MCP_METHODS = frozenset({"GET", "POST", "DELETE"})
_HEX = frozenset("0123456789abcdef")


class _Endpoint:
    __slots__ = ("manager", "proxy", "stop")

    def __init__(self, proxy: BotProxy, manager: ResumableSessionManager) -> None:
        self.proxy = proxy
        self.manager = manager
        self.stop = anyio.Event()


#: Serves one authorized ``/admin/…`` request; the last argument is the path.
AdminHandler = PathHandler

#: The bridge's own MCP endpoint for agents (:mod:`.agentdiscovery`).
DISCOVER_PATH = "/mcp/discover"


class DiscoverEndpoint(Protocol):
    """The ``/mcp/discover`` endpoint (:class:`~.agentdiscovery.AgentDiscovery`)."""

    async def handle(
        self, scope: Scope, receive: Receive, send: Send, message: dict[str, Any] | None
    ) -> None:
        """Serve one request that passed the gate (``message``: the checked POST body)."""
        ...

    def drop(self) -> None:
        """End every agent session of the endpoint."""
        ...


class EndpointHost(Protocol):
    """What the HTTP app needs from the bridge (the :class:`~brmcp.bridge.Bridge`)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def admin_token(self) -> str: ...

    @property
    def cli_command(self) -> str:
        """``brmcp-bridge``, with ``--datadir`` when the data dir is not the default."""
        ...

    def _proxy(self, uid: str) -> BotProxy: ...

    def _task_group(self) -> anyio.abc.TaskGroup: ...


#: Seconds after which an agent's idle HTTP MCP session is forgotten (the
#: agent re-initializes on the 404, as the MCP spec requires). The Go bridge
#: never expires them; a bound keeps a token holder from growing memory
#: without limit. The SDK also caps open sessions (10,000, then 503).
AGENT_SESSION_IDLE_TIMEOUT = 3600.0


#: The ``retry`` field (milliseconds) of every priming SSE event: how long an
#: agent waits before it resumes a dropped stream.
RETRY_INTERVAL_MS = 1000
#: Seconds a call whose agent connection closed waits for a resume before
#: the agent counts as gone.
RESUME_GRACE = 3.0
#: The first protocol version whose streams are primed and resumable.
RESUMABLE_VERSION = "2025-11-25"
#: Agent sessions whose initialize version is remembered.
MAX_REMEMBERED_SESSIONS = 10_000


async def _expire(calls: list[AgentCall]) -> None:
    """After :data:`RESUME_GRACE` seconds (wall time), the still-detached
    calls' agents are gone. Meanwhile no payment starts for them
    (:class:`~brmcp.bridge.links._relay.AgentGone`); a payment parked for approval
    stays listed and is withdrawn here unless the agent resumed."""
    try:
        await anyio.sleep(RESUME_GRACE)
    finally:
        # Also when the bridge closes during the grace: nobody resumes then.
        for call in calls:
            if call.detached:
                call.gone.set()


#: Seconds a call's SSE stream is held back waiting to see whether its answer
#: must go as JSON; after that it streams (so a long call, e.g. one parked
#: for approval, shows its priming event and can be resumed).
MAX_HOLD_SECONDS = 5.0


class BridgeApp:
    """The ASGI application (``bridge.asgi_app``). Mount it at the root of a
    loopback-only server, or let the bridge serve it on its own listener."""

    def __init__(
        self,
        bridge: EndpointHost,
        admin: AdminHandler,
        *,
        ui: PathHandler | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        discover: DiscoverEndpoint | None = None,
    ) -> None:
        self._bridge = bridge
        self._admin = admin
        self._ui = ui
        self._discover = discover
        self._max_body = max_body_bytes
        self._endpoints: dict[str, _Endpoint] = {}
        self._lock = anyio.Lock()
        #: ``tools/call`` requests being served, and an event set while there are none.
        self._calls = 0
        self._idle = anyio.Event()
        self._idle.set()
        #: The protocol version each recent agent session asked for in initialize.
        self._versions: OrderedDict[str, str] = OrderedDict()

    # -- endpoints ------------------------------------------------------------

    async def _endpoint(self, uid: str) -> _Endpoint:
        endpoint = self._endpoints.get(uid)
        if endpoint is not None and not endpoint.proxy.link.closed:
            return endpoint
        async with self._lock:
            endpoint = self._endpoints.get(uid)
            if endpoint is not None:
                if not endpoint.proxy.link.closed:
                    return endpoint
                self.drop(uid)
            proxy = self._bridge._proxy(uid)
            manager = ResumableSessionManager(
                proxy.server,
                session_idle_timeout=AGENT_SESSION_IDLE_TIMEOUT,
                max_request_body_size=self._max_body,
                retry_interval=RETRY_INTERVAL_MS,
            )
            endpoint = _Endpoint(proxy, manager)
            await self._bridge._task_group().start(self._run_manager, endpoint)
            self._endpoints[uid] = endpoint
            return endpoint

    @staticmethod
    async def _run_manager(endpoint: _Endpoint, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        started = False
        try:
            async with endpoint.manager.run():
                task_status.started()
                started = True
                await endpoint.stop.wait()
        except Exception:
            if not started:
                raise
            log.exception("bridge: HTTP session manager of bot %s failed", endpoint.proxy.link.uid[:8])

    def drop(self, uid: str) -> None:
        """End every HTTP session of one bot (its path answers afresh)."""
        endpoint = self._endpoints.pop(uid, None)
        if endpoint is not None:
            endpoint.stop.set()

    def drop_all(self) -> None:
        """End every HTTP session (token rotated, bridge disabled or closing)."""
        for uid in list(self._endpoints):
            self.drop(uid)
        if self._discover is not None:
            self._discover.drop()

    @property
    def calls_in_flight(self) -> int:
        """``tools/call`` requests being served (their answer not written yet)."""
        return self._calls

    async def calls_answered(self) -> None:
        """Return once no ``tools/call`` request is being served: each has
        written its answer (or its connection went away). Bound it with a
        timeout."""
        await self._idle.wait()

    # -- ASGI -----------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        try:
            await self._http(scope, receive, send)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:
            log.exception("bridge: request failed")
            raise

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        bridge = self._bridge
        settings = bridge.settings
        if not settings.enabled:
            await send_text(send, 404, "not found")
            return
        hosts = header_values(scope, b"host")
        if len(hosts) != 1 or not host_is_loopback(hosts[0].decode("latin-1")):
            await send_text(send, 421, "invalid Host header")
            return
        origins = header_values(scope, b"origin")
        if len(origins) > 1 or (origins and not origin_is_loopback(origins[0].decode("latin-1"))):
            await send_text(send, 403, "invalid Origin header")
            return
        path = route_path(scope)
        if self._ui is not None and (path == "/ui" or path.startswith("/ui/")):
            # The approvals page authenticates with its own session cookie,
            # minted from the admin token (brmcp-bridge ui); see brmcp/bridge/admin/ui/.
            await self._ui(scope, receive, send, path)
            return
        auth = header_values(scope, b"authorization")
        if path.startswith("/admin/") or path == "/admin":
            if not bearer_matches(auth[0] if auth else None, bridge.admin_token):
                await send_unauthorized(send, ADMIN_UNAUTHORIZED_HINT, credentials_sent=bool(auth))
                return
            await self._admin(scope, receive, send, path)
            return
        if not bearer_matches(auth[0] if auth else None, settings.token):
            hint = unauthorized_hint(bridge.cli_command)
            await send_unauthorized(send, hint, credentials_sent=bool(auth))
            return
        if path == DISCOVER_PATH and self._discover is not None:
            await self._serve_discover(self._discover, scope, receive, send)
            return
        uid = path[len("/mcp/") :].lower() if path.startswith("/mcp/") else ""
        if len(uid) != 64 or not set(uid) <= _HEX:
            await send_text(send, 404, malformed_uid_text(path))
            return
        if not settings.allows(uid):
            await send_text(send, 404, not_allowed_hint(uid, bridge.cli_command))
            return
        method = scope.get("method", "")
        request = await self._check_request(scope, receive, send)
        if request is None:
            return
        receive, message = request
        try:
            endpoint = await self._endpoint(uid)
            await endpoint.proxy.link.refresh()
        except (LinkError, RuntimeError) as exc:
            log.info("bot %s unavailable: %s", uid[:8], exc)
            await send_unavailable(send, exc, message)
            return
        scope = self._versioned(scope)
        if method == "POST" and message is not None and message.get("method") == "tools/call":
            await self._serve_call(endpoint, scope, receive, send, message)
            return
        if method == "POST" and message is not None and message.get("method") == "initialize":
            await self._serve_initialize(endpoint, scope, receive, send, message)
            return
        if method == "GET":
            self._resume(endpoint, scope)
        if method != "DELETE":
            await endpoint.manager.handle_request(scope, receive, send)
            return
        status = 0

        async def watch_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await endpoint.manager.handle_request(scope, receive, watch_status)
        ended = header_values(scope, b"mcp-session-id")
        # Only a DELETE the SDK accepted ended the session; a refused one
        # (bad protocol version, ...) leaves it, and its subscriptions, alive.
        if 200 <= status < 300 and len(ended) == 1:
            session_id = ended[0].decode("latin-1")
            # Its calls still in flight have nobody to answer: a payment
            # parked for one of them is withdrawn, none is started.
            if endpoint.proxy.link.relay.abandon(session_id):
                log.info("agent session ended with calls in flight: they count as gone")
            endpoint.proxy.link.forget_agent(session_id)

    async def _serve_discover(
        self, discover: DiscoverEndpoint, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """The bridge's own endpoint (after the token check): the same method
        and body checks as a bot's endpoint (step 5), then its SDK server."""
        request = await self._check_request(scope, receive, send)
        if request is None:
            return
        receive, message = request
        await discover.handle(scope, receive, send, message)

    async def _check_request(
        self, scope: Scope, receive: Receive, send: Send
    ) -> tuple[Receive, dict[str, Any] | None] | None:
        """The method and body checks of an MCP endpoint: GET, POST and
        DELETE only (else 405), a POST's body through :meth:`_check_post`.
        Returns ``(receive, message)`` (``message`` None but for a POST),
        or None once a refusal was sent."""
        method = scope.get("method", "")
        if method not in _MCP_METHODS:
            await send_text(send, 405, "method not allowed", [(b"allow", b"GET, POST, DELETE")])
            return None
        if method != "POST":
            return receive, None
        return await self._check_post(scope, receive, send)

    async def _serve_call(
        self, endpoint: _Endpoint, scope: Scope, receive: Receive, send: Send, message: dict[str, Any]
    ) -> None:
        """Serve a ``tools/call`` POST. When its connection closes before the
        answer was written (the agent's FIN or TCP reset: uvicorn reports
        ``http.disconnect`` and the SDK's stream ends), the call is
        detached: no payment starts for it meanwhile. Unless the agent
        resumes the stream (``GET`` with ``Last-Event-ID``) within
        :data:`RESUME_GRACE` seconds, the agent counts as gone: a parked
        approval is withdrawn and no payment is started (BRIDGE.md
        §Resumability)."""
        finished = False

        async def watch(event: Message) -> None:
            nonlocal finished
            if event["type"] == "http.response.body" and not event.get("more_body", False):
                finished = True
            await send(event)

        accepts = b",".join(header_values(scope, b"accept")).lower()
        out = LargeAsJson(watch, message.get("id"), b"application/json" in accepts or b"*/*" in accepts)
        if self._calls == 0:
            self._idle = anyio.Event()
        self._calls += 1
        try:
            async with anyio.create_task_group() as tg:

                async def release_later() -> None:
                    await anyio.sleep(MAX_HOLD_SECONDS)
                    await out.release()

                tg.start_soon(release_later)
                await endpoint.manager.handle_request(scope, receive, out)
                tg.cancel_scope.cancel()
        finally:
            self._calls -= 1
            if self._calls == 0:
                self._idle.set()
            sessions = header_values(scope, b"mcp-session-id")
            if not finished and len(sessions) == 1 and "id" in message:
                session_id = sessions[0].decode("latin-1")
                calls = endpoint.proxy.link.relay.detach(session_id, message["id"])
                if calls:
                    log.info("agent connection closed with call %r in flight", message["id"])
                    with contextlib.suppress(RuntimeError):  # the bridge is closing
                        self._bridge._task_group().start_soon(_expire, calls)

    async def _serve_initialize(
        self, endpoint: _Endpoint, scope: Scope, receive: Receive, send: Send, message: dict[str, Any]
    ) -> None:
        """Serve an ``initialize`` POST and remember the protocol version the
        new session asked for (see :meth:`_versioned`)."""
        params = message.get("params")
        asked = params.get("protocolVersion") if isinstance(params, dict) else None

        async def watch(event: Message) -> None:
            if event["type"] == "http.response.start" and isinstance(asked, str):
                for key, value in event.get("headers", ()):
                    if key.lower() == b"mcp-session-id":
                        self._versions[value.decode("latin-1")] = asked
                        while len(self._versions) > MAX_REMEMBERED_SESSIONS:
                            self._versions.popitem(last=False)
            await send(event)

        await endpoint.manager.handle_request(scope, receive, watch)

    def _versioned(self, scope: Scope) -> Scope:
        """A request of a session that negotiated 2025-11-25 or later but
        names an older ``MCP-Protocol-Version`` is served as the negotiated
        version: the agent speaks it (it asked for it), and the SDK primes
        and stores streams (resumability) only for 2025-11-25 and later."""
        sessions = header_values(scope, b"mcp-session-id")
        if len(sessions) != 1:
            return scope
        asked = self._versions.get(sessions[0].decode("latin-1"))
        versions = header_values(scope, b"mcp-protocol-version")
        if asked is None or asked < RESUMABLE_VERSION or len(versions) != 1:
            return scope
        given = versions[0].decode("latin-1")
        if given not in HANDSHAKE_PROTOCOL_VERSIONS or given >= RESUMABLE_VERSION:
            return scope  # an unknown version is left for the SDK to refuse
        headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"mcp-protocol-version"]
        headers.append((b"mcp-protocol-version", RESUMABLE_VERSION.encode()))
        return {**scope, "headers": headers}

    @staticmethod
    def _resume(endpoint: _Endpoint, scope: Scope) -> None:
        """A ``GET`` with ``Last-Event-ID`` resumes a stream: its call (if
        still in flight) is attached again."""
        sessions = header_values(scope, b"mcp-session-id")
        last = header_values(scope, b"last-event-id")
        if len(sessions) != 1 or len(last) != 1:
            return
        session_id = sessions[0].decode("latin-1")
        store = endpoint.manager.store(session_id)
        stream = store.stream_of(last[0].decode("latin-1")) if store is not None else None
        if stream is not None and endpoint.proxy.link.relay.reattach(session_id, stream):
            log.info("agent resumed the stream of call %s", stream)

    async def _check_post(
        self, scope: Scope, receive: Receive, send: Send
    ) -> tuple[Receive, dict[str, Any]] | None:
        """Validate a POST body before it can reach a session; returns a
        receive callable that replays it and the parsed message, or None
        after answering."""
        ctype = header_values(scope, b"content-type")
        if not ctype or not ctype[0].decode("latin-1").lower().startswith("application/json"):
            await send_text(send, 415, "unsupported media type: Content-Type must be application/json")
            return None
        length = header_values(scope, b"content-length")
        if length:
            try:
                declared = int(length[0])
            except ValueError:
                await send_text(send, 400, "bad Content-Length")
                return None
            if declared > self._max_body:
                await send_text(send, 413, "request body too large")
                return None
        body, extra = await read_body(receive, self._max_body)
        if body is None and extra:
            return None  # the client went away
        if body is None:
            await send_text(send, 413, "request body too large")
            return None
        try:
            message = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            await send_jsonrpc_error(send, 400, PARSE_ERROR, "Parse error")
            return None
        if isinstance(message, list):
            await send_jsonrpc_error(send, 400, INVALID_REQUEST, "batch requests are not supported")
            return None
        if not isinstance(message, dict):
            await send_jsonrpc_error(send, 400, INVALID_REQUEST, "Invalid Request")
            return None
        return replay_body(body, receive), message
