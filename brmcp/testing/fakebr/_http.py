"""The HTTP side of a fake brclient: brclient's Basic-auth wrapper and its
texts (docs/clientrpc.md §Basic auth), the Origin check and upgrade of ``/ws``, and the
plain POST JSON-RPC endpoint on every other path (with the no-auth wrapper
bug that appends its text). :class:`HTTPFront` also keeps the open
websocket connections."""

from __future__ import annotations

import json

from aiohttp import web

from ...clientrpc.protojson import frame
from ._conn import Conn
from ._events import EventLog
from ._handlers import MethodTable
from ._protocol import RPCFault, basic_auth, echo_id, envelope_fields, http_error, origin_ok, skip_ws
from ._session import Sessions
from ._state import Changes, Record, Settings
from .params import Pairs

__all__ = ["HTTPFront"]


class HTTPFront:
    """The aiohttp handlers of one fake brclient and its open connections
    (:attr:`conns`, in accept order).

    ``settings``: the auth mode and credentials, read per request;
    ``record``: upgrade headers and the connection count; ``changes``:
    signalled when a connection opens or closes; ``events``: the streams a
    closed connection leaves; ``methods``: the POST endpoint's handlers;
    ``sessions``: what runs each websocket connection.
    """

    def __init__(
        self,
        settings: Settings,
        record: Record,
        changes: Changes,
        events: EventLog,
        methods: MethodTable,
        sessions: Sessions,
    ) -> None:
        self._settings = settings
        self._record = record
        self._changes = changes
        self._events = events
        self._methods = methods
        self._sessions = sessions
        self.conns: list[Conn] = []
        self._serial = 0

    def routes(self, app: web.Application) -> None:
        """Add ``/ws`` and the POST endpoint (every other path) to ``app``."""
        app.router.add_route("*", "/ws", self._ws_handler)
        app.router.add_route("*", "/{tail:.*}", self._post_handler)

    def _auth_failure(self, request: web.Request) -> web.Response | None:
        """brclient's Basic-auth wrapper (docs/clientrpc.md §Basic auth); None when the request passes."""
        user, password = self._settings.rpcuser, self._settings.rpcpass
        if not user or not password:
            return http_error(401, "Forbidden")
        creds = basic_auth(request.headers.get("Authorization"))
        if creds is None:
            resp = http_error(401, "Unauthorized")
            resp.headers["WWW-Authenticate"] = 'Basic realm="Restricted"'
            return resp
        if creds != (user, password):
            return http_error(403, "Forbidden")
        return None

    async def _ws_handler(self, request: web.Request) -> web.StreamResponse:
        self._record.upgrade_headers.append(dict(request.headers))
        if self._settings.auth_mode:
            failure = self._auth_failure(request)
            if failure is not None:
                return failure
        if not origin_ok(request):
            resp = http_error(403, "Forbidden")
            resp.headers["Sec-Websocket-Version"] = "13"
            return resp
        ws = web.WebSocketResponse(autoping=False, compress=False, max_msg_size=0, protocols=())
        transport = request.transport
        await ws.prepare(request)
        self._serial += 1
        self._record.total_connections += 1
        conn = Conn(ws, transport, self._serial)
        self.conns.append(conn)
        self._changes.changed()
        try:
            await self._sessions.serve(conn)
        finally:
            conn.closed = True
            conn.out.close()
            if conn in self.conns:
                self.conns.remove(conn)
            self._events.forget_conn(conn)
            self._changes.changed()
            if not ws.closed and transport is not None:
                transport.abort()
        return ws

    async def _post_handler(self, request: web.Request) -> web.StreamResponse:
        if self._settings.auth_mode:
            failure = self._auth_failure(request)
            if failure is not None:
                return failure
        body = (await request.read()).decode("utf-8", errors="replace")
        resp = web.StreamResponse(status=200)
        resp.headers["Content-Type"] = "text/plain; charset=utf-8"
        await resp.prepare(request)
        decoder = json.JSONDecoder(object_pairs_hook=Pairs)
        pos = 0
        while True:
            pos = skip_ws(body, pos)
            if pos >= len(body):
                break
            try:
                value, pos = decoder.raw_decode(body, pos)
            except ValueError:
                break
            env = envelope_fields(value)
            if env is None or env.get("jsonrpc") != "2.0":
                break
            method = env.get("method")
            if env.get("id") is None or not isinstance(method, str):
                continue
            try:
                result = await self._methods.execute(method, env.get("params"), "params" in env)
                line = {"jsonrpc": "2.0", "id": echo_id(env["id"]), "result": result}
            except RPCFault as fault:
                line = {
                    "jsonrpc": "2.0",
                    "id": echo_id(env["id"]),
                    "error": {"code": fault.code, "message": fault.message},
                }
            await resp.write(frame(line))
        if not self._settings.auth_mode:
            # brclient's auth wrapper does not return after serving: it goes on
            # checking and appends its error text to the POST response.
            appended = self._auth_failure(request)
            if appended is not None and appended.text is not None:
                await resp.write(appended.text.encode("utf-8"))
        await resp.write_eof()
        return resp
