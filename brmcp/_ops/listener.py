"""The bridge's own loopback HTTP listener (BRIDGE.md §Embedding the library
in another daemon, ``listen``; §Listener limits): uvicorn serving the bridge's
ASGI app on one socket, started and stopped at runtime inside a task group the
bridge owns, with a header-read timeout, a keep-alive timeout and a connection
cap (:class:`ListenerLimits`)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import ipaddress
import logging
import socket
from collections.abc import Generator
from dataclasses import dataclass

import anyio
import anyio.abc
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["ListenerLimits", "OwnedListener", "bind_failure_hint", "parse_listen_address"]

log = logging.getLogger("brmcp.bridge")

#: Seconds a stop waits for open requests before cutting them (Go: 3 s).
SHUTDOWN_GRACE = 3.0

#: The logger uvicorn's own records of the current listener go to (set in the
#: task that runs the server; the tasks of its connections inherit it).
_RECORDS_TO: contextvars.ContextVar[str | None] = contextvars.ContextVar("brmcp_listener_log", default=None)


class _UvicornRecords(logging.Filter):
    """On uvicorn's ``uvicorn.error`` logger: a record made inside an
    :class:`OwnedListener`'s server goes to that listener's logger instead
    (its name, e.g. ``brmcp.bridge``, in place of ``uvicorn.error``), with
    uvicorn's INFO lines ("Started server process", "Shutting down",
    "Finished server process") lowered to DEBUG, so a normal start shows
    brmcp's own lines only. Records of other uvicorn servers in the process
    pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        name = _RECORDS_TO.get()
        if name is None:
            return True
        if record.levelno == logging.INFO:
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        record.name = name
        target = logging.getLogger(name)
        if target.isEnabledFor(record.levelno):
            target.handle(record)
        return False


