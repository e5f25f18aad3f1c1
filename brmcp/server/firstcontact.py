"""First contact in one round trip: the harness side (WIRE.md §Eras, "First
contact").

A brmcp client that has never talked to a bot does not know its era. It
opens with a handshake-era ``initialize`` whose ``params._meta`` carries
``"brmcp/listTools": true``. A server that understands the mark answers the
``initialize`` as usual and adds to the result's ``_meta``:

* ``brmcp/modernVersions``: the modern-era protocol versions it also serves
  (a JSON array of strings, e.g. ``["2026-07-28"]``);
* ``brmcp/tools``: what a handshake-era ``tools/list`` would answer this
  caller now (a JSON object ``{"tools": [...]}``; a brmcp harness's also
  says ``"_meta": {"brmcp/marksRefusals": true}``, WIRE.md §Payments);
* ``brmcp/receiptKey``: a harness that signs receipts also names its
  receipt key (64 hex), here and in ``brmcp/tools``'s ``_meta``, as its
  ``tools/list`` answers do (WIRE.md §Signed receipts).

The client then knows the era, the capabilities and the tools after one
round trip (2 PMs). A server that does not understand the mark (the Go
reference, older brmcp) answers a plain ``initialize``, and the client goes
on with the handshake exactly as the reference does: never a PM more.

The client either continues the session (``notifications/initialized``) or
abandons the sid and uses the modern era on a new one; the server closes an
offered session that hears nothing more within :data:`OFFER_LINGER` seconds
(:func:`close_abandoned_offer`).

This module is a tap on the SDK transport pair of one session: it watches
inbound requests for the mark and adds the keys to the matching outbound
answer. It never changes any other message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

import anyio
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCRequest, JSONRPCResponse

from brmcp.server.calls import ObservedRead, wait_event

from .._ops.clock import Clock
from ..protocol.eras import LIST_TOOLS_KEY, MODERN_VERSIONS_KEY, TOOLS_KEY
from ..transport.conn import Conn

__all__ = [
    "LIST_TOOLS_KEY",
    "MODERN_VERSIONS_KEY",
    "OFFER_LINGER",
    "TOOLS_KEY",
    "FirstContactTap",
    "close_abandoned_offer",
]

log = logging.getLogger("brmcp.server")

#: Seconds an offered session may stay silent before the server closes it
#: (the client went to the modern era on another sid).
OFFER_LINGER = 15.0


class FirstContactTap:
    """Wraps one session's ``(read_stream, write_stream)``.

    ``extra`` returns the ``_meta`` entries to add to a marked
    ``initialize`` answer (called once per marked request, on the event
    loop). :attr:`offered` is set once such an answer went out;
    :attr:`heard` is set by every inbound message after it."""

    __slots__ = ("_ids", "_read", "_write", "extra", "heard", "offered")

    def __init__(
        self,
        read_stream: ReadStream[SessionMessage | Exception],
        write_stream: WriteStream[SessionMessage],
        extra: Callable[[], dict[str, Any]],
    ) -> None:
        self._read = read_stream
        self._write = write_stream
        self.extra = extra
        self._ids: set[str | int] = set()
        self.offered = anyio.Event()
        self.heard = anyio.Event()

    @property
    def read_stream(self) -> ObservedRead:
        return ObservedRead(self._read, self._inbound)

    @property
    def write_stream(self) -> _TapWrite:
        return _TapWrite(self)

    def _inbound(self, item: SessionMessage | Exception) -> None:
        if self.offered.is_set():
            self.heard.set()
        if not isinstance(item, SessionMessage):
            return
        message = item.message
        if not isinstance(message, JSONRPCRequest) or message.method != "initialize":
            return
        params = message.params
        meta = params.get("_meta") if isinstance(params, dict) else None
        if isinstance(meta, dict) and meta.get(LIST_TOOLS_KEY) is True and len(self._ids) < 16:
            self._ids.add(message.id)

    def _outbound(self, item: SessionMessage) -> SessionMessage:
        message = item.message
        if not self._ids or not isinstance(message, JSONRPCResponse) or message.id not in self._ids:
            return item
        self._ids.discard(message.id)
        result = message.result
        if not isinstance(result, dict) or "protocolVersion" not in result:
            return item  # not an initialize answer after all
        try:
            extra = self.extra()
        except Exception:
            log.exception("first contact: the tools for the initialize answer failed; answering plainly")
            return item
        meta = result.get("_meta")
        merged = {**meta, **extra} if isinstance(meta, dict) else dict(extra)
        answer = JSONRPCResponse(jsonrpc="2.0", id=message.id, result={**result, "_meta": merged})
        self.offered.set()
        return SessionMessage(message=answer, metadata=item.metadata)


class _TapWrite:
    __slots__ = ("_tap",)

    def __init__(self, tap: FirstContactTap) -> None:
        self._tap = tap

    async def send(self, item: SessionMessage, /) -> None:
        await self._tap._write.send(self._tap._outbound(item))

    async def aclose(self) -> None:
        await self._tap._write.aclose()

    async def __aenter__(self) -> _TapWrite:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def close_abandoned_offer(tap: FirstContactTap, conn: Conn, timer: Clock | None = None) -> None:
    """Close ``conn``, the session ``tap`` watches, when its marked
    ``initialize`` was answered and the client says nothing more on it
    within :data:`OFFER_LINGER` seconds on ``timer`` (``HarnessConfig.timer``;
    None: anyio's clock): it went to the modern era on another sid (WIRE.md
    §Eras). Returns at once once the client speaks again."""
    await tap.offered.wait()
    if await wait_event(tap.heard, OFFER_LINGER, timer):
        return
    log.debug("session %s: first contact went elsewhere; closing it", conn.session_id)
    conn.close()
