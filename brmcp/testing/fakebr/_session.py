"""The websocket sessions of a fake brclient: for each connection the
writer, the keepalive pinger (16 random bytes, identical pong required),
the reader (first JSON value of each message, 16 requests in flight, pongs
padded to 16 bytes) and the requests and streams it starts
(docs/clientrpc.md §Keepalive, §Requests and responses, §Streams; server.py
documents the behaviour)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import anyio
from aiohttp import WSMsgType

from ._conn import WS_CLOSED, Conn, Stream
from ._events import EventLog
from ._handlers import MethodTable
from ._protocol import CODE_INTERNAL, STREAMS, RPCFault, envelope_fields, method_name, pad16, skip_ws
from ._state import Changes, Controls, Record, Settings
from .params import Pairs, plain

__all__ = ["Sessions"]

log = logging.getLogger("brmcp.testing.fakebr")


class Sessions:
    """The per-connection loops of one fake brclient.

    ``settings``: keepalive and in-flight limits (read per connection) and
    the nick in log lines; ``record``: where requests, frames and pings are
    counted; ``changes``: signalled on each; ``controls``: the reading pause;
    ``events``: the streams' replay logs; ``methods``: the unary handlers.
    """

    def __init__(
        self,
        settings: Settings,
        record: Record,
        changes: Changes,
        controls: Controls,
        events: EventLog,
        methods: MethodTable,
    ) -> None:
        self._settings = settings
        self._record = record
        self._changes = changes
        self._controls = controls
        self._events = events
        self._methods = methods

    async def serve(self, conn: Conn) -> None:
        """Run ``conn``'s writer, pinger and reader until the reader ends
        (the client left, a bad message, or :meth:`Conn.abort`)."""
        async with anyio.create_task_group() as tg:
            conn.tg = tg
            tg.start_soon(self._writer, conn)
            interval = self._settings.ping_interval
            if interval is not None and interval > 0:
                tg.start_soon(self._pinger, conn, interval, self._settings.ping_timeout)
            await self._read_loop(conn)
            tg.cancel_scope.cancel()

    async def _writer(self, conn: Conn) -> None:
        try:
            async with conn.out_recv:
                async for data in conn.out_recv:
                    await conn.ws.send_bytes(data)
        except (ConnectionError, RuntimeError) as exc:
            conn.abort(f"write failed: {exc}")

    async def _pinger(self, conn: Conn, interval: float, wait: float) -> None:
        while True:
            await anyio.sleep(interval)
            data = os.urandom(16)
            conn.keepalive_ping = data
            conn.keepalive_pong = anyio.Event()
            try:
                await conn.ws.ping(data)
            except (ConnectionError, RuntimeError):
                conn.abort("ping failed")
                return
            with anyio.move_on_after(wait) as scope:
                await conn.keepalive_pong.wait()
            if scope.cancelled_caught:
                log.info("fakebr: %s: pong timeout; dropping the connection", self._settings.nick)
                conn.abort("pong timeout")
                return

    def _on_pong(self, conn: Conn, data: bytes) -> None:
        conn.pongs.append(data)
        waiter = conn.test_pings.pop(data, None)
        if waiter is not None:
            waiter.set()
            return
        if conn.keepalive_ping is not None:
            if data != conn.keepalive_ping:
                log.info("fakebr: %s: ping data != pong data; dropping the connection", self._settings.nick)
                conn.abort("ping data != pong data")
                return
            conn.keepalive_ping = None
            conn.keepalive_pong.set()
            self._record.keepalive_pongs += 1
            self._changes.changed()

    async def _read_loop(self, conn: Conn) -> None:
        ws = conn.ws
        while not conn.closed:
            if await self._controls.wait_reading():
                continue
            msg = await ws.receive()
            if msg.type == WSMsgType.PING:
                data = bytes(msg.data)
                self._record.pings_received.append(data)
                self._changes.changed()
                await ws.pong(pad16(data))
                continue
            if msg.type == WSMsgType.PONG:
                self._on_pong(conn, bytes(msg.data))
                continue
            if msg.type in WS_CLOSED:
                return
            raw = msg.data if isinstance(msg.data, bytes) else str(msg.data).encode("utf-8")
            self._record.frames_in.append(raw)
            if not await self._on_message(conn, raw):
                conn.abort("bad message")
                return

    async def _on_message(self, conn: Conn, raw: bytes) -> bool:
        """Handle one client message; False closes the connection."""
        nick = self._settings.nick
        try:
            text = raw.decode("utf-8")
            value, _ = json.JSONDecoder(object_pairs_hook=Pairs).raw_decode(text, skip_ws(text, 0))
        except (UnicodeDecodeError, ValueError):
            log.info("fakebr: %s: malformed JSON from the client; closing", nick)
            return False
        env = envelope_fields(value)
        if env is None:
            log.info("fakebr: %s: a message that is not a JSON object; closing", nick)
            return False
        if env.get("jsonrpc") != "2.0":
            log.info('fakebr: %s: jsonrpc is not "2.0"; closing', nick)
            return False
        has_id = env.get("id") is not None
        method = env.get("method")
        has_outcome = "result" in env or "error" in env
        if has_id and method is not None and not has_outcome:
            if not isinstance(method, str):
                return False
            while conn.in_flight >= self._settings.max_in_flight:  # stop reading until a slot frees
                await conn.slot_freed.wait()
            conn.in_flight += 1
            record = self._record
            record.max_in_flight_seen = max(record.max_in_flight_seen, conn.in_flight)
            record.requests.append((method, plain(env.get("params"))))
            self._changes.changed()
            assert conn.tg is not None
            conn.tg.start_soon(
                self._handle_request, conn, env["id"], method, env.get("params"), "params" in env
            )
        elif not has_id and method is not None and not has_outcome:
            log.debug("fakebr: %s: ignoring a client notification %r", nick, method)
        else:
            log.debug("fakebr: %s: ignoring an unrecognized message", nick)
        return True

    async def _handle_request(
        self, conn: Conn, request_id: Any, method: str, params: Any, present: bool
    ) -> None:
        try:
            name = method_name(method)
            kind = STREAMS.get(name)
            if kind is not None:
                request = self._methods.decode(name, params, present)
                await self._serve_stream(conn, request_id, method, kind, request)
                return
            result = await self._methods.execute(method, params, present)
            conn.respond(request_id, result=result)
        except RPCFault as fault:
            conn.respond(request_id, error=(fault.code, fault.message))
        except Exception as exc:
            log.exception("fakebr: %s: handler for %s failed", self._settings.nick, method)
            conn.respond(request_id, error=(CODE_INTERNAL, str(exc)))
        finally:
            conn.release_slot()
            self._changes.changed()

    async def _serve_stream(self, conn: Conn, request_id: Any, method: str, kind: str, request: Any) -> None:
        stream = Stream(conn, request_id, method, kind)
        self._events.open_stream(stream, int(request.get("unacked_from", 0)))
        try:
            await stream.ended.wait()
        finally:
            self._events.close_stream(stream)
        conn.respond(request_id, error=stream.end)
