"""Envelope grammar: parse and encode one part per Bison Relay PM.

A part looks like (WIRE.md §Grammar)::

    --mcp[v=1,sid=<sid>,mid=<mid>,seq=<n>/<total>,exp=<unix seconds>]--<base64>

This module is sans-I/O: pure functions over ``str`` and ``bytes``. The
parser accepts exactly what the Go reference (karamble/brmcp ``wire.Parse``)
accepts, including its quirks; every rule below names the WIRE.md section
that specifies it.
"""

from __future__ import annotations

import binascii
import os
import re
from dataclasses import dataclass

from .errors import TooLargeError, WireError

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_PARTS",
    "VERSION",
    "Part",
    "encode",
    "is_envelope",
    "new_id",
    "parse",
]

#: The only envelope version emitted and accepted (WIRE.md §Grammar).
VERSION = 1
#: Raw payload bytes per part, before base64 (WIRE.md §Chunking).
DEFAULT_CHUNK_SIZE = 204800
#: Most parts one message may have; ``total`` never exceeds it (WIRE.md §Chunking).
MAX_PARTS = 64

_TAG = "--mcp["
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

# Go's strings.TrimSpace set (Unicode White_Space). Python's str.strip() also
# strips U+001C..U+001F, which Go keeps, so the set is spelled out
# (WIRE.md §Parsing rule 1).
_GO_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_GO_SPACE_SET = frozenset(_GO_SPACE)
# Whitespace allowed inside the base64 body: Go regexp's \s, exactly
# [\t\n\f\r ] -- no VT, nothing non-ASCII (WIRE.md §Parsing rule 2).
_BODY_SPACE = b"\t\n\x0c\r "

_ID_RE = re.compile(r"[0-9a-f]{1,32}")
_INT_RE = re.compile(r"[+-]?[0-9]+")
# The header every conforming encoder emits; matched first so the common case
# avoids the general key=value loop. Semantics are identical to that loop.
_CANONICAL_RE = re.compile(
    r"v=0*1,sid=([0-9a-f]{1,32}),mid=([0-9a-f]{1,32}),"
    r"seq=([0-9]{1,18})/([0-9]{1,18}),exp=(-?[0-9]{1,18})"
)
_a2b = binascii.a2b_base64
_b2a = binascii.b2a_base64


def new_id() -> str:
    """Return a fresh session or message id: 8 CSPRNG bytes as 16 lowercase
    hex characters (WIRE.md §Identifiers)."""
    return os.urandom(8).hex()


