"""Serving a metrics registry at ``/metrics`` on a loopback address, and the
one-line message every brmcp command gives when it cannot listen on an
address (:func:`cannot_listen`)."""

from __future__ import annotations

import errno
import socket
from typing import Any

import anyio.abc
from prometheus_client import CollectorRegistry, make_asgi_app
from starlette.types import Receive, Scope, Send

from brmcp._ops.listener import OwnedListener, parse_listen_address

__all__ = [
    "MetricsEndpoint",
    "MetricsListenError",
    "cannot_listen",
    "check_listen_address",
    "metrics_address_problem",
    "probe_listen",
]

#: Why a bind failed, and what usually causes it, by errno.
_REASONS: dict[int, tuple[str, str]] = {
    errno.EADDRINUSE: ("address already in use", "another process holds it"),
    errno.EADDRNOTAVAIL: ("address not available", "no interface of this machine has it"),
    errno.EACCES: ("permission denied", "ports below 1024 need privileges"),
}


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def cannot_listen(host: str, port: int, exc: OSError, *, option: str) -> str:
    """The one line for a failed bind of ``host:port``, naming the option
    that picks another address, e.g. ``cannot listen on 127.0.0.1:9465:
    address already in use (another process holds it; choose another with
    --metrics)``; with ``port`` 0 (any port) only the host is named. The
    command's name is for the caller to put in front."""
    reason, cause = _REASONS.get(exc.errno or 0, ("", ""))
    if not reason:
        text = exc.strerror or str(exc) or type(exc).__name__
        reason = text[:1].lower() + text[1:]
    hint = f"{cause}; choose another with {option}" if cause else f"choose another with {option}"
    where = _host_port(host, port) if port else host
    return f"cannot listen on {where}: {reason} ({hint})"


class MetricsListenError(OSError):
    """The metrics endpoint cannot listen on its address. ``str()`` is the
    one line of :func:`cannot_listen` (address, reason, the option to
    change); ``errno`` is the bind's, ``address`` the (host, port) asked
    for. A daemon that gets it at start-up prints ``<command>: <message>``
    and exits 1 instead of running without metrics."""

    def __init__(self, host: str, port: int, cause: OSError, *, option: str = "--metrics") -> None:
        super().__init__(cannot_listen(host, port, cause, option=option))
        self.errno = cause.errno
        self.address = (host, port)


def probe_listen(host: str, port: int) -> None:
    """Bind ``host:port`` (``SO_REUSEADDR``, as the listeners do) and close
    it again. Port 0 binds nothing. Raises OSError when the address cannot
    be bound now; an address that passes can still be taken by another
    process before the real bind."""
    if port == 0:
        return
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, sockaddr = infos[0]  # the address the listeners bind
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)


def check_listen_address(address: str, *, option: str = "--metrics") -> None:
    """Check a ``--metrics`` address before a daemon creates anything: raises
    ValueError for a bad or non-loopback ``host:port`` (as
    :class:`MetricsEndpoint` does) and :class:`MetricsListenError` when it
    cannot be bound now (:func:`probe_listen`; port 0 always passes)."""
    host, port = parse_listen_address(address)
    try:
        probe_listen(host, port)
    except OSError as exc:
        raise MetricsListenError(host, port, exc, option=option) from None


def metrics_address_problem(address: str, *, option: str = "--metrics") -> str | None:
    """The one line a daemon prints (after its name) before exiting 1 when
    ``address`` cannot serve metrics (:func:`check_listen_address`), else None."""
    try:
        check_listen_address(address, option=option)
    except MetricsListenError as exc:
        return str(exc)
    except ValueError as exc:
        return f"{option}: {exc}"
    return None


class _MetricsApp:
    """ASGI: ``/metrics`` from prometheus-client, 404 elsewhere."""

    def __init__(self, metrics: Any) -> None:
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") != "/metrics":
            body = b"not found; metrics are at /metrics\n"
            await send(
                {
                    "type": "http.response.start",
                    "status": 404,
                    "headers": [
                        (b"content-type", b"text/plain"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self._metrics(scope, receive, send)


class MetricsEndpoint:
    """``GET /metrics`` (the Prometheus text format) of ``registry`` on
    ``address`` (``host:port``, loopback only: ``127.0.0.1``, ``[::1]`` or
    ``localhost``; port 0 picks one). Other paths answer 404. ``option`` is
    the command-line option that sets the address, named in bind errors.
    uvicorn's own log records go to the ``brmcp.metrics`` logger. Raises
    ValueError for a bad or non-loopback address.

    A daemon calls :func:`check_listen_address` (or :meth:`check`) before
    it creates anything, so a taken port stops it at once with
    :class:`MetricsListenError`; :meth:`start` raises it too."""

    def __init__(self, registry: CollectorRegistry, address: str, *, option: str = "--metrics") -> None:
        self._host, self._port = parse_listen_address(address)
        self._option = option
        self._listener = OwnedListener(
            _MetricsApp(make_asgi_app(registry=registry)), address, log_name="brmcp.metrics"
        )
        self.address: tuple[str, int] | None = None

    def check(self) -> None:
        """Raise :class:`MetricsListenError` when the address cannot be bound
        now (a bind and close; see :func:`probe_listen`). Port 0 always passes."""
        check_listen_address(_host_port(self._host, self._port), option=self._option)

    async def start(self, task_group: anyio.abc.TaskGroup) -> tuple[str, int]:
        """Bind and serve in ``task_group``; returns the bound (host, port).
        Raises :class:`MetricsListenError` (an OSError) when the address
        cannot be bound."""
        try:
            self.address = await self._listener.start(task_group)
        except OSError as exc:
            raise MetricsListenError(self._host, self._port, exc, option=self._option) from None
        return self.address

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        await self._listener.stop()

    @property
    def url(self) -> str:
        """``http://host:port/metrics`` once started."""
        if self.address is None:
            return ""
        host, port = self.address
        return f"http://{_host_port(host, port)}/metrics"
