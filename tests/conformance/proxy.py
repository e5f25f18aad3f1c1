"""A loopback HTTP forwarder that adds ``Authorization: Bearer <token>``.

The conformance suite has no option for an auth header, and the bridge's gate
must not be weakened for it. This proxy listens on 127.0.0.1 (port 0),
forwards every request to the bridge's own listener with the bearer header
set, and passes everything else through unchanged: method, path, query,
``Host`` and ``Origin`` (so the DNS-rebinding scenario meets the real gate),
the request body, the status, the response headers and the body, streamed
chunk by chunk (SSE events reach the client as the bridge writes them).
Hop-by-hop headers (RFC 9110 §7.6.1) are not forwarded.
"""

from __future__ import annotations

from types import TracebackType

import anyio
import anyio.abc
import httpx2
from starlette.types import Message, Receive, Scope, Send

from brmcp._ops.listener import OwnedListener

__all__ = ["BearerProxy"]

_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)


class BearerProxy:
    """``async with BearerProxy(upstream, token) as proxy:`` serves
    :attr:`base_url` until exit. ``upstream`` is the bridge's base URL
    (``http://127.0.0.1:PORT``); ``token`` the agents' bearer token.
    :attr:`requests` counts forwarded requests."""

    def __init__(self, upstream: str, token: str) -> None:
        self._upstream = upstream.rstrip("/")
        self._auth = f"Bearer {token}".encode()
        self._listener = OwnedListener(self, "127.0.0.1:0")
        self._client = httpx2.AsyncClient(timeout=httpx2.Timeout(10.0, read=None), follow_redirects=False)
        self._tg: anyio.abc.TaskGroup | None = None
        self._streams: set[anyio.CancelScope] = set()
        self.requests = 0

    @property
    def base_url(self) -> str:
        address = self._listener.address
        if address is None:
            raise RuntimeError("the proxy is not running")
        return f"http://{address[0]}:{address[1]}"

    async def __aenter__(self) -> BearerProxy:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            await self._listener.start(tg)
        except BaseException:
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
            self._tg = None
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        for scope in list(self._streams):
            scope.cancel()  # long-lived SSE streams would hold up the listener's stop
        tg, self._tg = self._tg, None
        try:
            await self._listener.stop()
            await self._client.aclose()
        finally:
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point the listener serves."""
        if scope["type"] != "http":
            return
        self.requests += 1
        with anyio.CancelScope() as cancel:
            self._streams.add(cancel)
            try:
                await self._forward(scope, receive, send)
            finally:
                self._streams.discard(cancel)

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _body(receive)
        if body is None:
            return  # the client left before sending its body
        headers = [
            (key, value)
            for key, value in scope["headers"]
            if key.lower() not in _HOP_BY_HOP and key.lower() not in (b"authorization", b"content-length")
        ]
        headers.append((b"authorization", self._auth))
        url = self._upstream + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        request = self._client.build_request(scope["method"], url, headers=headers, content=body or None)
        try:
            response = await self._client.send(request, stream=True)
        except httpx2.HTTPError as exc:
            await _plain(send, 502, f"proxy: upstream failed: {exc}")
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (key, value)
                        for key, value in response.headers.raw
                        if key.lower() not in _HOP_BY_HOP
                        and key.lower() != b"date"  # the listener adds its own
                    ],
                }
            )
            async with anyio.create_task_group() as tg:

                async def pump() -> None:
                    try:
                        async for chunk in response.aiter_raw():
                            await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    except httpx2.HTTPError:
                        pass  # the bridge cut the stream: end ours too
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    tg.cancel_scope.cancel()

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()  # the client left: stop reading upstream

                tg.start_soon(pump)
                tg.start_soon(watch)
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()


async def _body(receive: Receive) -> bytes | None:
    """The whole request body (MCP requests are small JSON), or None when
    the client disconnected first."""
    chunks: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode() + b"\n"
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
