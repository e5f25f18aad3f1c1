"""An asyncio client for brclient's clientrpc: JSON-RPC 2.0 over a mutually
authenticated TLS websocket (clientrpc.md §1 to §4), on ``websockets``.

The :class:`Client` owns one connection at a time and reconnects on its own;
callers make requests (:meth:`Client.send_pm`, :meth:`Client.tip_user`, the
acks, ...) and hold :class:`Subscription` objects for the event streams. A
subscription outlives connections: after every reconnect its stream is
reopened with the subscription's ``unacked_from`` and replayed events it
already yielded are dropped, so a consumer sees each event once.

Rules implemented here, with their source:

* URL ``wss://host:port/ws`` (the path must be ``/ws``; §1 gotcha 3); the
  server certificate file is the only CA; the client pair is presented; an
  ``Authorization: Basic base64(user:pass)`` header is always sent, as the Go
  client does (``Basic Og==`` when both are empty; §1, §8 g).
* Request ids are a per-connection counter from 1; stream requests use the
  same counter and carry a decimal ``[NNNNNNNN]`` suffix from a separate
  per-connection counter from 0 (§0 gotcha 5); notifications are matched by
  the exact method string; a stream ends with the error response to its
  opening id (10000 ``EOF`` = clean end) (§2 Server streams).
* At most 16 requests in flight per connection, each open stream holding a
  slot until the server ends it or the connection drops; the 17th request
  waits for a slot (§2 Concurrency). A request abandoned by timeout or
  cancellation keeps its slot until brclient answers, because brclient counts
  it until then.
* Keepalive: ``websockets``' own pings are off (its 4-byte pings never match
  brclient's 16-byte pongs; §0 gotcha 1); instead a ping of 16 random bytes is
  sent every ``ping_interval`` seconds (brclient echoes exactly those 16 bytes)
  and the connection is dropped when no pong comes within ``ping_timeout``.
  Server pings (any payload) are answered by ``websockets`` itself. Own pings
  are kept because only they detect a hung brclient or a half-open TCP path.
* No message-size cap (``max_size=None``; BR messages reach ~18 MiB; §0
  gotcha 9), no compression, no proxy.
* Reconnect: dial failures back off 1 s doubling to 30 s; the backoff resets
  after a successful connection; a dropped connection is redialled at once
  (after ``backoff_initial`` if it lasted less than that) (§1 Reconnect).
  In-flight requests fail with :class:`ClientrpcConnectionLost`; requests made
  while disconnected fail at once with :class:`ClientrpcNotConnected`.
* Bad server input never crashes the client: unknown notifications, responses
  to unknown ids, undecodable events and streams ended with an error are
  logged (the stream is reopened after a backoff); malformed JSON makes the
  connection state unknowable, so the client reconnects.
"""

from __future__ import annotations

import base64
import inspect
import json
import logging
import os
import socket
import ssl
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.abc
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidMessage, InvalidStatus
from websockets.protocol import State

from .._redact import RedactingLogger
from .config import BotConfig
from .errors import (
    ClientrpcConfigError,
    ClientrpcConnectError,
    ClientrpcConnectionLost,
    ClientrpcNotConnected,
    ClientrpcProtocolError,
    RPCError,
)
from .protojson import ProtojsonError, frame
from .tls import client_ssl_context
from .types import (
    ACK_RECEIVED_PM,
    ACK_TIP_PROGRESS,
    ACK_TIP_RECEIVED,
    PM,
    PM_STREAM,
    TIP_PROGRESS,
    TIP_STREAM,
    TIP_USER,
    USER_PUBLIC_IDENTITY,
    VERSION,
    Event,
    PublicIdentity,
    ReceivedPM,
    ReceivedTip,
    TipProgressEvent,
    VersionResponse,
    ack_params,
    pm_params,
    stream_params,
    tip_user_params,
)

__all__ = [
    "MAX_IN_FLIGHT",
    "STREAM_EOF_CODE",
    "Client",
    "ConnectedCallback",
    "DisconnectedCallback",
    "Subscription",
]

