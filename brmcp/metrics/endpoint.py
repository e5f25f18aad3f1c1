"""Serving a metrics registry at ``/metrics`` on a loopback address."""

from __future__ import annotations

from typing import Any

import anyio.abc
from prometheus_client import CollectorRegistry, make_asgi_app
from starlette.types import Receive, Scope, Send

from ..bridge.listener import OwnedListener, parse_listen_address

__all__ = ["MetricsEndpoint"]


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
    ``localhost``; port 0 picks one). Other paths answer 404. Raises
    ValueError for a bad or non-loopback address."""

    def __init__(self, registry: CollectorRegistry, address: str) -> None:
        parse_listen_address(address)
        self._listener = OwnedListener(_MetricsApp(make_asgi_app(registry=registry)), address)
        self.address: tuple[str, int] | None = None

    async def start(self, task_group: anyio.abc.TaskGroup) -> tuple[str, int]:
        """Bind and serve in ``task_group``; returns the bound (host, port).
        Raises OSError when the address cannot be bound."""
        self.address = await self._listener.start(task_group)
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
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"
