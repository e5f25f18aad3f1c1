"""Errors raised by the envelope codec and the assembler (WIRE.md §Errors).

Every error is a :class:`WireError`, itself a :class:`ValueError`, so callers
that only care about "this part was refused" can catch one type. The
sentinel messages match the Go reference byte for byte, because peers log
them and operators grep for them.
"""

from __future__ import annotations

__all__ = [
    "BufferFullError",
    "ExpiredError",
    "PartCountError",
    "TooLargeError",
    "WireError",
]


class WireError(ValueError):
    """Base class: a payload could not be encoded or a part was refused."""


class ExpiredError(WireError):
    """The part's ``exp`` deadline has passed (WIRE.md §Deadlines)."""

    def __init__(self, message: str = "message deadline passed") -> None:
        super().__init__(message)


class TooLargeError(WireError):
    """A message exceeds a size bound: more than ``MAX_PARTS`` parts when
    encoding, or a reassembly byte bound (WIRE.md §Reassembly bounds)."""

    def __init__(self, message: str = "message exceeds size bounds") -> None:
        super().__init__(message)


class BufferFullError(WireError):
    """The peer already has the maximum number of messages in reassembly
    (WIRE.md §Reassembly bounds)."""

    def __init__(self, message: str = "reassembly buffer full") -> None:
        super().__init__(message)


class PartCountError(WireError):
    """A part's ``total`` disagrees with the total recorded for its message;
    the whole pending message was dropped (WIRE.md §Reassembly)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"wire: inconsistent part count for {key}")
        self.key = key
