"""One websocket connection to brclient's clientrpc: the JSON-RPC 2.0
multiplexer the :class:`~brmcp.clientrpc.Client` runs per connection.

It numbers requests, holds the 16 request slots, matches responses to
pending unary calls and to open streams, routes notifications to their
subscriptions, keeps the connection alive with its own pings, and fails
everything in flight when the connection ends. Rules and their source:

* Request ids are a per-connection counter from 1; stream requests use the
  same counter and carry a decimal ``[NNNNNNNN]`` suffix from a separate
  per-connection counter from 0; notifications are matched by the exact
  method string; a stream ends with the error response to its opening id
  (10000 ``EOF`` = clean end) (docs/clientrpc.md §Request ids, §Streams).
* At most 16 requests in flight, each open stream holding a slot until the
  server ends it or the connection drops
  (docs/clientrpc.md §The concurrency limit). A request abandoned by
  timeout or cancellation keeps its slot until brclient answers, because
  brclient counts it until then.
* Keepalive: a ping of 16 random bytes every ``interval`` seconds (brclient
  echoes exactly those 16 bytes; docs/clientrpc.md §Keepalive); no pong
  within the wait drops the connection.
* Bad server input never crashes the client: unknown notifications, responses
  to unknown ids and streams ended with an error are logged; malformed JSON
  makes the connection state unknowable, so the connection is dropped.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Protocol

import anyio
import anyio.abc
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from ._slots import Slots
from .backoff import Backoff
from .errors import ClientrpcConnectionLost, ClientrpcNotConnected, RPCError
from .protojson import frame
from .subscription import Subscription
from .types import stream_params

__all__ = ["MAX_IN_FLIGHT", "STREAM_EOF_CODE", "Connection"]

log = logging.getLogger("brmcp.clientrpc")

#: brclient's per-connection limit of concurrent requests, open streams included
#: (docs/clientrpc.md §The concurrency limit).
MAX_IN_FLIGHT = 16
#: The error code of a clean stream end (message ``EOF``).
STREAM_EOF_CODE = 10000


class _Owner(Protocol):
    """What a connection needs from its client."""

    _max_in_flight: int
    _backoff_initial: float
    _backoff_max: float

    def _changed(self) -> None: ...


class _Pending:
    """A unary request awaiting its response."""

    __slots__ = ("error", "event", "method", "result")

    def __init__(self, method: str) -> None:
        self.method = method
        self.event = anyio.Event()
        self.result: Any = None
        self.error: Exception | None = None


class _Stream:
    """A subscription's stream request on one connection, until brclient ends it."""

    __slots__ = ("ended", "error", "events", "method", "request_id", "sub")

    def __init__(self, sub: Subscription[Any], request_id: int, method: str) -> None:
        self.sub = sub
        self.request_id = request_id
        self.method = method
        self.ended = anyio.Event()
        self.error: RPCError | None = None
        self.events = 0


def _rpc_error(method: str, error: Any) -> RPCError:
    if isinstance(error, Mapping):
        code = error.get("code")
        message = error.get("message")
        return RPCError(
            method,
            code if isinstance(code, int) and not isinstance(code, bool) else 0,
            message if isinstance(message, str) else json.dumps(error)[:200],
            error.get("data"),
        )
    return RPCError(method, 0, f"malformed error object {error!r:.200}")


