"""What a queued inbound message costs a session inbox (WIRE.md §Inboxes).

An inbox holds decoded JSON-RPC messages (Python objects), which can take
far more memory than their JSON text: ``[[],[],…]`` costs about 64 bytes per
3 bytes of text, and one astral character makes every character of its
string take 4 bytes. :func:`message_cost` is an upper estimate computed on
the text with C-speed scans only (no parsing), so a message can be refused
before it is decoded, and inbox bounds hold as memory rather than as text
bytes.
"""

from __future__ import annotations

__all__ = ["message_cost"]

#: Bytes charged per JSON container (``[`` or ``{``): an empty list is 56
#: bytes, an empty dict 64, plus the slot that points to it.
_CONTAINER = 72
#: Bytes charged per ``,`` or ``:``: a slot or dict entry, or the number it ends (a float is 24 bytes).
_SEPARATOR = 32
#: Bytes charged per ``"``: half of a string object's 49-byte header, plus a slot.
_QUOTE = 32
#: Text bytes that start an astral character in UTF-8 (4 bytes per character in CPython).
_ASTRAL_LEADS = (b"\xf0", b"\xf1", b"\xf2", b"\xf3", b"\xf4")
#: JSON escapes of a surrogate pair (an astral character), either case.
_ASTRAL_ESCAPES = (b"\\ud8", b"\\ud9", b"\\uda", b"\\udb", b"\\uD8", b"\\uD9", b"\\uDA", b"\\uDB")


def message_cost(payload: bytes) -> int:
    """An upper estimate, in bytes, of the memory that decoding the JSON
    text ``payload`` into Python objects holds: the text length times the
    widest string kind it can produce (1 for ASCII, 2 for other text, 4 when
    an astral character is present), plus a per-container, per-separator and
    per-quote charge (over-counting brackets and quotes inside strings, which
    only errs on the safe side). Linear in ``len(payload)``, no allocation."""
    width = 1
    if not payload.isascii() or b"\\u" in payload:
        width = 2
        if any(lead in payload for lead in _ASTRAL_LEADS) or any(e in payload for e in _ASTRAL_ESCAPES):
            width = 4
    containers = payload.count(b"[") + payload.count(b"{")
    separators = payload.count(b",") + payload.count(b":")
    return (
        width * len(payload)
        + _CONTAINER * containers
        + _SEPARATOR * separators
        + _QUOTE * payload.count(b'"')
    )
