"""The bridge listener's bounds (BRIDGE.md "Listener limits", SECURITY.md):
a header-read timeout, an idle keep-alive timeout and a connection cap that
evicts the longest-idle connection, so idle or trickling connections can
neither exhaust the process's descriptors nor lock out a real agent."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from starlette.types import Receive, Scope, Send

from brmcp._ops.listener import ListenerLimits, OwnedListener
from brmcp.bridge import Settings
from brmcp.bridge.daemon import resolve_listen
from brmcp.clientrpc import write_bot_config
from tests.kit import until
from tests.kit.serve import serve_network

TOKEN = "listener-token-0123456789abcdef"


class _App:
    """``/slow`` sets :attr:`entered` and waits for :attr:`release`; anything
    else answers 200 at once."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/slow":
            self.entered.set()
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def _listener(limits: ListenerLimits, app: _App | None = None) -> AsyncIterator[tuple[str, int]]:
    async with anyio.create_task_group() as tg:
        listener = OwnedListener(app or _App(), "127.0.0.1:0", limits)
        bound = await listener.start(tg)
        try:
            yield bound
        finally:
            await listener.stop()


async def _closed_by_server(stream: anyio.abc.SocketStream) -> bool:
    """Read until the server closes the connection (True) or 10 s pass (False)."""
    with anyio.move_on_after(10):
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError, OSError):
            pass
        return True
    return False


REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def test_trickling_headers_are_cut_after_the_header_timeout() -> None:
    with anyio.fail_after(30):
        async with _listener(ListenerLimits(header_timeout=0.3, keepalive_timeout=60)) as (host, port):
            # Nothing at all after connecting.
            silent = await anyio.connect_tcp(host, port)
            # Headers trickling in, never finished.
            slow = await anyio.connect_tcp(host, port)
            await slow.send(b"GET / HTTP/1.1\r\n")
            await anyio.sleep(0.1)
            await slow.send(b"Host: 127.0.0.1\r\n")
            assert await _closed_by_server(silent)
            assert await _closed_by_server(slow)
            # A request that completes in time is served.
            async with httpx2.AsyncClient() as http:
                assert (await http.get(f"http://{host}:{port}/")).text == "ok"


async def test_idle_keep_alive_connections_are_closed_and_headers_after_a_pause_are_timed() -> None:
    with anyio.fail_after(30):
        async with _listener(ListenerLimits(header_timeout=0.5, keepalive_timeout=1)) as (host, port):
            idle = await anyio.connect_tcp(host, port)
            await idle.send(REQUEST)
            assert b"200 OK" in await idle.receive()
            assert await _closed_by_server(idle)  # keep-alive timeout
            # After one served request, a second request that stalls mid-headers is cut too.
            paused = await anyio.connect_tcp(host, port)
            await paused.send(REQUEST)
            assert b"200 OK" in await paused.receive()
            await paused.send(b"GET / HTTP/1.1\r\n")
            assert await _closed_by_server(paused)