@dataclass(frozen=True, slots=True)
class Part:
    """One parsed envelope.

    ``sid`` and ``mid`` are 1-32 lowercase hex characters; ``1 <= seq <=
    total <= MAX_PARTS``; ``exp`` is the sender's deadline in unix seconds
    (``<= 0`` means no deadline); ``chunk`` is the non-empty decoded slice of
    the message payload this part carries.
    """

    sid: str
    mid: str
    seq: int
    total: int
    exp: int
    chunk: bytes

    def expired(self, now: float) -> bool:
        """True when ``exp > 0`` and the whole unix second of ``now`` is
        strictly after ``exp`` (WIRE.md §Deadlines)."""
        return self.exp > 0 and int(now // 1) > self.exp


def _go_int(text: str) -> int | None:
    """Go ``strconv.Atoi`` / ``ParseInt(s, 10, 64)``: optional sign, ASCII
    digits only (leading zeros fine), within int64; anything else is None
    (WIRE.md §Parsing rule 5). Python's ``int()`` alone would also accept
    spaces, ``_`` and non-ASCII digits."""
    if _INT_RE.fullmatch(text) is None:
        return None
    negative = text[0] == "-"
    digits = (text[1:] if text[0] in "+-" else text).lstrip("0") or "0"
    if len(digits) > 19:  # beyond int64 whatever the digits; avoids huge int()
        return None
    value = -int(digits) if negative else int(digits)
    if value < _INT64_MIN or value > _INT64_MAX:
        return None
    return value


def _decode_body(body: str) -> bytes | None:
    """Decode the base64 body as Go's StdEncoding does after deleting
    whitespace: complete 4-character quanta, padding only as the last one or
    two characters, non-zero trailing bits tolerated, non-empty result
    (WIRE.md §Parsing rule 7)."""
    try:
        # Fast path: no whitespace. strict_mode rejects any character outside
        # the alphabet, data after padding and misplaced padding.
        chunk = _a2b(body, strict_mode=True)
    except (binascii.Error, ValueError):
        try:
            raw = body.encode("ascii")
        except UnicodeEncodeError:
            return None
        stripped = raw.translate(None, _BODY_SPACE)
        if len(stripped) == len(raw):
            return None
        try:
            chunk = _a2b(stripped, strict_mode=True)
        except (binascii.Error, ValueError):
            return None
        n = len(stripped)
        if n % 4 or stripped.endswith(b"==="):
            return None
        return chunk or None
    n = len(body)
    # strict_mode still accepts "QUJD=" and "QUJD====" which Go refuses.
    if n % 4 or body.endswith("==="):
        return None
    return chunk or None


def _parse_header(header: str) -> tuple[str, str, int, int, int] | None:
    """Apply header rules 3-6 (WIRE.md §Parsing). Returns (sid, mid, seq,
    total, exp) or None. Every occurrence of a known key is validated; the
    last occurrence wins."""
    m = _CANONICAL_RE.fullmatch(header)
    if m is not None:
        sid, mid, s_seq, s_total, s_exp = m.groups()
        seq = int(s_seq)
        total = int(s_total)
        exp = int(s_exp)
    else:
        version = 0
        sid = mid = ""
        seq = total = exp = 0
        start = 0
        end = len(header)
        while start <= end:
            # Walk the comma-separated items without materialising them all:
            # a hostile header may hold millions of items.
            comma = header.find(",", start)
            if comma < 0:
                comma = end
            item = header[start:comma]
            start = comma + 1
            key, sep, value = item.partition("=")
            if not sep:
                return None
            if key == "v":
                n = _go_int(value)
                if n is None:
                    return None
                version = n
            elif key == "sid":
                if _ID_RE.fullmatch(value) is None:
                    return None
                sid = value
            elif key == "mid":
                if _ID_RE.fullmatch(value) is None:
                    return None
                mid = value
            elif key == "seq":
                s_seq, sep, s_total = value.partition("/")
                if not sep:
                    return None
                n_seq = _go_int(s_seq)
                if n_seq is None:
                    return None
                n_total = _go_int(s_total)
                if n_total is None:
                    return None
                seq, total = n_seq, n_total
            elif key == "exp":
                n = _go_int(value)
                if n is None:
                    return None
                exp = n
            # Unknown keys are ignored (forward compatibility).
        if version != VERSION or not sid or not mid:
            return None
    if seq < 1 or total < 1 or seq > total or total > MAX_PARTS:
        return None
    return sid, mid, seq, total, exp


def parse(text: str) -> Part | None:
    """Parse one PM body into a :class:`Part`.

    Returns None for anything that is not a well-formed part of version 1:
    human chat, other versions, malformed headers or bodies. Never raises
    for any ``str`` input (WIRE.md §Parsing).
    """
    if not text.startswith(_TAG):
        if not text or text[0] not in _GO_SPACE_SET:
            return None
        text = text.strip(_GO_SPACE)
        if not text.startswith(_TAG):
            return None
    elif text[-1] in _GO_SPACE_SET:
        text = text.strip(_GO_SPACE)
    # The header is every character up to the first ']', which must be
    # followed by '--'. The body regex forbids ']' so no second tag can hide.
    close = text.find("]", 6)
    if close < 0 or not text.startswith("--", close + 1):
        return None
    fields = _parse_header(text[6:close])
    if fields is None:
        return None
    chunk = _decode_body(text[close + 3 :])
    if chunk is None:
        return None
    sid, mid, seq, total, exp = fields
    return Part(sid, mid, seq, total, exp, chunk)


def is_envelope(text: str) -> bool:
    """True exactly when :func:`parse` accepts ``text`` (WIRE.md §Parsing).

    Ordinary chat is rejected on its first characters, before any regex.
    """
    if not text.startswith(_TAG) and (not text or text[0] not in _GO_SPACE_SET):
        return False
    return parse(text) is not None


def _check_id(name: str, value: object) -> str:
    if not isinstance(value, str) or _ID_RE.fullmatch(value) is None:
        raise WireError(f"wire: invalid {name} {value!r}")
    return value


def encode(
    payload: bytes,
    *,
    sid: str,
    exp: int = 0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    mid: str | None = None,
) -> list[str]:
    """Split ``payload`` into envelope strings, one per PM, in seq order.

    ``exp`` is the deadline in unix seconds (0 = none) and is always emitted;
    ``chunk_size`` counts raw bytes before base64 (``<= 0`` selects
    :data:`DEFAULT_CHUNK_SIZE`); every part shares ``mid``, a fresh
    :func:`new_id` when not given (WIRE.md §Chunking).

    Raises :class:`WireError` for an invalid sid or mid, an empty payload or
    an ``exp`` outside int64, and :class:`TooLargeError` when more than
    :data:`MAX_PARTS` parts would be needed.
    """
    _check_id("sid", sid)
    if mid is None:
        mid = new_id()
    else:
        _check_id("mid", mid)
    if isinstance(exp, bool) or not isinstance(exp, int) or not _INT64_MIN <= exp <= _INT64_MAX:
        raise WireError(f"wire: invalid exp {exp!r}")
    if chunk_size <= 0:
        chunk_size = DEFAULT_CHUNK_SIZE
    size = len(payload)
    if size == 0:
        raise WireError("wire: empty payload")
    total = -(-size // chunk_size)
    if total > MAX_PARTS:
        raise TooLargeError()
    if total == 1:
        body = _b2a(payload, newline=False).decode("ascii")
        return [f"--mcp[v=1,sid={sid},mid={mid},seq=1/1,exp={exp}]--{body}"]
    view = memoryview(payload)
    out: list[str] = []
    for index in range(total):
        start = index * chunk_size
        body = _b2a(view[start : start + chunk_size], newline=False).decode("ascii")
        out.append(f"--mcp[v=1,sid={sid},mid={mid},seq={index + 1}/{total},exp={exp}]--{body}")
    return out
