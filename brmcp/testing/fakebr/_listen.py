"""The fake's TLS listeners (clientrpc and the status server): an aiohttp app
served on a socket bound here, so port 0 can be resolved to the bound port
before the fake reports its URL."""

from __future__ import annotations

import socket
import ssl

from aiohttp import web

__all__ = ["serve_tls"]


async def serve_tls(
    app: web.Application, host: str, port: int, ctx: ssl.SSLContext
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` over TLS on ``host:port`` (0 picks a port); returns the
    runner (clean it up to stop) and the bound port."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        await runner.cleanup()
        raise
    bound = sock.getsockname()[1]
    site = web.SockSite(runner, sock, ssl_context=ctx)
    await site.start()
    return runner, bound
