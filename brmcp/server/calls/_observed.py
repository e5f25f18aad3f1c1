"""A session's inbound stream with an observer: each item is handed to a
callback before the MCP SDK sees it (the first-contact tap notes a marked
``initialize``; the session watch notes peer cancels)."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import anyio
from mcp.shared._stream_protocols import ReadStream
from mcp.shared.message import SessionMessage

__all__ = ["ObservedRead"]


class ObservedRead:
    """``stream``, calling ``observe(item)`` on every item received, first."""

    __slots__ = ("_observe", "_stream")

    def __init__(
        self,
        stream: ReadStream[SessionMessage | Exception],
        observe: Callable[[SessionMessage | Exception], None],
    ) -> None:
        self._stream = stream
        self._observe = observe

    async def receive(self) -> SessionMessage | Exception:
        item = await self._stream.receive()
        self._observe(item)
        return item

    async def aclose(self) -> None:
        await self._stream.aclose()

    def __aiter__(self) -> ObservedRead:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> ObservedRead:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()
