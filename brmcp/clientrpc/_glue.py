"""Helpers for hosts that consume clientrpc event streams: acknowledge after
processing, re-send acks lost to a disconnect, notice every (re)connect, and
call host hooks that may be sync or async (docs/clientrpc.md
§Resuming after a reconnect; the Go reference, karamble/brmcp,
``server/bot.go``).

Why acks are re-sent here rather than left to redelivery: a
:class:`~brmcp.clientrpc.Subscription` drops replayed events it already
yielded, so an event whose ack failed while disconnected never comes back
to the consumer in this process. Acks are cumulative ("up to and including"),
idempotent and global, so re-sending the newest processed id after the next
connect clears it (and everything before it, all of which was processed).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from .client import Client
from .errors import ClientrpcConnectionError, RPCError

__all__ = ["ACK_TIMEOUT", "Acker", "call_hook", "connection_signals", "flush_on_connect"]

log = logging.getLogger("brmcp.clientrpc")

#: Seconds an ack may take before it is treated as lost (re-sent after the next connect).
ACK_TIMEOUT = 60.0


async def call_hook(hook: Callable[..., Any] | None, *args: Any, what: str) -> bool:
    """Call a host hook (sync, or async returning an awaitable) with ``args``.
    Exceptions are logged with ``what`` and swallowed; cancellation
    propagates. Returns False when the hook raised."""
    if hook is None:
        return True
    try:
        result = hook(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("%s hook failed", what)
        return False
    return True


class Acker:
    """Acknowledges one event type, remembering the newest id whose ack did
    not reach brclient so :meth:`flush` can re-send it after a reconnect.

    ``kind`` names the type in logs; ``ack(sequence_id)`` is the client's
    ack method (``ack_received_pm``, ``ack_tip_received``,
    ``ack_tip_progress`` or ``ack_kx_completed``); ``timeout`` in seconds.
    """

    def __init__(
        self, kind: str, ack: Callable[[int], Awaitable[None]], *, timeout: float = ACK_TIMEOUT
    ) -> None:
        self.kind = kind
        self._ack = ack
        self._timeout = timeout
        #: The newest id processed whose ack is not confirmed (None: all confirmed).
        self.pending: int | None = None
        #: Acks brclient confirmed.
        self.sent = 0
        #: Acks that failed (disconnected, lost, timed out) and wait for a reconnect.
        self.deferred = 0

    async def ack(self, sequence_id: int) -> None:
        """Ack ``sequence_id`` (call only after the event was processed).
        Never raises for connection problems: the id is kept for
        :meth:`flush`. Id 0 (an event without id) is never acked."""
        if sequence_id <= 0:
            return
        self.pending = sequence_id
        await self._send(sequence_id)

    async def flush(self) -> None:
        """Re-send the newest unconfirmed ack, if any (after a reconnect)."""
        pending = self.pending
        if pending is not None:
            await self._send(pending)

    async def _send(self, sequence_id: int) -> None:
        try:
            with anyio.fail_after(self._timeout):
                await self._ack(sequence_id)
        except (ClientrpcConnectionError, TimeoutError) as exc:
            self.deferred += 1
            log.info("%s ack of %d deferred until brclient is reachable: %s", self.kind, sequence_id, exc)
            return
        except RPCError as exc:
            # brclient refused it; re-sending would be refused again.
            log.warning("brclient refused the %s ack of %d: %s", self.kind, sequence_id, exc)
        else:
            self.sent += 1
        if self.pending == sequence_id:
            self.pending = None


@contextlib.contextmanager
def connection_signals(client: Client) -> Iterator[MemoryObjectReceiveStream[None]]:
    """Yield a stream that receives one item per (re)connect of ``client``
    (coalesced while unread), plus one at once if it is connected already.
    Chains onto ``client.on_connected`` (the previous callback still runs)
    and restores it on exit."""
    send, receive = anyio.create_memory_object_stream[None](1)
    previous = client.on_connected

    def notify() -> Awaitable[None] | None:
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            send.send_nowait(None)
        return previous() if previous is not None else None

    client.on_connected = notify
    if client.connected:
        send.send_nowait(None)
    try:
        yield receive
    finally:
        if client.on_connected is notify:
            client.on_connected = previous
        send.close()
        receive.close()


async def flush_on_connect(
    signals: MemoryObjectReceiveStream[None],
    ackers: list[Acker],
    hook: Callable[[], Any] | None,
    what: str,
) -> None:
    """For every connect: re-send deferred acks, then call ``hook()``."""
    async for _ in signals:
        for acker in ackers:
            await acker.flush()
        await call_hook(hook, what=what)
