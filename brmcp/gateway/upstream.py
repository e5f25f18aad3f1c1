"""The one MCP client session to the upstream server, kept alive.

:class:`Upstream` owns the connection: it starts the stdio process (or opens
the streamable-HTTP session) with the official SDK client, runs
``initialize``, and reports what the server declared. When the connection
ends (the process exits, its stdout closes, or an HTTP upstream stops
answering pings) every request still in flight fails with
:class:`UpstreamUnavailable` and the upstream is started again after a
backoff (0.5 s doubling to 30 s; reset once a connection lived 30 s).

Requests go through :meth:`Upstream.request`, which waits (bounded) for a
live session, so a call arriving during a restart is served once the
upstream is back, or fails with :class:`UpstreamUnavailable`.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel
import httpx2
from mcp.client.session import ClientSession, ElicitationFnT, SamplingFnT
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import (
    CONNECTION_CLOSED,
    Implementation,
    InitializeResult,
    LoggingMessageNotificationParams,
    ServerCapabilities,
    ServerNotification,
)
from pydantic import BaseModel

from .config import PASSTHROUGH_ENV, UpstreamConfig, UpstreamConfigError

__all__ = [
    "Upstream",
    "UpstreamStartError",
    "UpstreamUnavailable",
    "open_transport",
    "start_failure",
]

log = logging.getLogger("brmcp.gateway")

_R = TypeVar("_R", bound=BaseModel)

#: The client info the gateway sends in ``initialize``.
CLIENT_INFO = Implementation(name="brmcp-gateway", version="0.1.0")


class UpstreamUnavailable(Exception):
    """The upstream cannot answer: it is not running (restarting) or it went
    away while the request was in flight. The message says which."""


class UpstreamStartError(Exception):
    """The upstream could not be started or initialized the first time."""


class Upstream:
    """One kept-alive client session to the upstream MCP server.

    ``on_connected(session, result)`` runs after each successful
    ``initialize`` (before requests are let through); ``on_notification``
    gets the server's notifications (list changes, resource updates);
    ``on_log`` its ``notifications/message``; ``on_sampling`` /
    ``on_elicitation``, when given, answer its ``sampling/createMessage`` and
    ``elicitation/create`` requests (and declare those client capabilities). ``errlog`` receives a stdio
    server's stderr (default: ours). Run it with ``await tg.start(upstream.run)``:
    the first start must succeed (else :class:`UpstreamStartError`), later
    ones are retried forever with backoff until cancelled.
    """

    def __init__(
        self,
        config: UpstreamConfig,
        *,
        base_dir: str | Path | None = None,
        errlog: TextIO | None = None,
        on_connected: Callable[[ClientSession, InitializeResult], Awaitable[None]] | None = None,
        on_notification: Callable[[ServerNotification], Awaitable[None]] | None = None,
        on_log: Callable[[LoggingMessageNotificationParams], Awaitable[None]] | None = None,
        on_sampling: SamplingFnT | None = None,
        on_elicitation: ElicitationFnT | None = None,
        start_timeout: float = 60.0,
        ready_timeout: float = 30.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        stable_after: float = 30.0,
        health_interval: float = 15.0,
    ) -> None:
        self.config = config
        self._base_dir = base_dir
        self._errlog = errlog
        self._on_connected = on_connected
        self._on_notification = on_notification
        self._on_log = on_log
        self._on_sampling = on_sampling
        self._on_elicitation = on_elicitation
        self._start_timeout = start_timeout
        self._ready_timeout = ready_timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._stable_after = stable_after
        self._health_interval = health_interval
        self._session: ClientSession | None = None
        self._dead: anyio.Event | None = None
        self._ready = anyio.Event()
        self.initialize_result: InitializeResult | None = None
        #: Connections made so far (1 after the first start; +1 per restart).
        self.generation = 0
        #: Times the connection ended while the gateway was running.
        self.exits = 0
        #: The backoff delays waited before each restart so far (seconds).
        self.delays: list[float] = []

    # -- state ------------------------------------------------------------------

    @property
    def session(self) -> ClientSession | None:
        """The live session, or None while (re)starting."""
        return self._session

    @property
    def capabilities(self) -> ServerCapabilities | None:
        """What the upstream declared in its last ``initialize``."""
        result = self.initialize_result
        return None if result is None else result.capabilities

    def mark_broken(self, generation: int, reason: str) -> None:
        """End the connection of ``generation`` (if still current): it is
        restarted with backoff."""
        if generation == self.generation and self._dead is not None and not self._dead.is_set():
            log.warning("upstream %s: %s; restarting it", self.config.describe(), reason)
            self._dead.set()

    async def ready(self, within: float | None = None) -> tuple[ClientSession, int]:
        """The live session and its generation, waiting up to ``within``
        seconds (default ``ready_timeout``) for a restart to finish. Raises
        :class:`UpstreamUnavailable`."""
        limit = self._ready_timeout if within is None else within
        with anyio.move_on_after(limit):
            while True:
                session = self._session
                if session is not None:
                    return session, self.generation
                await self._ready.wait()
                await anyio.lowlevel.checkpoint()  # the event may be cleared again by a quick death
        raise UpstreamUnavailable(
            "the upstream MCP server is not running (it is being restarted); retry later"
        )

    async def request(
        self,
        request: Any,
        result_type: type[_R],
        *,
        read_timeout: float | None = None,
        progress_callback: Any = None,
    ) -> _R:
        """Send ``request`` on the live session and return its typed result.
        An upstream JSON-RPC error is raised as the SDK's ``MCPError``
        (code, message and data unchanged); a connection that ends meanwhile
        raises :class:`UpstreamUnavailable`."""
        session, generation = await self.ready()
        limit = read_timeout if read_timeout is not None else self.config.call_timeout
        try:
            return await session.send_request(
                request,
                result_type,
                request_read_timeout_seconds=limit,
                progress_callback=progress_callback,
            )
        except MCPError as exc:
            if exc.error.code == CONNECTION_CLOSED:
                self.mark_broken(generation, "the connection closed")
                raise UpstreamUnavailable(
                    "the upstream MCP server went away during the request; it is being restarted"
                ) from None
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            self.mark_broken(generation, "the connection closed")
            raise UpstreamUnavailable(
                "the upstream MCP server went away during the request; it is being restarted"
            ) from None

    # -- lifecycle ------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[Upstream] = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep the upstream connected until cancelled (see the class)."""
        delay = self._backoff_initial
        while True:
            began = time.monotonic()
            first = self.generation == 0
            try:
                await self._connect_once(task_status if first else None)
                reason = "the connection ended"
            except Exception as exc:
                # Only a failure before the first successful initialize is
                # fatal; one while tearing a live connection down is not.
                if self.generation == 0:
                    if isinstance(exc, UpstreamConfigError):
                        raise UpstreamStartError(str(exc)) from exc
                    raise UpstreamStartError(start_failure(self.config, exc)) from exc
                reason = _describe(exc)
            self.exits += 1
            if time.monotonic() - began >= self._stable_after:
                delay = self._backoff_initial
            log.warning(
                "upstream %s stopped (%s); restarting in %.1f s", self.config.describe(), reason, delay
            )
            self.delays.append(delay)
            await anyio.sleep(delay)
            delay = min(delay * 2, self._backoff_max)

    async def _connect_once(self, task_status: anyio.abc.TaskStatus[Upstream] | None) -> None:
        dead = anyio.Event()
        async with self._transport(dead) as (read, write):
            session = ClientSession(
                read,
                write,
                read_timeout_seconds=self.config.call_timeout,
                message_handler=self._message,
                logging_callback=self._log,
                sampling_callback=self._on_sampling,
                elicitation_callback=self._on_elicitation,
                client_info=CLIENT_INFO,
            )
            async with session:
                with anyio.fail_after(self._start_timeout):
                    result = await session.initialize()
                self.initialize_result = result
                self.generation += 1
                self._dead = dead
                if self._on_connected is not None:
                    with anyio.fail_after(self._start_timeout):
                        await self._on_connected(session, result)
                self._session = session
                self._ready.set()
                info = result.server_info
                log.info(
                    "upstream %s connected: %s %s (protocol %s)",
                    self.config.describe(),
                    info.name,
                    info.version,
                    result.protocol_version,
                )
                if task_status is not None:
                    task_status.started(self)
                try:
                    async with anyio.create_task_group() as tg:
                        if self.config.kind == "http" and math.isfinite(self._health_interval):
                            tg.start_soon(self._health, session, self.generation)
                        await dead.wait()
                        tg.cancel_scope.cancel()
                finally:
                    self._session = None
                    self._ready = anyio.Event()

    async def _health(self, session: ClientSession, generation: int) -> None:
        """Ping an HTTP upstream: a server that stopped does not close any
        stream we read, so this is how its death is noticed."""
        while True:
            await anyio.sleep(self._health_interval)
            try:
                with anyio.fail_after(min(self._health_interval, 10.0)):
                    await session.send_ping()
            except Exception as exc:
                self.mark_broken(generation, f"ping failed: {_describe(exc)}")
                return

    @asynccontextmanager
    async def _transport(self, dead: anyio.Event) -> AsyncIterator[tuple[Any, Any]]:
        """The SDK transport's streams, with the read side watched: its end
        sets ``dead``."""
        async with self._raw_transport() as (raw_read, write):
            send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

            async def pump() -> None:
                try:
                    async with send:
                        async for item in raw_read:
                            await send.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass
                finally:
                    dead.set()

            async with anyio.create_task_group() as tg, receive:
                tg.start_soon(pump)
                try:
                    yield receive, write
                finally:
                    tg.cancel_scope.cancel()

    def _raw_transport(self) -> Any:
        return open_transport(self.config, base_dir=self._base_dir, errlog=self._errlog)

    # -- inbound ----------------------------------------------------------------------

    async def _message(self, message: Any) -> None:
        if isinstance(message, Exception):
            log.debug("upstream sent something unreadable: %s", message)
            return
        if self._on_notification is not None:
            try:
                await self._on_notification(message)
            except Exception as exc:
                log.warning("handling an upstream notification failed: %s", _describe(exc))

    async def _log(self, params: LoggingMessageNotificationParams) -> None:
        if self._on_log is not None:
            try:
                await self._on_log(params)
            except Exception as exc:
                log.debug("relaying an upstream log message failed: %s", _describe(exc))


