"""One bounded line to a directory, a stranger to the provider: every MCP
session is opened, initialized and called within ``call_timeout`` seconds
on the injected clock, and every failure, the SDK's included, becomes a
:class:`~._regconfig.RegistrationError`; what the directory says is cut and
made printable before it reaches a log line (docs/directory.md, "The
provider side").
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.abc
import mcp.types as types
from mcp import ClientSession
from mcp.client.session import MessageHandlerFnT

from brmcp._ops.clock import Clock
from brmcp.transport.router import Router

from ..model import (
    ShapeError,
    StatusOut,
    announced,
)
from ._regconfig import RegistrationError

__all__ = ["MAX_RESULT_CHARS", "DirectoryLine", "brief", "printable", "result_text"]

#: The most characters of a tool result's text that are read.
MAX_RESULT_CHARS = 64 * 1024

_T = TypeVar("_T")


class DirectoryLine:
    """Sessions and calls to directories: ``client_info`` is the MCP client
    shown to them, ``clock`` times every step, ``call_timeout`` (seconds)
    bounds each. ``announced`` holds the directories whose last answer
    carried the push-status hint (docs/directory.md §Push status)."""

    def __init__(self, client_info: types.Implementation, clock: Clock, call_timeout: float) -> None:
        self._client_info = client_info
        self._clock = clock
        self.call_timeout = call_timeout
        self.announced: set[str] = set()

    async def session(
        self,
        router: Router,
        uid: str,
        work: Callable[[ClientSession], Awaitable[StatusOut]],
        *,
        on_message: MessageHandlerFnT | None = None,
    ) -> StatusOut:
        """Open an initialized session to ``uid`` and run ``work`` in it
        (``on_message`` gets what the directory sends unasked, its
        notifications). Every failure, the SDK's included, becomes
        :class:`RegistrationError` (raised after the session closed, so
        never inside an exception group)."""
        try:
            conn = router.dial(uid)
        except RuntimeError as exc:
            raise RegistrationError(f"cannot dial the directory: {exc}") from None
        outcome: StatusOut | RegistrationError | None = None
        try:
            async with ClientSession(
                conn.read_stream, conn.write_stream, client_info=self._client_info, message_handler=on_message
            ) as s:
                try:
                    await self.within(self.call_timeout, s.initialize())
                except TimeoutError:
                    outcome = RegistrationError(
                        f"the directory did not answer within {self.call_timeout:g} s"
                    )
                except Exception as exc:
                    outcome = RegistrationError(f"cannot open a session with the directory: {brief(exc)}")
                else:
                    try:
                        outcome = await work(s)
                    except RegistrationError as exc:
                        outcome = exc
        except Exception as exc:
            if outcome is None:
                outcome = RegistrationError(f"the session with the directory failed: {brief(exc)}")
        finally:
            conn.close()
        if outcome is None:
            outcome = RegistrationError("the session with the directory ended")
        if isinstance(outcome, RegistrationError):
            raise outcome
        return outcome

    async def call(
        self, session: ClientSession, tool: str, args: dict[str, Any], *, directory: str | None = None
    ) -> StatusOut:
        """Call ``tool`` and decode its status; when ``directory`` is given,
        remember whether the answer carried the push-status hint."""
        try:
            result = await self.within(self.call_timeout, session.call_tool(tool, args))
        except TimeoutError:
            raise RegistrationError(
                f"{tool}: the directory did not answer within {self.call_timeout:g} s"
            ) from None
        except Exception as exc:
            raise RegistrationError(f"{tool}: {brief(exc)}") from None
        text = result_text(result)
        if result.is_error:
            raise RegistrationError(f"{tool}: {printable(text, 512)}")
        if directory is not None:
            if announced(result):
                self.announced.add(directory)
            else:
                self.announced.discard(directory)
        try:
            value = json.loads(text) if text else result.structured_content
            return StatusOut.from_json(value)
        except (ValueError, ShapeError) as exc:
            raise RegistrationError(f"{tool}: the directory's answer is not a status: {brief(exc)}") from None

    async def within(self, seconds: float, step: Awaitable[_T]) -> _T:
        """Await ``step``, cancelled after ``seconds`` on the injected clock
        (TimeoutError). Exceptions of ``step`` propagate as themselves."""
        box: list[_T] = []
        failure: list[BaseException] = []
        timed_out = False

        async def watchdog(scope: anyio.CancelScope) -> None:
            nonlocal timed_out
            await self._clock.sleep(seconds)
            timed_out = True
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watchdog, tg.cancel_scope)
            try:
                box.append(await step)
            except Exception as exc:
                failure.append(exc)
            tg.cancel_scope.cancel()
        if failure:
            raise failure[0]
        if timed_out and not box:
            raise TimeoutError
        return box[0]


def printable(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with line breaks and control
    characters replaced, so a directory's words cannot forge log lines."""
    cut = text if len(text) <= limit else text[: limit - 3] + "..."
    return "".join(c if c.isprintable() else " " for c in cut)


def brief(exc: BaseException) -> str:
    return printable(str(exc) or type(exc).__name__, 300)


def result_text(result: types.CallToolResult) -> str:
    """The text contents joined by newlines (as the Go reference reads a
    result), at most :data:`MAX_RESULT_CHARS`."""
    parts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return "\n".join(parts)[:MAX_RESULT_CHARS]