def _route_uvicorn_records() -> None:
    """Install :class:`_UvicornRecords` once per process."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _UvicornRecords) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_UvicornRecords())


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """Bounds on the HTTP connections of the bridge's own listener
    (BRIDGE.md "Listener limits"; SECURITY.md).

    * ``header_timeout``: seconds a connection may take to deliver one
      request's complete headers, counted from the connect or from the first
      byte after a keep-alive pause; then it is closed (slowloris).
    * ``keepalive_timeout``: seconds an idle keep-alive connection is kept
      between requests.
    * ``max_connections``: open connections at once. A new connection over
      the cap evicts the connection that has been idle (no request in
      progress: waiting for headers or between requests) the longest; when
      every connection has a request in progress, the new one is closed at
      once. So idle or trickling connections cannot lock out an agent, and
      the process never runs out of file descriptors to them.

    Raises ValueError for non-positive values.
    """

    header_timeout: float = 10.0
    keepalive_timeout: int = 5
    max_connections: int = 256

    def __post_init__(self) -> None:
        if not self.header_timeout > 0:
            raise ValueError(f"header_timeout must be > 0 seconds, got {self.header_timeout!r}")
        if self.keepalive_timeout < 1:
            raise ValueError(f"keepalive_timeout must be >= 1 second, got {self.keepalive_timeout!r}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections!r}")


def _guarded_protocol(limits: ListenerLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with :class:`ListenerLimits` enforced."""

    class _Guarded(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _idle_since: float = 0.0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._idle_since = self.loop.time()
            self._arm_header_timer()
            if len(self.connections) > limits.max_connections:
                self._make_room()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._busy():
                self._disarm_header_timer()
            elif self._header_timer is None and not self.transport.is_closing():
                self._arm_header_timer()  # a new request after a keep-alive pause

        def on_response_complete(self) -> None:
            self._idle_since = self.loop.time()
            super().on_response_complete()

        def _busy(self) -> bool:
            """A request is in progress (its headers arrived, no response end yet)."""
            cycle = self.cycle
            return cycle is not None and not cycle.response_complete

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(limits.header_timeout, self._header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if not self._busy():
                self._drop("request headers not received in time")

        def _drop(self, why: str) -> None:
            if self.transport.is_closing():
                return
            log.debug("bridge listener: closing a connection: %s", why)
            self.transport.abort()

        def _make_room(self) -> None:
            idle = [
                c
                for c in self.connections
                if isinstance(c, _Guarded)
                and c is not self
                and not c._busy()
                and not c.transport.is_closing()
            ]
            if idle:
                min(idle, key=lambda c: c._idle_since)._drop(
                    f"over {limits.max_connections} connections; the longest idle one makes room"
                )
            else:
                self._drop(f"over {limits.max_connections} connections, all with a request in progress")

    return _Guarded


def parse_listen_address(address: str) -> tuple[str, int]:
    """Split ``"127.0.0.1:8891"``, ``"[::1]:8891"`` or ``"localhost:0"`` into
    (host, port). Only loopback hosts are accepted: the endpoint is meant
    for agents on this machine. Raises ValueError."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        raise ValueError(f"listen address {address!r} is not host:port")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"listen address {address!r}: port out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        return host, port
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"listen address {address!r}: host must be a loopback address") from None
    if not ip.is_loopback:
        raise ValueError(f"listen address {address!r}: host must be a loopback address")
    return host, port


def bind_failure_hint(exc: OSError, command: str = "brmcp-bridge") -> str:
    """What to add to a bind failure's message: how to pick another address.
    The address comes only from ``brmcp-bridge --listen`` (default
    ``127.0.0.1:8891``); ``brmcp-bridge.conf`` has no key for it, like the Go
    bridge, whose listen address is host start-up configuration. ``command``
    is the bridge's command line (with ``--datadir`` when needed)."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f" (another program, perhaps another brmcp-bridge, is using that port: start it as {command} "
            "--listen 127.0.0.1:<free port> to pick another; brmcp-bridge.conf has no key for it)"
        )
    return f" (start it as {command} --listen HOST:PORT to pick another loopback address)"


class _Server(uvicorn.Server):
    """uvicorn without process signal handling: the host owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class OwnedListener:
    """One running uvicorn server on a bound loopback socket. uvicorn's own
    log records of this server go to the logger ``log_name`` (uvicorn's INFO
    lines at DEBUG)."""

    def __init__(
        self,
        app: ASGIApp,
        address: str,
        limits: ListenerLimits | None = None,
        *,
        log_name: str = "brmcp.bridge",
    ) -> None:
        self._app = app
        self._log_name = log_name
        self.limits = limits or ListenerLimits()
        self._host, self._port = parse_listen_address(address)
        self._server: _Server | None = None
        self._done = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self.address: tuple[str, int] | None = None

    def _bind(self) -> socket.socket:
        infos = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    async def start(self, task_group: anyio.abc.TaskGroup) -> tuple[str, int]:
        """Bind and serve; returns the bound (host, port). Raises OSError
        when the address cannot be bound."""
        sock = self._bind()
        self.address = sock.getsockname()[:2]
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            log_config=None,
            access_log=False,
            http=_guarded_protocol(self.limits),
            timeout_keep_alive=self.limits.keepalive_timeout,
            ws="none",
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE),
        )
        server = _Server(config)
        self._server = server
        _route_uvicorn_records()

        async def _serve() -> None:
            _RECORDS_TO.set(self._log_name)
            with anyio.CancelScope() as scope:
                self._scope = scope
                try:
                    await server.serve(sockets=[sock])
                except Exception:
                    log.exception("bridge listener on %s:%d failed", self._host, self._port)
                finally:
                    # Cancelled inside uvicorn's serve loop, uvicorn never
                    # closes its asyncio servers: the event loop would keep
                    # watching this fd number, and a later socket given the
                    # same number (a listener restarted in this process)
                    # would never be polled. Close them before the socket.
                    for listening in getattr(server, "servers", ()):
                        listening.close()
                    sock.close()
                    self._done.set()

        task_group.start_soon(_serve, name="brmcp-bridge-listener")
        # uvicorn exposes only a flag for "started".
        while not server.started and not self._done.is_set():  # noqa: ASYNC110
            await anyio.sleep(0.005)
        if not server.started:
            raise OSError(f"listener on {self._host}:{self._port} failed to start")
        return self.address

    async def stop(self) -> None:
        """Stop accepting, let open requests finish for up to 3 s, then cut
        them. Idempotent."""
        server = self._server
        if server is None:
            return
        server.should_exit = True
        open_connections = len(getattr(server.server_state, "connections", ()))
        if open_connections:
            logging.getLogger(self._log_name).info(
                "stopping the agent endpoint: waiting up to %g s for %d open connection(s) to finish",
                SHUTDOWN_GRACE,
                open_connections,
            )
        with anyio.move_on_after(SHUTDOWN_GRACE + 2.0):
            await self._done.wait()
        if not self._done.is_set() and self._scope is not None:
            self._scope.cancel()
            await self._done.wait()
        self.address = None