@asynccontextmanager
async def open_transport(
    config: UpstreamConfig, *, base_dir: str | Path | None = None, errlog: TextIO | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """The MCP SDK transport streams ``(read, write)`` to the upstream: a
    stdio process (its environment: the SDK's default plus
    :meth:`UpstreamConfig.process_env`; its stderr to ``errlog``, default
    ours) or a streamable-HTTP session (headers from
    :meth:`UpstreamConfig.headers`, a relative ``headers_file`` resolved
    against ``base_dir``). Raises :class:`~.config.UpstreamConfigError`
    (a ``pass_env`` variable or header variable not set), OSError (the
    command cannot be started) or what the SDK raises."""
    if config.command:
        params = StdioServerParameters(
            command=config.command[0],
            args=list(config.command[1:]),
            env=config.process_env() or None,
            cwd=config.cwd,
        )
        async with stdio_client(params, errlog=_stderr_file(errlog)) as streams:
            yield streams
        return
    assert config.url is not None
    headers = config.headers(base_dir)
    client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=config.call_timeout))
    async with client, streamable_http_client(config.url, http_client=client) as streams:
        yield streams


def _stderr_file(errlog: TextIO | None) -> TextIO:
    """Where the child's stderr goes: ``errlog``, else our stderr; a stream
    without a file descriptor (a test's captured stderr) is replaced by the
    process's original stderr, which a child process can inherit."""
    chosen = errlog if errlog is not None else sys.stderr
    try:
        chosen.fileno()
    except (AttributeError, OSError, ValueError):
        fallback = sys.__stderr__
        if fallback is None:
            raise
        return fallback
    return chosen


def start_failure(config: UpstreamConfig, exc: BaseException) -> str:
    """The one line for an upstream that could not be started: what, why,
    and for a stdio command what to check (its environment is small, and
    the flag that passes more of it)."""
    text = f"cannot start the upstream MCP server ({config.describe()}): {_describe(exc)}"
    if not config.command:
        return text
    cause = _innermost(exc)
    if isinstance(cause, FileNotFoundError):
        return f"{text} (is {config.command[0]!r} installed and on PATH?)"
    passed = ", ".join(PASSTHROUGH_ENV[:6]) + ", the *_PROXY variables"
    return (
        f"{text}; if its own error output above points at TLS, a proxy or a missing setting: it runs with a "
        f"minimal environment (the MCP SDK's HOME, PATH, ..., plus {passed} when set), so pass any other "
        'variable it needs with --upstream-env NAME or NAME=VALUE (or "pass_env" / "env" in the '
        "upstream block of brmcp.json)"
    )


def _innermost(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: BaseException) -> str:
    """One line for an exception, unwrapping single-exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return f"{exc.error.message} (code {exc.error.code})"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
