"""brclient's per-event-type replay log (``client/internal/replaymsglog``),
in memory (docs/clientrpc.md §Acks and replay).

Each event is appended as one JSON line; its sequence id is
``(file_index << 32) | end_offset``, where the offset grows by the line's
UTF-8 length plus one (the newline) and the file index starts at 1. Files
rotate at 8 MiB. An ack clears everything up to and including its id, for
every client; acking 0 does nothing; acking an id whose file index is above
the current file drops every entry and restarts the ids at file 1.
:meth:`ReplayLog.state` and :meth:`ReplayLog.restore` let a fake brclient keep
its logs across restarts, as brclient's files on disk do (ids keep growing).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["ROTATE_BYTES", "ReplayLog", "sequence_id"]

#: Log files rotate once an entry would take them past this size.
ROTATE_BYTES = 8 << 20

T = TypeVar("T")


def sequence_id(file_index: int, offset: int) -> int:
    """The id of an entry ending at ``offset`` in log file ``file_index``."""
    return (file_index << 32) | offset


@dataclass(slots=True)
class _Entry(Generic[T]):
    seq: int
    item: T


class ReplayLog(Generic[T]):
    """An ordered log of events with byte-offset sequence ids."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.file_index = 1
        self.offset = 0
        self.acked = 0  #: the highest id acked so far (0: none)
        self._entries: deque[_Entry[T]] = deque()

    def next_id(self, line_bytes: int) -> int:
        """Reserve the id for an entry whose JSON line is ``line_bytes`` long."""
        size = line_bytes + 1
        if self.offset and self.offset + size > ROTATE_BYTES:
            self.file_index += 1
            self.offset = 0
        self.offset += size
        return sequence_id(self.file_index, self.offset)

    def append(self, seq: int, item: T) -> None:
        """Store ``item`` under an id from :meth:`next_id`."""
        self._entries.append(_Entry(seq, item))

    def after(self, unacked_from: int) -> list[T]:
        """Stored entries with id > ``unacked_from``, oldest first (the replay)."""
        return [e.item for e in self._entries if e.seq > unacked_from]

    def ack(self, seq: int) -> int:
        """Clear entries up to and including ``seq``; returns how many were removed."""
        if seq == 0:
            return 0
        if seq >> 32 > self.file_index:
            removed = len(self._entries)
            self._entries.clear()
            self.file_index, self.offset = 1, 0
            self.acked = 0
            return removed
        removed = 0
        while self._entries and self._entries[0].seq <= seq:
            self._entries.popleft()
            removed += 1
        self.acked = max(self.acked, seq)
        return removed

    def state(self, encode: Callable[[T], Any]) -> dict[str, Any]:
        """The log as JSON values (position, acked id, unacked entries via ``encode``)."""
        return {
            "file_index": self.file_index,
            "offset": self.offset,
            "acked": self.acked,
            "entries": [[e.seq, encode(e.item)] for e in self._entries],
        }

    def restore(self, state: Mapping[str, Any], decode: Callable[[Any, int], T]) -> None:
        """Load what :meth:`state` wrote (``decode(value, seq)`` rebuilds an entry)."""
        self.file_index = int(state["file_index"])
        self.offset = int(state["offset"])
        self.acked = int(state.get("acked", 0))
        self._entries = deque(_Entry(int(seq), decode(value, int(seq))) for seq, value in state["entries"])

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[T]:
        return (e.item for e in self._entries)
