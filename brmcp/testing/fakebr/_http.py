"""The HTTP side of a fake brclient: brclient's Basic-auth wrapper and its
texts (docs/clientrpc.md §Basic auth), the Origin check and upgrade of ``/ws``, and the
plain POST JSON-RPC endpoint on every other path (with the no-auth wrapper
bug that appends its text)."""

from __future__ import annotations

import json

import anyio
from aiohttp import web

from ...clientrpc.protojson import frame
from ._conn import _Conn
from ._protocol import RPCFault, _basic_auth, _echo_id, _envelope, _http_error, _origin_ok, _skip_ws
from ._session import _Session
from .params import Pairs

__all__ = ["_HTTP"]


class _HTTP(_Session):
    """The aiohttp handlers of :class:`~.server.FakeBRClient`."""

    def _auth_failure(self, request: web.Request) -> web.Response | None:
        """brclient's Basic-auth wrapper (docs/clientrpc.md §Basic auth); None when the request passes."""
        if not self.rpcuser or not self.rpcpass:
            return _http_error(401, "Forbidden")
        creds = _basic_auth(request.headers.get("Authorization"))
        if creds is None:
            resp = _http_error(401, "Unauthorized")
            resp.headers["WWW-Authenticate"] = 'Basic realm="Restricted"'
            return resp
        if creds != (self.rpcuser, self.rpcpass):
            return _http_error(403, "Forbidden")
        return None

    async def _ws_handler(self, request: web.Request) -> web.StreamResponse:
        self.upgrade_headers.append(dict(request.headers))
        if self.auth_mode:
            failure = self._auth_failure(request)
            if failure is not None:
                return failure
        if not _origin_ok(request):
            resp = _http_error(403, "Forbidden")
            resp.headers["Sec-Websocket-Version"] = "13"
            return resp
        ws = web.WebSocketResponse(autoping=False, compress=False, max_msg_size=0, protocols=())
        transport = request.transport
        await ws.prepare(request)
        self._serial += 1
        self.total_connections += 1
        conn = _Conn(ws, transport, self._serial)
        self._conns.append(conn)
        self._changed()
        try:
            async with anyio.create_task_group() as tg:
                conn.tg = tg
                tg.start_soon(self._writer, conn)
                if self.ping_interval is not None and self.ping_interval > 0:
                    tg.start_soon(self._pinger, conn, self.ping_interval, self.ping_timeout)
                await self._read_loop(conn)
                tg.cancel_scope.cancel()
        finally:
            conn.closed = True
            conn.out.close()
            if conn in self._conns:
                self._conns.remove(conn)
            for streams in self._streams.values():
                streams[:] = [s for s in streams if s.conn is not conn]
            self._changed()
            if not ws.closed and transport is not None:
                transport.abort()
        return ws

    async def _post_handler(self, request: web.Request) -> web.StreamResponse:
        if self.auth_mode:
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
            pos = _skip_ws(body, pos)
            if pos >= len(body):
                break
            try:
                value, pos = decoder.raw_decode(body, pos)
            except ValueError:
                break
            env = _envelope(value)
            if env is None or env.get("jsonrpc") != "2.0":
                break
            method = env.get("method")
            if env.get("id") is None or not isinstance(method, str):
                continue
            try:
                result = await self._execute(None, method, env.get("params"), "params" in env)
                line = {"jsonrpc": "2.0", "id": _echo_id(env["id"]), "result": result}
            except RPCFault as fault:
                line = {
                    "jsonrpc": "2.0",
                    "id": _echo_id(env["id"]),
                    "error": {"code": fault.code, "message": fault.message},
                }
            await resp.write(frame(line))
        if not self.auth_mode:
            # brclient's auth wrapper does not return after serving: it goes on
            # checking and appends its error text to the POST response.
            appended = self._auth_failure(request)
            if appended is not None and appended.text is not None:
                await resp.write(appended.text.encode("utf-8"))
        await resp.write_eof()
        return resp
