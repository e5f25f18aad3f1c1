"""Large ``tools/call`` answers as JSON: the SDK answers a POST as an SSE
stream, and SDK clients refuse SSE events over 1 MiB by default, so an answer
larger than :data:`MAX_SSE_ANSWER_BYTES` is rewritten into an
``application/json`` response (BRIDGE.md §Large results)."""

from __future__ import annotations

import json
from typing import Any

import anyio
from starlette.types import Message, Send

__all__ = ["MAX_SSE_ANSWER_BYTES", "LargeAsJson"]

#: Largest JSON-RPC answer written as one SSE event. The official Python
#: SDK client refuses SSE events over 1 MiB by default; a larger answer is
#: written as an ``application/json`` response instead (BRIDGE.md §Large results).
MAX_SSE_ANSWER_BYTES = 1_000_000


class LargeAsJson:
    """An ASGI ``send`` for a ``tools/call`` POST answered by the SDK as an
    SSE stream: holds the stream back until it carries anything but its
    priming event. When the first thing is the call's own answer and that
    answer is larger than :data:`MAX_SSE_ANSWER_BYTES`, it is sent as an
    ``application/json`` response (which SDK clients read without an event
    size limit); otherwise the held stream is released unchanged. A call
    that relays progress, logs or requests before its answer, or that takes
    longer than the app's hold time (``MAX_HOLD_SECONDS`` of :mod:`._http`), streams as before."""

    def __init__(self, send: Send, request_id: Any, accepts_json: bool) -> None:
        self._send = send
        self._id = request_id
        self._accepts_json = accepts_json
        self._start: Message | None = None
        self._held: list[Message] = []
        self._text = b""
        self._state = "holding"  # then "streaming" or "answered"
        self._lock = anyio.Lock()

    async def release(self) -> None:
        """Stop holding: whatever was held is sent and the stream goes on."""
        async with self._lock:
            if self._state in ("holding", "release"):
                await self._flush()

    async def __call__(self, event: Message) -> None:
        async with self._lock:
            await self._handle(event)

    async def _handle(self, event: Message) -> None:
        if self._state == "streaming":
            await self._send(event)
            return
        if self._state == "answered":
            return  # the rest of the SSE stream after a JSON answer
        if event["type"] == "http.response.start":
            ctype = b"".join(v for k, v in event.get("headers", ()) if k.lower() == b"content-type")
            if not self._accepts_json or not ctype.startswith(b"text/event-stream"):
                self._state = "streaming"
                await self._send(event)
                return
            self._start = event
            return
        if event["type"] != "http.response.body" or self._start is None:
            await self._flush()
            await self._send(event)
            return
        self._held.append(event)
        self._text += event.get("body", b"")
        answer = self._answer()
        if answer is None and self._state == "holding" and event.get("more_body", False):
            return
        if answer is not None and len(answer) > MAX_SSE_ANSWER_BYTES:
            self._state = "answered"
            headers = [
                (k, v)
                for k, v in self._start.get("headers", ())
                if k.lower() not in (b"content-type", b"content-length", b"cache-control", b"connection")
            ]
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(answer)).encode()),
            ]
            await self._send({"type": "http.response.start", "status": 200, "headers": headers})
            await self._send({"type": "http.response.body", "body": answer, "more_body": False})
            return
        await self._flush()

    def _answer(self) -> bytes | None:
        """The call's answer when the held events are the priming event and
        that answer; None while undecided. Anything else ends holding."""
        text = self._text.replace(b"\r\n", b"\n")
        while b"\n\n" in text:
            block, _, text = text.partition(b"\n\n")
            data = b"\n".join(
                line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
            )
            if not data.strip():
                continue  # the priming event, or a keep-alive comment
            try:
                value = json.loads(data)
            except ValueError:
                self._state = "release"
                return None
            if (
                isinstance(value, dict)
                and value.get("id") == self._id
                and ("result" in value or "error" in value)
            ):
                return data
            self._state = "release"  # relayed traffic comes first: keep streaming
            return None
        return None

    async def _flush(self) -> None:
        start, held = self._start, self._held
        self._state, self._start, self._held, self._text = "streaming", None, [], b""
        if start is not None:
            await self._send(start)
        for event in held:
            await self._send(event)
