"""An asyncio client for brclient's clientrpc: JSON-RPC 2.0 over a mutually
authenticated TLS websocket (docs/clientrpc.md), on ``websockets``.

The :class:`Client` owns one connection at a time and reconnects on its own;
callers make requests (:meth:`Client.send_pm`, :meth:`Client.tip_user`, the
acks, ...) and hold :class:`Subscription` objects for the event streams. A
subscription outlives connections: after every reconnect its stream is
reopened with the subscription's ``unacked_from`` and replayed events it
already yielded are dropped, so a consumer sees each event once.

This module is the connection shell: the lifecycle, the reconnect loop and
the two primitives :meth:`Client.call` and :meth:`Client.subscribe`. The
concepts around it live beside it: dialling, TLS, Basic auth and dial-failure
reasons (``_dial``), one connection's JSON-RPC multiplexing, slots and
keepalive (``_connection``, ``_slots``), streams with replay de-duplication
(``subscription``), the typed brclient calls (``_methods``), reconnect delays
(``backoff``).

Reconnect (docs/clientrpc.md §Reconnecting): dial failures back off 1 s doubling to
30 s; the backoff resets after a successful connection; a dropped connection
is redialled at once (after ``backoff_initial`` if it lasted less than that).
In-flight requests fail with :class:`ClientrpcConnectionLost`; requests made
while disconnected fail at once with :class:`ClientrpcNotConnected`.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import anyio
import anyio.abc
from websockets.asyncio.client import ClientConnection

from ._connection import MAX_IN_FLIGHT, STREAM_EOF_CODE
from ._connection import Connection as Connection  # imported from here by tests
from ._dial import basic_auth, check_bot_config, dial_brclient, parse_url
from ._methods import BrclientMethods
from .backoff import Backoff
from .config import BotConfig
from .errors import (
    ClientrpcConnectError,
    ClientrpcConnectionLost,
    ClientrpcNotConnected,
    StatusServerUnavailable,
)
from .statusserver import NO_STATUS_URL, StatusClient
from .subscription import Subscription
from .tls import client_ssl_context
from .types import Event

__all__ = [
    "MAX_IN_FLIGHT",
    "STREAM_EOF_CODE",
    "Backoff",
    "Client",
    "ConnectedCallback",
    "DisconnectedCallback",
    "Subscription",
]

log = logging.getLogger("brmcp.clientrpc")

E = TypeVar("E", bound=Event)
ConnectedCallback = Callable[[], Awaitable[None] | None]
DisconnectedCallback = Callable[[ClientrpcConnectionLost], Awaitable[None] | None]


async def _call_hook(hook: Callable[..., Awaitable[None] | None] | None, *args: Any) -> None:
    if hook is None:
        return
    try:
        result = hook(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("clientrpc: callback %r failed", hook)


class Client(BrclientMethods):
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
      ``max_in_flight`` (brclient's limit is 16);
    * ``status_url``: brclientd's status server (``brstatusurl``, ``""``: none),
      for :meth:`suggest_kx`, over the same TLS context.

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
        status_url: str = "",
    ) -> None:
        self.url = url
        self._host, self._port = parse_url(url)
        self.server_cert = os.fspath(server_cert)
        self.client_cert = os.fspath(client_cert)
        self.client_key = os.fspath(client_key)
        self._ssl = client_ssl_context(server_cert, client_cert, client_key)
        self._auth_header = basic_auth(rpcuser, rpcpass)
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
        self._conn: Connection | None = None
        self._serial = 0
        self._last_error: ClientrpcConnectError | None = None
        self._change: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False
        self._status = StatusClient(status_url, ssl_context=self._ssl) if status_url else None

    @classmethod
    def from_config(cls, cfg: BotConfig, **kwargs: Any) -> Client:
        """A client for a bot config (``brrpcurl``, the three cert paths,
        ``rpcuser``/``rpcpass``, ``brstatusurl`` when set); ``kwargs`` are the
        other constructor arguments."""
        check_bot_config(cfg)
        if cfg.brstatusurl:
            kwargs.setdefault("status_url", cfg.brstatusurl)
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

    def _live_serial(self) -> int | None:
        conn = self._conn
        return conn.serial if conn is not None and conn.alive else None

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
        return await dial_brclient(
            self.url,
            ssl_context=self._ssl,
            auth_header=self._auth_header,
            open_timeout=self._open_timeout,
            close_timeout=self._close_timeout,
            host=self._host,
            server_cert=self.server_cert,
            client_cert=self.client_cert,
        )

    async def _serve(self, ws: ClientConnection) -> None:
        self._serial += 1
        conn = Connection(self, ws, self._serial)
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
        notification params into events (raising ``ValueError``, or any other
        exception, drops that one event with a one-line error). Events are
        de-duplicated by value; unhashable ones (dicts, lists, mutable
        dataclasses) by content (see :class:`Subscription`)."""
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

    # -- brclientd's status server --------------------------------------------------------

    @property
    def status_url(self) -> str:
        """brclientd's status server this client suggests KXs through (``""``: none)."""
        return self._status.url if self._status is not None else ""

    async def suggest_kx(self, invitee: str, target: str) -> None:
        """Send ``invitee`` a suggestion to key-exchange with ``target``
        through brclientd's status server (:meth:`StatusClient.suggest_kx
        <brmcp.clientrpc.statusserver.StatusClient.suggest_kx>`: uids of 64 hex
        characters, HTTP 204/200 is success). Raises
        :class:`StatusServerUnavailable` when the client has no
        ``status_url`` (a stock brclient), ``ValueError`` for a malformed uid,
        :class:`StatusServerError` for a refusal or an unreachable server.
        Independent of the websocket: it works while clientrpc is down."""
        if self._status is None:
            raise StatusServerUnavailable(NO_STATUS_URL)
        await self._status.suggest_kx(invitee, target)
