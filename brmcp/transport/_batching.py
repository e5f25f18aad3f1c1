"""Who accepts batches (WIRE.md §Batches, "Negotiation").

A router that accepts batch PMs says so in the ``_meta`` of the JSON-RPC
messages it sends, key ``brmcp/batch`` (:data:`BATCH_KEY`), value the largest
batch PM text it accepts in bytes (a JSON integer >= :data:`MIN_BATCH_BYTES`):

* the client role marks every request to a peer that has not refused;
* the server role marks every response to a peer that marked a message;
* a response without the mark, from a peer whose requests were marked, is
  a refusal: that peer (the Go reference, brmcp before batches) is never
  marked again and never gets a batch.

The router consumes the mark: it is removed from inbound messages before
the session sees them (an ``_meta`` left empty is removed too).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from mcp.types import JSONRPCMessage, JSONRPCRequest, JSONRPCResponse

__all__ = ["BATCH_KEY", "MIN_BATCH_BYTES", "BatchPeers", "consume_mark", "marked_payload"]

BATCH_KEY = "brmcp/batch"

#: A smaller announced limit is ignored (no useful batch fits).
MIN_BATCH_BYTES = 4096

#: Peers remembered; the least recently heard are forgotten first.
_PEERS_KEPT = 65536

_ASKED = -1
_REFUSED = 0


class BatchPeers:
    """Per peer: unknown, asked (marked, no answer yet), refused, or the
    batch limit it accepts (bytes, already capped at ours). ``ours`` is the
    largest batch this side sends or accepts."""

    __slots__ = ("_state", "ours")

    def __init__(self, ours: int) -> None:
        self.ours = ours
        self._state: OrderedDict[str, int] = OrderedDict()

    def limit(self, peer: str) -> int | None:
        """The largest batch PM (bytes) to send ``peer``, None: no batches."""
        state = self._state.get(peer)
        return state if state is not None and state > 0 else None

    def mark_request(self, peer: str) -> bool:
        """Whether a request to ``peer`` carries the mark (and note it did)."""
        state = self._state.get(peer)
        if state == _REFUSED:
            return False
        if state is None:
            self._set(peer, _ASKED)
        return True

    def mark_response(self, peer: str) -> bool:
        """Whether a response to ``peer`` carries the mark."""
        state = self._state.get(peer)
        return state is not None and state > 0

    def heard(self, peer: str, value: int | None, *, response: bool) -> None:
        """An inbound message from ``peer`` carried ``value`` (None: no valid mark)."""
        if value is not None:
            self._set(peer, min(value, self.ours))
        elif response and self._state.get(peer) == _ASKED:
            self._set(peer, _REFUSED)

    def _set(self, peer: str, state: int) -> None:
        states = self._state
        states[peer] = state
        states.move_to_end(peer)
        if len(states) > _PEERS_KEPT:
            states.popitem(last=False)


def _meta_of(message: JSONRPCMessage) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(container, _meta)`` of a request's params or a response's result."""
    if isinstance(message, JSONRPCRequest):
        container = message.params
    elif isinstance(message, JSONRPCResponse):
        container = message.result
    else:
        return None, None
    if not isinstance(container, dict):
        return None, None
    meta = container.get("_meta")
    return container, meta if isinstance(meta, dict) else None


def consume_mark(message: JSONRPCMessage) -> int | None:
    """Remove the mark from an inbound message; its value when valid (an
    integer, not a boolean, >= :data:`MIN_BATCH_BYTES`), else None."""
    container, meta = _meta_of(message)
    if container is None or meta is None or BATCH_KEY not in meta:
        return None
    value = meta.pop(BATCH_KEY)
    if not meta:
        del container["_meta"]
        if not container and isinstance(message, JSONRPCRequest):
            message.params = None  # params made only to carry the mark
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_BATCH_BYTES:
        return None
    return value


def marked_payload(message: JSONRPCMessage, value: int) -> bytes | None:
    """The compact JSON of ``message`` with the mark added to its ``_meta``
    (the message itself is not changed); None when it cannot carry one
    (a notification, an error, an ``_meta`` that is not an object, or a
    message that cannot be serialized, such as one holding a lone surrogate).

    The bytes are the message's own ``model_dump_json`` (what an unmarked
    message is sent as) with ``"brmcp/batch":value`` as the last member of
    its ``_meta``, which is created as the container's last member when
    absent (and the container itself, ``params``, when a request has none)."""
    if isinstance(message, JSONRPCRequest):
        container: Any = message.params
        key = "params"
    elif isinstance(message, JSONRPCResponse):
        container = message.result
        key = "result"
    else:
        return None
    if container is not None and not isinstance(container, dict):
        return None
    meta = None if container is None else container.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        return None
    try:
        if container is None or "_meta" not in container:
            text = message.model_dump_json(by_alias=True, exclude_unset=True).encode()
            spliced = _splice_mark(text, container, key in message.model_fields_set, value)
            if spliced is not None:
                return spliced
        # An existing _meta gets the mark as its last member: serialize a copy.
        marked = {**(container or {}), "_meta": {**(meta or {}), BATCH_KEY: value}}
        copy = message.model_copy(update={key: marked})
        return copy.model_dump_json(by_alias=True, exclude_unset=True).encode()
    except (TypeError, ValueError):  # not JSON-safe (a lone surrogate): sent unmarked
        return None


def _splice_mark(text: bytes, container: dict[str, Any] | None, is_set: bool, value: int) -> bytes | None:
    """Add ``"_meta":{"brmcp/batch":value}`` to the container (``params`` or
    ``result``), the last member of the JSON-RPC object ``text``. None when
    ``text`` does not end as expected (then the caller serializes a copy)."""
    mark = b'"_meta":{"' + BATCH_KEY.encode() + b'":' + str(value).encode() + b"}"
    if container is None:
        if is_set:  # "params":null
            if text.endswith(b":null}"):
                return text[:-5] + b"{" + mark + b"}}"
            return None
        if text.endswith(b"}"):  # no params member at all
            return text[:-1] + b',"params":{' + mark + b"}}"
        return None
    if not text.endswith(b"}}"):
        return None
    if not container:
        return text[:-2] + mark + b"}}" if text.endswith(b"{}}") else None
    return text[:-2] + b"," + mark + b"}}"
