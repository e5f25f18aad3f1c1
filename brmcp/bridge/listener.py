"""The bridge's own loopback HTTP listener (go-brmcp.md §4.3 "Owned
listener"): uvicorn serving the bridge's ASGI app on one socket, started and
stopped at runtime inside a task group the bridge owns."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from collections.abc import Generator

import anyio
import anyio.abc
import uvicorn
from starlette.types import ASGIApp

__all__ = ["OwnedListener", "parse_listen_address"]

log = logging.getLogger("brmcp.bridge")

#: Seconds a stop waits for open requests before cutting them (Go: 3 s).
SHUTDOWN_GRACE = 3.0


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


class _Server(uvicorn.Server):
    """uvicorn without process signal handling: the host owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class OwnedListener:
    """One running uvicorn server on a bound loopback socket."""

    def __init__(self, app: ASGIApp, address: str) -> None:
        self._app = app
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
            http="h11",
            ws="none",
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE),
        )
        server = _Server(config)
        self._server = server

        async def _serve() -> None:
            with anyio.CancelScope() as scope:
                self._scope = scope
                try:
                    await server.serve(sockets=[sock])
                except Exception:
                    log.exception("bridge listener on %s:%d failed", self._host, self._port)
                finally:
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
        with anyio.move_on_after(SHUTDOWN_GRACE + 2.0):
            await self._done.wait()
        if not self._done.is_set() and self._scope is not None:
            self._scope.cancel()
            await self._done.wait()
        self.address = None