class Connection:
    """State of one websocket connection: ids, slots, pending calls, streams."""

    def __init__(self, client: _Owner, ws: ClientConnection, serial: int) -> None:
        self.client = client
        self.ws = ws
        self.serial = serial
        self.next_id = 1
        self.stream_counter = 0
        self.slots = Slots(client._max_in_flight)
        self.pending: dict[int, _Pending] = {}
        self.streams_by_method: dict[str, _Stream] = {}
        self.streams_by_id: dict[int, _Stream] = {}
        self.alive = True
        self.reason: str | None = None
        self.close_code = 1000
        self.graceful = True
        self.tg: anyio.abc.TaskGroup | None = None

    def take_id(self) -> int:
        rid = self.next_id
        self.next_id = rid + 1 if rid < 0xFFFFFFFF else 1
        return rid

    def abort(self, reason: str, close_code: int = 1000) -> None:
        """Drop this connection (the client then reconnects)."""
        if self.reason is None:
            self.reason = reason
            self.close_code = close_code
        if self.tg is not None:
            self.tg.cancel_scope.cancel()

    async def send(self, message: Mapping[str, Any]) -> None:
        await self.ws.send(frame(message))

    # -- requests -------------------------------------------------------------------

    async def call(self, method: str, params: Mapping[str, Any], limit: float | None) -> Any:
        await self.slots.acquire()
        if not self.alive:
            raise ClientrpcNotConnected()
        rid = self.take_id()
        pending = self.pending[rid] = _Pending(method)
        # websockets also raises ConnectionClosed when the frame was written and
        # only the drain failed: then brclient may have the request.
        writable = self.ws.state is State.OPEN
        try:
            await self.send({"jsonrpc": "2.0", "id": rid, "params": params, "method": method})
        except ConnectionClosed:
            if self.pending.pop(rid, None) is not None:
                self.slots.release()
            if writable:
                raise ClientrpcConnectionLost(
                    f"brclient connection lost while sending {method}; it may have been carried out"
                ) from None
            raise ClientrpcNotConnected(f"brclient connection closed while sending {method}") from None
        # On timeout or cancellation the entry stays: brclient still counts the
        # request, so its slot is released only when the reply (or the end of
        # the connection) comes.
        with anyio.fail_after(limit):
            await pending.event.wait()
        if pending.error is not None:
            raise pending.error
        return pending.result

    # -- streams --------------------------------------------------------------------

    async def run_stream(self, sub: Subscription[Any]) -> None:
        """Open ``sub``'s stream on this connection; reopen it (with backoff) if
        brclient ends it while the connection lives."""
        client = self.client
        backoff = Backoff(client._backoff_initial, client._backoff_max)
        while self.alive and not sub.closed:
            try:
                await self.slots.acquire()
            except ClientrpcNotConnected:
                return
            rid = self.take_id()
            method = f"{sub.method}[{self.stream_counter:08d}]"
            self.stream_counter += 1
            binding = _Stream(sub, rid, method)
            self.streams_by_method[method] = binding
            self.streams_by_id[rid] = binding
            try:
                await self.send(
                    {"jsonrpc": "2.0", "id": rid, "params": stream_params(sub.unacked_from), "method": method}
                )
            except ConnectionClosed:
                return
            sub.opens += 1
            sub._open_on = self.serial
            client._changed()
            await binding.ended.wait()
            sub._open_on = None
            if sub.closed or not self.alive:
                return
            if binding.events:
                backoff.reset()
            delay = backoff.next()
            if binding.error is None:
                log.info("clientrpc: brclient ended stream %s (EOF); reopening in %.1fs", method, delay)
            else:
                log.warning(
                    "clientrpc: brclient ended stream %s with error %d %r; reopening in %.1fs",
                    method,
                    binding.error.code,
                    binding.error.message,
                    delay,
                )
            await anyio.sleep(delay)

    def end_stream(self, binding: _Stream, error: RPCError | None) -> None:
        self.streams_by_method.pop(binding.method, None)
        self.streams_by_id.pop(binding.request_id, None)
        self.slots.release()
        binding.error = error
        binding.ended.set()

    # -- reading --------------------------------------------------------------------

    async def reader(self) -> None:
        try:
            async for raw in self.ws:
                self.handle(raw)
                if self.reason is not None:
                    return
        except ConnectionClosed as exc:
            if self.reason is None:
                self.reason = f"connection closed ({exc})"
            return
        if self.reason is None:
            self.reason = "connection closed by brclient"

    def handle(self, raw: str | bytes) -> None:
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
            msg, _ = json.JSONDecoder().raw_decode(text.lstrip())
        except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested too deeply
            log.error("clientrpc: malformed JSON from brclient (%r); reconnecting", raw[:120])
            self.abort("malformed JSON from brclient", 1007)
            return
        if not isinstance(msg, dict):
            log.error("clientrpc: brclient sent a JSON %s, not an object; reconnecting", type(msg).__name__)
            self.abort("non-object JSON from brclient", 1007)
            return
        if msg.get("jsonrpc") != "2.0":
            log.warning("clientrpc: ignoring a message without jsonrpc 2.0: %.200r", msg)
            return
        has_id = msg.get("id") is not None
        method = msg.get("method")
        has_outcome = "result" in msg or "error" in msg
        if has_id and method is None and has_outcome:
            self.on_response(msg)
        elif not has_id and isinstance(method, str) and not has_outcome:
            self.on_notification(method, msg.get("params"))
        elif not has_id and msg.get("error") is not None:
            log.warning("clientrpc: brclient reported an error without id: %.200r", msg["error"])
        else:
            log.warning("clientrpc: ignoring an unrecognized message: %.200r", msg)

    def on_response(self, msg: dict[str, Any]) -> None:
        rid_raw = msg["id"]
        if isinstance(rid_raw, bool) or not isinstance(rid_raw, int | float):
            log.warning("clientrpc: ignoring a response with a non-numeric id %.60r", rid_raw)
            return
        if isinstance(rid_raw, float) and not rid_raw.is_integer():
            log.warning("clientrpc: ignoring a response with a non-integer id %r", rid_raw)
            return
        rid = int(rid_raw)
        pending = self.pending.pop(rid, None)
        if pending is not None:
            self.slots.release()
            if msg.get("error") is not None:
                pending.error = _rpc_error(pending.method, msg["error"])
            else:
                pending.result = msg.get("result")
            pending.event.set()
            return
        binding = self.streams_by_id.get(rid)
        if binding is not None:
            error: RPCError | None = None
            if msg.get("error") is not None:
                error = _rpc_error(binding.method, msg["error"])
                if error.code == STREAM_EOF_CODE:
                    error = None
            else:
                log.warning(
                    "clientrpc: brclient sent a result for stream %s; treating it as its end", binding.method
                )
            self.end_stream(binding, error)
            return
        log.warning("clientrpc: ignoring a response to unknown request id %d", rid)

    def on_notification(self, method: str, params: Any) -> None:
        binding = self.streams_by_method.get(method)
        if binding is None:
            log.warning("clientrpc: ignoring a notification for unknown stream %.120r", method)
            return
        sub = binding.sub
        if sub.closed:
            return
        if sub._deliver(params):
            binding.events += 1

    # -- keepalive ------------------------------------------------------------------

    async def keepalive(self, interval: float, pong_wait: float) -> None:
        while True:
            await anyio.sleep(interval)
            try:
                waiter = await self.ws.ping(os.urandom(16))
            except ConnectionClosed:
                return
            with anyio.move_on_after(pong_wait) as scope:
                try:
                    await waiter
                except ConnectionClosed:
                    return
            if scope.cancelled_caught:
                log.warning("clientrpc: no pong from brclient within %.1fs; reconnecting", pong_wait)
                self.graceful = False  # a peer that does not read will not answer a close frame either
                self.abort(f"no pong within {pong_wait}s")
                return

    def fail_all(self) -> None:
        self.alive = False
        self.slots.close()
        for pending in self.pending.values():
            pending.error = ClientrpcConnectionLost(
                f"brclient connection lost before the reply to {pending.method} ({self.reason or 'closed'})"
            )
            pending.event.set()
        self.pending.clear()
        for binding in list(self.streams_by_id.values()):
            binding.ended.set()
        self.streams_by_id.clear()
        self.streams_by_method.clear()