log = logging.getLogger("brmcp.clientrpc")
#: websockets' handshake log with the Basic-auth header's value redacted (SECURITY.md).
_WS_LOG = RedactingLogger(logging.getLogger("websockets.client"))

#: brclient's per-connection limit of concurrent requests, open streams included (clientrpc.md §2).
MAX_IN_FLIGHT = 16
#: The error code of a clean stream end (message ``EOF``).
STREAM_EOF_CODE = 10000

E = TypeVar("E", bound=Event)
ConnectedCallback = Callable[[], Awaitable[None] | None]
DisconnectedCallback = Callable[[ClientrpcConnectionLost], Awaitable[None] | None]


class Backoff:
    """Reconnect delays: ``initial`` seconds, doubling up to ``maximum``; :meth:`reset`
    after a successful connection (clientrpc.md §1 Reconnect: 1 s doubling to 30 s)."""

    def __init__(self, initial: float = 1.0, maximum: float = 30.0) -> None:
        if initial <= 0:
            raise ValueError("backoff_initial must be > 0 seconds")
        self.initial = initial
        self.maximum = max(maximum, initial)
        self._next = initial

    def next(self) -> float:
        """The delay to wait now; the following one doubles (capped)."""
        delay = self._next
        self._next = min(delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.initial


def _parse_url(url: str) -> tuple[str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ClientrpcConfigError(f"brrpcurl {url!r}: {exc}") from None
    if parts.scheme != "wss":
        raise ClientrpcConfigError(f"brrpcurl {url!r}: the scheme must be wss (wss://host:port/ws)")
    if not parts.hostname:
        raise ClientrpcConfigError(f"brrpcurl {url!r}: no host (wss://host:port/ws)")
    if parts.path != "/ws":
        raise ClientrpcConfigError(
            f"brrpcurl {url!r}: the path must be exactly /ws (brclient serves the websocket only there)"
        )
    return parts.hostname, port or 443


async def _call_hook(hook: Callable[..., Awaitable[None] | None] | None, *args: Any) -> None:
    if hook is None:
        return
    try:
        result = hook(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("clientrpc: callback %r failed", hook)


class Subscription(Generic[E]):
    """One event stream of a :class:`Client`, kept open across reconnects.

    Iterate it (``async for event in sub``) to receive decoded events in the
    order brclient sent them; use it as an async context manager (or call
    :meth:`close`) to stop: the iterator then ends. Events already yielded are
    remembered (the newest ``dedupe_size`` of them, by value, i.e. event type,
    sequence id and content) and dropped when a reopened stream replays them;
    comparing the content too means that an id reused after brclient resets
    its log is not mistaken for a duplicate. Events queue without bound while
    the consumer is busy, so the connection keeps draining (clientrpc.md §1
    Backpressure). The iterator ends when the subscription or the client closes.

    ``unacked_from`` is sent on every (re)open; the consumer may raise it (for
    instance to the last id it acked) to shorten replays. Keeping 0 and relying
    on the dedupe is the robust choice (clientrpc.md §4.3 Resume recipe).
    """

    def __init__(
        self,
        client: Client,
        method: str,
        decode: Callable[[Any], E],
        unacked_from: int,
        dedupe_size: int,
    ) -> None:
        if unacked_from < 0:
            raise ValueError("unacked_from must be >= 0")
        self.method = method
        self.unacked_from = unacked_from
        self.delivered = 0  #: events queued for the consumer
        self.duplicates = 0  #: replayed events dropped as already delivered
        self.malformed = 0  #: notifications that did not decode (logged and dropped)
        self.opens = 0  #: stream requests sent (one per connection, plus reopenings)
        self._client = client
        self._decode = decode
        self._dedupe_size = max(1, dedupe_size)
        self._seen: OrderedDict[E, None] = OrderedDict()
        self._queue: deque[E] = deque()
        self._wakeup = anyio.Event()
        self._open_on: int | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def is_open(self) -> bool:
        """True while the stream request is sent on the current connection and not ended."""
        conn = self._client._conn
        return conn is not None and conn.alive and self._open_on == conn.serial

    @property
    def pending(self) -> int:
        """Events received and not yet taken by the consumer."""
        return len(self._queue)

    def __aiter__(self) -> Subscription[E]:
        return self

    async def __anext__(self) -> E:
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            await self._wakeup.wait()
        return self._queue.popleft()

    async def __aenter__(self) -> Subscription[E]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop receiving. brclient has no cancel message: the stream stays open
        server-side (holding its slot) until the connection drops; its events
        are dropped here."""
        if self._closed:
            return
        self._closed = True
        self._client._unsubscribe(self)
        self._wake()

    async def aclose(self) -> None:
        self.close()

    async def wait_open(self) -> None:
        """Wait until the stream request has been sent on the current connection."""
        while not self.is_open:
            if self._closed:
                raise ClientrpcNotConnected("subscription closed")
            await self._client._wait_change()

    def _wake(self) -> None:
        self._wakeup.set()
        self._wakeup = anyio.Event()

    def _push(self, event: E) -> None:
        if self._closed:
            return
        seen = self._seen
        if event in seen:
            seen.move_to_end(event)
            self.duplicates += 1
            return
        seen[event] = None
        if len(seen) > self._dedupe_size:
            seen.popitem(last=False)
        self._queue.append(event)
        self.delivered += 1
        self._wake()


class _Pending:
    __slots__ = ("error", "event", "method", "result")

    def __init__(self, method: str) -> None:
        self.method = method
        self.event = anyio.Event()
        self.result: Any = None
        self.error: Exception | None = None


class _Stream:
    __slots__ = ("ended", "error", "events", "method", "request_id", "sub")

    def __init__(self, sub: Subscription[Any], request_id: int, method: str) -> None:
        self.sub = sub
        self.request_id = request_id
        self.method = method
        self.ended = anyio.Event()
        self.error: RPCError | None = None
        self.events = 0


class _Slots:
    """The 16 request slots of one connection, handed out in FIFO order."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size
        self.closed = False
        self._waiters: deque[anyio.Event] = deque()

    @property
    def in_use(self) -> int:
        return self.size - self.free

    async def acquire(self) -> None:
        if self.closed:
            raise ClientrpcNotConnected("brclient connection closed")
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        waiter = anyio.Event()
        self._waiters.append(waiter)
        try:
            await waiter.wait()
        except BaseException:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif not self.closed:
                self.release()  # the slot was handed to us as we were cancelled: pass it on
            raise
        if self.closed:
            raise ClientrpcNotConnected("brclient connection closed")

    def release(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()  # hand the slot over directly
        elif self.free < self.size:
            self.free += 1

    def close(self) -> None:
        self.closed = True
        while self._waiters:
            self._waiters.popleft().set()


class _Connection:
    """State of one websocket connection: ids, slots, pending calls, streams."""

    def __init__(self, client: Client, ws: ClientConnection, serial: int) -> None:
        self.client = client
        self.ws = ws
        self.serial = serial
        self.next_id = 1
        self.stream_counter = 0
        self.slots = _Slots(client._max_in_flight)
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
        try:
            event = sub._decode(params)
        except (ProtojsonError, ValueError, TypeError) as exc:
            sub.malformed += 1
            log.error("clientrpc: dropping a malformed %s event: %s", sub.method, exc)
            return
        binding.events += 1
        sub._push(event)

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


class Client:
    """A clientrpc connection to one brclient, reconnecting on its own.

    Use as ``async with Client(...) as client:``; it dials in the background
    and owns every task it starts. Requests made before the first connection
    (or between connections) fail fast with :class:`ClientrpcNotConnected`, so
    ``await client.wait_connected()`` first where that matters; subscriptions
    can be made at any time. Arguments:

    * ``url``: ``wss://host:port/ws`` (``brrpcurl``);
    * ``server_cert``: brclient's ``rpc.cert``; ``client_cert``/``client_key``:
      ``rpc-client.cert``/``rpc-client.key``; ``rpcuser``/``rpcpass``: Basic auth;
    * ``on_connected()``: called (sync or async) after each successful
      connection, once the streams are being reopened; ``on_disconnected(reason)``
      after each established connection ends (``reason``: a
      :class:`ClientrpcConnectionLost` naming the cause). Errors in either are logged;
    * ``ping_interval``/``ping_timeout`` (seconds; ``None`` disables own pings),
      ``backoff_initial``/``backoff_max`` (seconds), ``open_timeout`` for the TLS +
      HTTP handshake, ``request_timeout`` default per-request timeout (``None``:
      wait as long as the connection lives; ``ChatService.PM`` can block while
      brclient is offline), ``dedupe_size`` events remembered per subscription,
      ``max_in_flight`` (brclient's limit is 16).

    Raises :class:`ClientrpcConfigError` (one line, naming the file or URL) for a
    malformed URL or bad certificate/key paths.
    """

    def __init__(
        self,
        url: str,
        *,
        server_cert: str | os.PathLike[str],
        client_cert: str | os.PathLike[str],
        client_key: str | os.PathLike[str],
        rpcuser: str = "",
        rpcpass: str = "",
        on_connected: ConnectedCallback | None = None,
        on_disconnected: DisconnectedCallback | None = None,
        ping_interval: float | None = 30.0,
        ping_timeout: float = 10.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        open_timeout: float = 10.0,
        close_timeout: float = 2.0,
        request_timeout: float | None = None,
        dedupe_size: int = 4096,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.url = url
        self._host, self._port = _parse_url(url)
        self.server_cert = os.fspath(server_cert)
        self.client_cert = os.fspath(client_cert)
        self.client_key = os.fspath(client_key)
        self._ssl = client_ssl_context(server_cert, client_cert, client_key)
        token = base64.b64encode(f"{rpcuser}:{rpcpass}".encode()).decode("ascii")
        self._auth_header = f"Basic {token}"
        self.on_connected = on_connected
        self.on_disconnected = on_disconnected
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        Backoff(backoff_initial, backoff_max)  # validates
        self._backoff_initial = backoff_initial
        self._backoff_max = max(backoff_max, backoff_initial)
        self._open_timeout = open_timeout
        self._close_timeout = close_timeout
        self._request_timeout = request_timeout
        self._dedupe_size = dedupe_size
        self._max_in_flight = max_in_flight
        self._subs: list[Subscription[Any]] = []
        self._conn: _Connection | None = None
        self._serial = 0
        self._last_error: ClientrpcConnectError | None = None
        self._change: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    @classmethod
    def from_config(cls, cfg: BotConfig, **kwargs: Any) -> Client:
        """A client for a bot config (``brrpcurl``, the three cert paths,
        ``rpcuser``/``rpcpass``); ``kwargs`` are the other constructor arguments."""
        if not cfg.brrpcurl:
            raise ClientrpcConfigError("bot config: brrpcurl is required")
        for key, what in _CERT_KEYS:
            if not getattr(cfg, key).strip():
                raise ClientrpcConfigError(f"bot config: {key} is missing or empty; set it to {what}")
        return cls(
            cfg.brrpcurl,
            server_cert=os.path.expanduser(cfg.servercertpath),
            client_cert=os.path.expanduser(cfg.clientcertpath),
            client_key=os.path.expanduser(cfg.clientkeypath),
            rpcuser=cfg.rpcuser,
            rpcpass=cfg.rpcpass,
            **kwargs,
        )

    # -- lifecycle --------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        if self._tg is not None or self._closed:
            raise RuntimeError("a Client can be entered only once")
        self._change = anyio.Event()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._run)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        self._closed = True
        for sub in list(self._subs):
            sub.close()
        tg = self._tg
        assert tg is not None
        tg.cancel_scope.cancel()
        try:
            # The body's own exception is not handed to the task group, so it
            # propagates as itself rather than wrapped in an ExceptionGroup.
            await tg.__aexit__(None, None, None)
        finally:
            self._changed()
        return None

    @property
    def connected(self) -> bool:
        """True while a websocket connection to brclient is up."""
        conn = self._conn
        return conn is not None and conn.alive

    @property
    def connections(self) -> int:
        """How many connections have been established so far (1 after the first)."""
        return self._serial

    @property
    def last_error(self) -> ClientrpcConnectError | None:
        """The most recent failed dial (cleared by a successful one)."""
        return self._last_error

    @property
    def in_flight(self) -> int:
        """Slots in use on the current connection (requests awaiting replies plus open streams)."""
        conn = self._conn
        return conn.slots.in_use if conn is not None else 0

    async def wait_connected(self) -> None:
        """Wait for a live connection (bound it with ``anyio.fail_after``; the reason
        of the last failed dial is :attr:`last_error`). Raises
        :class:`ClientrpcNotConnected` if the client is closed."""
        while not self.connected:
            if self._closed:
                raise ClientrpcNotConnected("brclient client closed")
            await self._wait_change()

    def reconnect(self, reason: str = "reconnect requested") -> None:
        """Drop the current connection; the client reconnects and reopens its streams."""
        conn = self._conn
        if conn is not None:
            conn.abort(reason)

    def _changed(self) -> None:
        if self._change is not None:
            self._change.set()
            self._change = anyio.Event()

    async def _wait_change(self) -> None:
        if self._change is None:
            raise RuntimeError("the Client is not entered ('async with client')")
        await self._change.wait()

    async def _run(self) -> None:
        backoff = Backoff(self._backoff_initial, self._backoff_max)
        while True:
            try:
                ws = await self._dial()
            except ClientrpcConnectError as exc:
                self._last_error = exc
                self._changed()
                delay = backoff.next()
                log.warning("%s; retrying in %.1fs", exc, delay)
                await anyio.sleep(delay)
                continue
            backoff.reset()
            self._last_error = None
            started = anyio.current_time()
            await self._serve(ws)
            if anyio.current_time() - started < self._backoff_initial:
                await anyio.sleep(self._backoff_initial)

    async def _dial(self) -> ClientConnection:
        try:
            return await connect(
                self.url,
                ssl=self._ssl,
                additional_headers={"Authorization": self._auth_header},
                user_agent_header=None,
                compression=None,
                proxy=None,
                max_size=None,
                ping_interval=None,
                ping_timeout=None,
                open_timeout=self._open_timeout,
                close_timeout=self._close_timeout,
                logger=_WS_LOG,
            )
        except Exception as exc:
            raise ClientrpcConnectError(self.url, self._describe(exc)) from exc

    def _describe(self, exc: BaseException) -> str:
        """A one-line reason for a failed dial."""
        cause: BaseException = exc
        while isinstance(cause, InvalidMessage | InvalidHandshake) and cause.__cause__ is not None:
            if isinstance(cause, InvalidStatus):
                break
            cause = cause.__cause__
        if isinstance(cause, InvalidStatus):
            status = cause.response.status_code
            phrase = cause.response.reason_phrase
            if status in (401, 403):
                return f"HTTP {status} {phrase}: Basic auth rejected (check rpcuser/rpcpass)"
            return f"HTTP {status} {phrase}: no clientrpc websocket at this URL"
        if isinstance(cause, ssl.SSLCertVerificationError):
            return (
                f"server certificate not trusted ({cause.verify_message}); "
                f"servercertpath {self.server_cert} must be this brclient's rpc.cert"
            )
        if isinstance(cause, ssl.SSLError) and _not_tls(cause):
            return (
                f"TLS failed ({cause.reason}): the server at this address does not speak TLS "
                "(a plain-HTTP port?); brrpcurl must be brclient's [clientrpc] jsonrpclisten address"
            )
        if isinstance(cause, ssl.SSLError):
            return (
                f"TLS failed ({cause.reason or cause}): brclient refused the client certificate "
                f"{self.client_cert}? it must be signed by brclient's rpc-ca.cert"
            )
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused (is brclient running with [clientrpc] jsonrpclisten on this address?)"
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve host {self._host!r}"
        if isinstance(cause, TimeoutError):
            return f"timed out after {self._open_timeout}s"
        if isinstance(cause, EOFError | ConnectionResetError | BrokenPipeError):
            return (
                "connection closed during the handshake (brclient may have refused the client "
                f"certificate {self.client_cert})"
            )
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        text = str(cause).splitlines()[0] if str(cause) else ""
        return f"{type(cause).__name__}: {text}" if text else type(cause).__name__

    async def _serve(self, ws: ClientConnection) -> None:
        self._serial += 1
        conn = _Connection(self, ws, self._serial)
        log.info("clientrpc: connected to brclient at %s", self.url)
        try:
            async with anyio.create_task_group() as tg:
                conn.tg = tg
                self._conn = conn
                for sub in list(self._subs):
                    tg.start_soon(conn.run_stream, sub)
                if self._ping_interval is not None and self._ping_interval > 0:
                    tg.start_soon(conn.keepalive, self._ping_interval, self._ping_timeout)
                tg.start_soon(_call_hook, self.on_connected)
                self._changed()
                await conn.reader()
                tg.cancel_scope.cancel()
        finally:
            self._conn = None
            conn.fail_all()
            self._changed()
            if conn.graceful:
                with anyio.move_on_after(self._close_timeout, shield=True):
                    try:
                        await ws.close(conn.close_code)
                    except Exception:  # the socket may already be gone
                        log.debug("clientrpc: error while closing the websocket", exc_info=True)
            if ws.transport is not None and not ws.transport.is_closing():
                ws.transport.abort()
        log.warning("clientrpc: disconnected from brclient at %s: %s", self.url, conn.reason or "closed")
        await _call_hook(self.on_disconnected, ClientrpcConnectionLost(conn.reason or "connection closed"))

    # -- subscriptions ------------------------------------------------------------------

    def subscribe(self, method: str, decode: Callable[[Any], E], unacked_from: int = 0) -> Subscription[E]:
        """Open the stream ``method`` (e.g. ``"ChatService.PMStream"``, no suffix)
        now if connected and again after every reconnect; ``decode`` turns
        notification params into events (raising ``ValueError`` to drop one)."""
        if self._closed:
            raise ClientrpcNotConnected("brclient client closed")
        sub = Subscription(self, method, decode, unacked_from, self._dedupe_size)
        self._subs.append(sub)
        conn = self._conn
        if conn is not None and conn.alive and conn.tg is not None:
            conn.tg.start_soon(conn.run_stream, sub)
        return sub

    def _unsubscribe(self, sub: Subscription[Any]) -> None:
        if sub in self._subs:
            self._subs.remove(sub)

    def pm_stream(self, unacked_from: int = 0) -> Subscription[ReceivedPM]:
        """``ChatService.PMStream``: PMs received by this brclient, from every
        stored event with id > ``unacked_from`` (0: all not yet acked)."""
        return self.subscribe(PM_STREAM, ReceivedPM.from_wire, unacked_from)

    def tip_stream(self, unacked_from: int = 0) -> Subscription[ReceivedTip]:
        """``PaymentsService.TipStream``: tips received (amounts in milliatoms)."""
        return self.subscribe(TIP_STREAM, ReceivedTip.from_wire, unacked_from)

    def tip_progress(self, unacked_from: int = 0) -> Subscription[TipProgressEvent]:
        """``PaymentsService.TipProgress``: progress of tips this brclient sends."""
        return self.subscribe(TIP_PROGRESS, TipProgressEvent.from_wire, unacked_from)

    # -- requests -----------------------------------------------------------------------

    async def call(self, method: str, params: Mapping[str, Any]) -> Any:
        """Send one request and return its decoded ``result``.

        ``params`` must hold only fields of the method's request message (brclient
        rejects unknown keys with -32602). Raises :class:`ClientrpcNotConnected`
        (disconnected: nothing sent), :class:`ClientrpcConnectionLost` (dropped
        before the reply), :class:`RPCError` (brclient's error), ``TimeoutError``
        after the client's ``request_timeout`` seconds. A 17th concurrent request
        waits for a free slot.
        """
        if self._closed:
            raise ClientrpcNotConnected("brclient client closed")
        conn = self._conn
        if conn is None or not conn.alive:
            raise ClientrpcNotConnected()
        return await conn.call(method, params, self._request_timeout)

    async def version(self) -> VersionResponse:
        """``VersionService.Version``."""
        result = await self.call(VERSION, {})
        return _decode_result(VERSION, VersionResponse.from_wire, result)

    async def user_public_identity(self) -> PublicIdentity:
        """``ChatService.UserPublicIdentity``: this brclient's own name, nick and uid."""
        result = await self.call(USER_PUBLIC_IDENTITY, {})
        return _decode_result(USER_PUBLIC_IDENTITY, PublicIdentity.from_wire, result)

    async def send_pm(self, uid_hex: str, text: str) -> None:
        """``ChatService.PM`` to ``uid_hex`` (64 lowercase hex; brclient also
        accepts a nick or a >4-character uid prefix). Returns once brclient has
        queued the PM for the relay. :class:`RPCError` texts include
        ``user <x> not found`` and ``msg is empty``."""
        await self.call(PM, pm_params(uid_hex, text))

    async def tip_user(self, uid_hex: str, dcr_amount: float, max_attempts: int) -> None:
        """``PaymentsService.TipUser``: tip ``dcr_amount`` **DCR** (a float; use
        :func:`~brmcp.clientrpc.atoms_to_dcr` for atoms) to ``uid_hex``, trying the
        invoice request up to ``max_attempts`` (>= 1) times. Returns when the tip
        is scheduled, not paid: watch :meth:`tip_progress`. Errors include
        ``maxAttempts N <= 0`` and ``user <x> not found``."""
        await self.call(TIP_USER, tip_user_params(uid_hex, dcr_amount, max_attempts))

    async def ack_received_pm(self, sequence_id: int) -> None:
        """``ChatService.AckReceivedPM``: delete PMs up to and including
        ``sequence_id`` from brclient's log, for every client (global, destructive)."""
        await self.call(ACK_RECEIVED_PM, ack_params(sequence_id))

    async def ack_tip_received(self, sequence_id: int) -> None:
        """``PaymentsService.AckTipReceived`` (the received-tips log; not
        AckTipProgress, which older bisonbotkit called by mistake)."""
        await self.call(ACK_TIP_RECEIVED, ack_params(sequence_id))

    async def ack_tip_progress(self, sequence_id: int) -> None:
        """``PaymentsService.AckTipProgress``: clear the tip-progress log up to ``sequence_id``."""
        await self.call(ACK_TIP_PROGRESS, ack_params(sequence_id))


R = TypeVar("R")


def _decode_result(method: str, decode: Callable[[Any], R], result: Any) -> R:
    try:
        return decode(result)
    except (ProtojsonError, ValueError, TypeError) as exc:
        raise ClientrpcProtocolError(f"{method}: malformed result from brclient: {exc}") from None


#: The certificate keys of a bot config and what each must name.
_CERT_KEYS = (
    ("servercertpath", "the path of brclient's rpc.cert (e.g. ~/.brclient/rpc.cert)"),
    ("clientcertpath", "the path of brclient's rpc-client.cert (e.g. ~/.brclient/rpc-client.cert)"),
    ("clientkeypath", "the path of brclient's rpc-client.key (e.g. ~/.brclient/rpc-client.key)"),
)
#: OpenSSL reasons for a peer that answered the ClientHello with something
#: that is not TLS (typically a plain-HTTP server).
_NOT_TLS_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL", "RECORD_LAYER_FAILURE"}
)


def _not_tls(exc: ssl.SSLError) -> bool:
    return (exc.reason or "").upper() in _NOT_TLS_REASONS