async def test_connection_cap_evicts_idle_ones_and_keeps_requests_in_progress() -> None:
    app = _App()
    limits = ListenerLimits(header_timeout=60, keepalive_timeout=60, max_connections=4)
    with anyio.fail_after(30):
        async with _listener(limits, app) as (host, port):
            busy = await anyio.connect_tcp(host, port)
            await busy.send(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            await app.entered.wait()  # its request is in progress
            idle = [await anyio.connect_tcp(host, port) for _ in range(12)]
            for stream in idle[::2]:
                await stream.send(b"GET / HTTP/1.1\r\n")  # half of them trickle headers
            async with httpx2.AsyncClient() as http:
                for _ in range(3):
                    assert (await http.get(f"http://{host}:{port}/")).text == "ok"
            closed = 0
            for stream in idle:
                with anyio.move_on_after(0.2):
                    try:
                        await stream.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        closed += 1
            # At most 4 connections are open at once: the busy one, the client's,
            # and at most two of the idle ones.
            assert closed >= len(idle) - 2
            app.release.set()
            assert b"200 OK" in await busy.receive()  # never evicted mid-request


def test_limits_are_validated() -> None:
    for bad in ({"header_timeout": 0}, {"keepalive_timeout": 0}, {"max_connections": 0}):
        with pytest.raises(ValueError, match="must be"):
            ListenerLimits(**bad)  # type: ignore[arg-type]


_LIMITED_BRIDGE = (
    "import resource, runpy, sys\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))\n"
    "sys.argv = ['brmcp-bridge', *sys.argv[1:]]\n"
    "runpy.run_module('brmcp.bridge', run_name='__main__', alter_sys=True)\n"
)


async def test_1100_idle_and_trickling_connections_do_not_starve_an_agent(tmp_path: Path) -> None:
    """The bridge runs with a 1,024-descriptor limit; 1,100 connections that
    never finish their headers (half trickle a few bytes, half send nothing)
    are held open by the attacker; an agent's MCP session still works, and
    the bridge holds at most the cap plus a few descriptors."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with anyio.fail_after(240):
        async with serve_network(tmp_path) as net:
            datadir = tmp_path / "bridge"
            datadir.mkdir()
            write_bot_config(datadir / "brmcp-bridge.conf", net.alice.bot_config(datadir, "brmcp-bridge"))
            settings = Settings(enabled=True, token=TOKEN, mode="autopay", allowed_bots=(net.bot.uid,))
            (datadir / "mcpclient.json").write_text(settings.to_json())
            listen = resolve_listen("127.0.0.1:0")
            host, port = listen.rsplit(":", 1)
            cmd = [sys.executable, "-c", _LIMITED_BRIDGE, "--datadir", str(datadir), "--listen", listen]
            async with await anyio.open_process(cmd, env=env, stderr=subprocess.PIPE) as proc:
                log = bytearray()

                async def pump() -> None:
                    assert proc.stderr is not None
                    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                        async for chunk in proc.stderr:
                            log.extend(chunk)

                attackers: list[anyio.abc.SocketStream] = []
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(pump)
                        await until(lambda: b"endpoint open at" in log or proc.returncode is not None, 180)
                        assert proc.returncode is None, log.decode(errors="replace")
                        for i in range(1100):
                            stream = await anyio.connect_tcp(host, int(port))
                            if i % 2:
                                await stream.send(
                                    b"POST /mcp/" + net.bot.uid.encode() + b" HTTP/1.1\r\nHost: "
                                )
                            attackers.append(stream)
                        for stream in attackers[1::4]:
                            with contextlib.suppress(OSError, anyio.BrokenResourceError):
                                await stream.send(b"1")  # still trickling
                        url = f"http://{listen}/mcp/{net.bot.uid}"
                        async with (
                            httpx2.AsyncClient(
                                headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
                            ) as http,
                            streamable_http_client(url, http_client=http) as (read, write),
                            ClientSession(read, write) as session,
                        ):
                            await session.initialize()
                            result = await session.call_tool("echo", {"text": "still served"})
                            assert result.structured_content == {"echo": "still served"}
                        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
                        assert fds < ListenerLimits().max_connections + 64, fds
                        assert b"Too many open files" not in log
                        tg.cancel_scope.cancel()
                finally:
                    for stream in attackers:
                        with contextlib.suppress(Exception):
                            await stream.aclose()
                    proc.terminate()
                    with anyio.move_on_after(10):
                        await proc.wait()
                    if proc.returncode is None:
                        proc.kill()


async def test_a_listener_cancelled_mid_serve_does_not_break_the_next_one() -> None:
    """A daemon stopped by cancellation (its task group cancelled while
    uvicorn serves) must leave the event loop clean: a listener started
    afterwards in the same process, whose socket may get the same fd
    number, answers requests (before the fix they all hung)."""
    with anyio.fail_after(30):
        for _round in range(3):
            async with anyio.create_task_group() as tg:
                listener = OwnedListener(_App(), "127.0.0.1:0", ListenerLimits())
                host, port = await listener.start(tg)
                async with httpx2.AsyncClient(timeout=5) as http:
                    assert (await http.get(f"http://{host}:{port}/")).status_code == 200
                tg.cancel_scope.cancel()  # as BridgeDaemon.run is stopped: no listener.stop()
