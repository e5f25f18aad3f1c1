"""One websocket connection to the fake brclient: its outgoing queue, the
16 request slots, its streams and keepalive state."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
from aiohttp import WSMsgType, web
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ...clientrpc.protojson import frame
from ._protocol import CODE_EOF, echo_id

WS_CLOSED = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR)


class Stream:
    __slots__ = ("conn", "end", "ended", "kind", "method", "request_id")

    def __init__(self, conn: Conn, request_id: Any, method: str, kind: str) -> None:
        self.conn = conn
        self.request_id = request_id
        self.method = method
        self.kind = kind
        self.ended = anyio.Event()
        self.end: tuple[int, str] = (CODE_EOF, "EOF")


class Conn:
    """One websocket connection to the fake."""

    def __init__(self, ws: web.WebSocketResponse, transport: Any, serial: int) -> None:
        self.ws = ws
        self.transport = transport
        self.serial = serial
        send, recv = anyio.create_memory_object_stream[bytes](math.inf)
        self.out: MemoryObjectSendStream[bytes] = send
        self.out_recv: MemoryObjectReceiveStream[bytes] = recv
        self.in_flight = 0
        self.slot_freed = anyio.Event()
        self.streams: list[Stream] = []
        self.keepalive_ping: bytes | None = None
        self.keepalive_pong = anyio.Event()
        self.test_pings: dict[bytes, anyio.Event] = {}
        self.pongs: list[bytes] = []
        self.closed = False
        self.close_reason = ""
        self.tg: anyio.abc.TaskGroup | None = None

    def enqueue(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self.out.send_nowait(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.closed = True

    def respond(self, request_id: Any, *, result: Any = None, error: tuple[int, str] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": echo_id(request_id)}
        if error is not None:
            message["error"] = {"code": error[0], "message": error[1]}
        else:
            message["result"] = result if result is not None else {}
        self.enqueue(frame(message))

    def notify(self, method: str, params: Mapping[str, Any]) -> None:
        self.enqueue(frame({"jsonrpc": "2.0", "params": params, "method": method}))

    def abort(self, reason: str) -> None:
        """Drop the TCP connection without a close frame (as Go's read loop does)."""
        if not self.close_reason:
            self.close_reason = reason
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        if self.tg is not None:
            self.tg.cancel_scope.cancel()

    def release_slot(self) -> None:
        self.in_flight -= 1
        self.slot_freed.set()
        self.slot_freed = anyio.Event()
