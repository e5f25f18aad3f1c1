"""Resumable agent streams: an SSE event store per agent HTTP session
(BRIDGE.md §Resumability; MCP 2025-11-25 "Resumability and Redelivery").

The SDK's :class:`StreamableHTTPSessionManager` takes one
:class:`~mcp.server.streamable_http.EventStore` for all sessions of an
endpoint, and names a request's stream by its JSON-RPC id, so two agents'
request ``1`` would share a stream and one agent could replay another's
events. :class:`ResumableSessionManager` gives every session its own
:class:`SessionEventStore` instead: an agent resumes (``GET`` with
``Last-Event-ID``) only its own streams.

Event ids are ``<32 random hex>`` per event, never reused. A store keeps at
most :data:`MAX_EVENTS` events and :data:`MAX_BYTES` bytes of messages,
dropping the oldest first, and forgets events older than :data:`EVENT_TTL`
seconds; a resume from a forgotten id replays nothing.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from typing import Any

import anyio
from mcp.server import Server
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.types import JSONRPCMessage

__all__ = ["EVENT_TTL", "MAX_BYTES", "MAX_EVENTS", "ResumableSessionManager", "SessionEventStore"]

#: Most events one session keeps.
MAX_EVENTS = 4096
#: Most bytes of stored messages one session keeps (a 12.5 MiB result fits).
MAX_BYTES = 32 * 1024 * 1024
#: Seconds an event stays replayable.
EVENT_TTL = 600.0


class SessionEventStore(EventStore):
    """The events of one agent HTTP session (see the module docstring)."""

    def __init__(self) -> None:
        self._events: OrderedDict[str, tuple[str, JSONRPCMessage | None, int, float]] = OrderedDict()
        self._bytes = 0

    def stream_of(self, event_id: str) -> str | None:
        """The stream (the request id as text) an event belongs to, if kept."""
        entry = self._events.get(event_id)
        return entry[0] if entry is not None else None

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Keep ``message`` (None: a priming event) and return its new id."""
        now = anyio.current_time()
        size = 0 if message is None else len(message.model_dump_json(by_alias=True, exclude_unset=True))
        event_id = secrets.token_hex(16)
        self._events[event_id] = (str(stream_id), message, size, now)
        self._bytes += size
        self._trim(now)
        return event_id

    def _trim(self, now: float) -> None:
        while self._events:
            first = next(iter(self._events))
            _stream, _message, size, stored = self._events[first]
            if len(self._events) <= MAX_EVENTS and self._bytes <= MAX_BYTES and now - stored <= EVENT_TTL:
                break
            del self._events[first]
            self._bytes -= size

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """Send the events of ``last_event_id``'s stream stored after it, in
        order; returns that stream, or None for an unknown id."""
        self._trim(anyio.current_time())
        entry = self._events.get(last_event_id)
        if entry is None:
            return None
        stream = entry[0]
        after = False
        for event_id, (stream_id, message, _size, _stored) in list(self._events.items()):
            if event_id == last_event_id:
                after = True
                continue
            if after and stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream


class ResumableSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager with a :class:`SessionEventStore` per
    session (``retry_interval`` milliseconds is sent in each priming event).
    :meth:`store` finds a session's store."""

    def __init__(
        self,
        app: Server[Any],
        *,
        retry_interval: int,
        session_idle_timeout: float | None,
        max_request_body_size: int,
    ) -> None:
        super().__init__(
            app,
            json_response=False,
            stateless=False,
            security_settings=None,
            retry_interval=retry_interval,
            session_idle_timeout=session_idle_timeout,
            max_request_body_size=max_request_body_size,
        )
        self._stores: dict[str, SessionEventStore] = {}

    def store(self, session_id: str) -> SessionEventStore | None:
        """The event store of a live session."""
        if session_id not in self._server_instances:
            self._stores.pop(session_id, None)
            return None
        return self._stores.get(session_id)

    def _admit_session(self, requestor: Any) -> Any:
        transport = super()._admit_session(requestor)
        if transport is not None:
            store = SessionEventStore()
            # The SDK passes the manager's single store to every transport;
            # each session gets its own here (see the module docstring).
            transport._event_store = store
            session_id = transport.mcp_session_id
            if session_id is not None:
                self._stores[session_id] = store
                for gone in [s for s in self._stores if s not in self._server_instances]:
                    del self._stores[gone]
        return transport
