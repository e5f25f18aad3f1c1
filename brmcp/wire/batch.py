"""Several envelope parts in one PM (WIRE.md §Batches): sans-I/O.

A batch PM is the line :data:`BATCH_TAG` followed by one envelope part per
line, separated by LF::

    --mcpb[v=1]--
    --mcp[v=1,sid=…,mid=…,seq=1/1,exp=…]--eyJqc29ucnBjIjoiMi4wIiwuLi59
    --mcp[v=1,sid=…,mid=…,seq=1/1,exp=…]--eyJqc29ucnBjIjoiMi4wIiwuLi59

A receiver that does not know batches (the Go reference, brmcp before this
extension) finds no part in such a text (a part's body cannot contain ``-``
or ``[``) and ignores it as chat, which is why a sender batches only to
peers that announced they accept it (``brmcp/batch``, WIRE.md §Batches).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "BATCH_TAG",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_PARTS",
    "batch_size",
    "encode_batch",
    "is_batch",
    "split_batch",
]

#: The first line of a batch PM.
BATCH_TAG = "--mcpb[v=1]--"

#: The largest batch PM text (bytes; parts are ASCII) this implementation
#: sends or announces. BR's limit is 1,887,437 bytes per message, measured
#: after compression by the sender and before decompression by the
#: recipient (docs/clientrpc.md §Observed on a real network): 1.5 MB of random base64 is
#: delivered, so 1,490,000 keeps a margin of about 20% below the limit for
#: incompressible text, the worst case.
MAX_BATCH_BYTES = 1_490_000

#: Parts per batch at most: a receiver ignores the lines past it. One PM
#: then costs a receiver at most this many messages to decode, however
#: small the peer makes them.
MAX_BATCH_PARTS = 256


def encode_batch(parts: Sequence[str]) -> str:
    """The PM text carrying ``parts`` (envelope strings from
    :func:`~brmcp.wire.encode`, in the order the receiver should handle
    them). Raises ValueError for no parts, more than :data:`MAX_BATCH_PARTS`,
    or a part containing a line break."""
    if not parts:
        raise ValueError("wire: a batch needs at least one part")
    if len(parts) > MAX_BATCH_PARTS:
        raise ValueError(f"wire: a batch holds at most {MAX_BATCH_PARTS} parts, got {len(parts)}")
    for part in parts:
        if "\n" in part or "\r" in part:
            raise ValueError("wire: a batched part must be one line")
    return "\n".join((BATCH_TAG, *parts))


def batch_size(parts: Sequence[str]) -> int:
    """The length of :func:`encode_batch` of ``parts`` without building it."""
    return len(BATCH_TAG) + sum(len(p) + 1 for p in parts)


#: A character that is not white space (``str.isspace``): a line holding
#: one is not blank.
_NOT_SPACE = re.compile(r"\S")


def _after_tag(text: str) -> int | None:
    """Where the lines of the batch PM ``text`` start (just after
    :data:`BATCH_TAG`), or None when ``text`` is not a batch."""
    lead = _NOT_SPACE.search(text)
    if lead is None or not text.startswith(BATCH_TAG, lead.start()):
        return None
    start = lead.start() + len(BATCH_TAG)
    if start < len(text) and text[start] not in "\r\n":
        return None
    return start


def split_batch(text: str) -> list[str] | None:
    """The part lines of a batch PM, in order (each to be parsed as one PM
    text by :func:`~brmcp.wire.parse`), or None when ``text`` is not a batch.
    Surrounding white space is ignored; blank lines are skipped; lines past
    :data:`MAX_BATCH_PARTS` are dropped (WIRE.md §Batches).

    Only the lines kept are cut out: the scan jumps from one non-blank line
    to the next, so a PM of millions of blank or tiny lines costs one pass
    over its text and at most :data:`MAX_BATCH_PARTS` strings."""
    pos = _after_tag(text)
    if pos is None:
        return None
    lines: list[str] = []
    search = _NOT_SPACE.search
    while len(lines) < MAX_BATCH_PARTS:
        found = search(text, pos)
        if found is None:
            break
        inside = found.start()
        begin = max(pos, text.rfind("\n", pos, inside) + 1)
        end = text.find("\n", inside)
        if end < 0:
            end = len(text)
        lines.append(text[begin:end])
        pos = end
    return lines


def is_batch(text: str) -> bool:
    """True when ``text`` is a batch PM (:func:`split_batch` would not
    return None): brmcp traffic, never chat."""
    return _after_tag(text) is not None
