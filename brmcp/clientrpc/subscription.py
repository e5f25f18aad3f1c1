"""Event streams of the clientrpc client: a :class:`Subscription` outlives
connections, is reopened with its ``unacked_from`` after every reconnect, and
drops replayed events it already yielded, so a consumer sees each event once
(docs/clientrpc.md §Resuming after a reconnect, §Backpressure)."""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import anyio

from .errors import ClientrpcNotConnected
from .protojson import ProtojsonError
from .types import Event

__all__ = ["Subscription"]

log = logging.getLogger("brmcp.clientrpc")

E = TypeVar("E", bound=Event)


@dataclasses.dataclass(frozen=True, slots=True)
class _Frozen:
    """The de-duplication key of an unhashable event: its type and a hashable
    copy of its content (a decoded value can never be a ``_Frozen``, so such a
    key never equals a hashable event)."""

    kind: type
    content: Hashable


def _dedupe_key(value: object) -> Hashable:
    """``value`` itself when hashable; otherwise a :class:`_Frozen` copy that
    is equal exactly when the content is (dicts and other mappings, lists,
    tuples, sets and dataclass instances, nested). Raises ``TypeError`` for
    another unhashable value (or ``RecursionError`` when nested too deeply)."""
    try:
        hash(value)
    except TypeError:
        pass
    else:
        return value
    kind = type(value)
    if isinstance(value, Mapping):
        return _Frozen(kind, frozenset((_dedupe_key(k), _dedupe_key(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return _Frozen(kind, tuple(_dedupe_key(v) for v in value))
    if isinstance(value, set | frozenset):
        return _Frozen(kind, frozenset(_dedupe_key(v) for v in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return _Frozen(kind, tuple(_dedupe_key(getattr(value, f.name)) for f in fields if f.compare))
    raise TypeError(f"unhashable type: {kind.__name__!r}")


class _Owner(Protocol):
    """What a subscription needs from its client."""

    def _live_serial(self) -> int | None:
        """The serial of the live connection, or None while disconnected."""

    def _unsubscribe(self, sub: Subscription[Any], /) -> None: ...

    async def _wait_change(self) -> None: ...


class Subscription(Generic[E]):
    """One event stream of a :class:`~brmcp.clientrpc.Client`, kept open across reconnects.

    Iterate it (``async for event in sub``) to receive decoded events in the
    order brclient sent them; use it as an async context manager (or call
    :meth:`close`) to stop: the iterator then ends. Events already yielded are
    remembered (the newest ``dedupe_size`` of them, by value, i.e. event type,
    sequence id and content) and dropped when a reopened stream replays them;
    comparing the content too means that an id reused after brclient resets
    its log is not mistaken for a duplicate. An unhashable event (a decoder
    returning dicts, lists or mutable dataclasses) is compared by its content;
    one that cannot be compared at all is delivered with a warning (a replay
    may then deliver it again, never lose it). Events queue without bound while
    the consumer is busy, so the connection keeps draining (docs/clientrpc.md
    §Backpressure). The iterator ends when the subscription or the client closes.

    ``unacked_from`` is sent on every (re)open; the consumer may raise it (for
    instance to the last id it acked) to shorten replays. Keeping 0 and relying
    on the dedupe is the robust choice (docs/clientrpc.md §Resuming after a reconnect).
    Raises ``ValueError`` for a negative ``unacked_from``.
    """

    def __init__(
        self,
        client: _Owner,
        method: str,
        decode: Callable[[Any], E],
        unacked_from: int,
        dedupe_size: int,
    ) -> None:
        if unacked_from < 0:
            raise ValueError("unacked_from must be >= 0")
        self.method = method
        self.unacked_from = unacked_from
        self.delivered = 0  #: events queued for the consumer
        self.duplicates = 0  #: replayed events dropped as already delivered
        self.malformed = 0  #: notifications that did not decode (logged and dropped)
        self.opens = 0  #: stream requests sent (one per connection, plus reopenings)
        self._client = client
        self._decode = decode
        self._dedupe_size = max(1, dedupe_size)
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self._queue: deque[E] = deque()
        self._wakeup = anyio.Event()
        self._open_on: int | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def is_open(self) -> bool:
        """True while the stream request is sent on the current connection and not ended."""
        serial = self._client._live_serial()
        return serial is not None and self._open_on == serial

    @property
    def pending(self) -> int:
        """Events received and not yet taken by the consumer."""
        return len(self._queue)

    def __aiter__(self) -> Subscription[E]:
        return self

    async def __anext__(self) -> E:
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            await self._wakeup.wait()
        return self._queue.popleft()

    async def __aenter__(self) -> Subscription[E]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop receiving. brclient has no cancel message: the stream stays open
        server-side (holding its slot) until the connection drops; its events
        are dropped here."""
        if self._closed:
            return
        self._closed = True
        self._client._unsubscribe(self)
        self._wake()

    async def aclose(self) -> None:
        self.close()

    async def wait_open(self) -> None:
        """Wait until the stream request has been sent on the current connection."""
        while not self.is_open:
            if self._closed:
                raise ClientrpcNotConnected("subscription closed")
            await self._client._wait_change()

    def _wake(self) -> None:
        self._wakeup.set()
        self._wakeup = anyio.Event()

    def _deliver(self, params: Any) -> bool:
        """Decode one notification's ``params`` and queue the event unless it
        is a replayed duplicate. Returns False when the decoder raised (counted
        in :attr:`malformed`, logged in one line and dropped): a decoder's
        error never reaches the connection's reader."""
        try:
            event = self._decode(params)
        except Exception as exc:
            self.malformed += 1
            reason = str(exc).splitlines()[0] if str(exc) else ""
            if not isinstance(exc, ProtojsonError | ValueError | TypeError):
                reason = f"{type(exc).__name__}: {reason}" if reason else type(exc).__name__
            log.error("clientrpc: dropping a malformed %s event: %s", self.method, reason)
            return False
        self._push(event)
        return True

    def _push(self, event: E) -> None:
        """Queue ``event`` unless an equal one was already delivered. Events
        are compared by value, unhashable ones (a decoder returning dicts or
        lists) through :func:`_dedupe_key`; an event that cannot be compared
        at all is delivered without replay protection, with a one-line warning."""
        if self._closed:
            return
        seen = self._seen
        try:
            key = _dedupe_key(event)
            duplicate = key in seen
        except Exception as exc:  # also a __hash__ or __eq__ that raises
            log.warning(
                "clientrpc: a %s event (%s) cannot be compared for de-duplication (%s: %s); "
                "delivering it, a replay may deliver it again",
                self.method,
                type(event).__name__,
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
            )
        else:
            if duplicate:
                seen.move_to_end(key)
                self.duplicates += 1
                return
            seen[key] = None
            if len(seen) > self._dedupe_size:
                seen.popitem(last=False)
        self._queue.append(event)
        self.delivered += 1
        self._wake()
