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
from collections.abc import Iterator
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
# First characters a PM body must have to possibly be an envelope: the tag's
# '-' or trimmable whitespace. Anything else is rejected on one set lookup.
_MAYBE_FIRST = frozenset("-" + _GO_SPACE)
# Whitespace allowed inside the base64 body: Go regexp's \s, exactly
# [\t\n\f\r ] -- no VT, nothing non-ASCII (WIRE.md §Parsing rule 2).
_BODY_SPACE = b"\t\n\x0c\r "

_ID_RE = re.compile(r"[0-9a-f]{1,32}")


def _int64_at_most(limit: str) -> str:
    """Regex alternatives matching exactly the 19-digit decimals (no leading
    zero) whose value is <= ``limit`` (a 19-digit string)."""
    alternatives = []
    for index, digit in enumerate(limit):
        low = 1 if index == 0 else 0
        high = int(digit) - 1
        if high >= low:
            rest = 18 - index
            alternatives.append(f"{limit[:index]}[{low}-{high}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    alternatives.append(limit)
    return "|".join(alternatives)


# A Go strconv.ParseInt(s, 10, 64) decimal (WIRE.md §Parsing rule 5): an
# optional sign, ASCII digits (leading zeros free), value within int64. The
# range is part of the pattern so that every occurrence of a key can be
# validated in one linear pass; the final lookbehind demands >= 1 digit.
_INT64 = (
    r"(?:\+?+0*+(?:[1-9][0-9]{0,17}+(?![0-9])|" + _int64_at_most(str(_INT64_MAX)) + r")?+"
    r"|-0*+(?:[1-9][0-9]{0,17}+(?![0-9])|" + _int64_at_most(str(-_INT64_MIN)) + r")?+)"
    r"(?<=[0-9])"
)
_ID = r"[0-9a-f]{1,32}+"
# One header item (WIRE.md §Parsing rules 3-5): a known key with a valid
# value, or any other key=value (unknown keys are ignored). The first two
# alternatives are shortcuts for items that cannot start with a known key.
_ITEM = (
    r"(?:[^,=vsme][^,=]*+=[^,]*+|=[^,]*+"
    rf"|v={_INT64}|sid={_ID}|mid={_ID}|seq={_INT64}/{_INT64}|exp={_INT64}"
    r"|(?!(?:v|sid|mid|seq|exp)=)[^,=]*+=[^,]*+)"
)
# The whole header: items separated by ',' with nothing else. Possessive and
# atomic throughout, so a hostile header of millions of items is checked in
# one linear pass without materialising the items.
_HEADER_RE = re.compile(rf"(?>{_ITEM})(?:,{_ITEM})*+")
# The header every conforming encoder emits; tried first so that the common
# case needs one small match. Anything it accepts the general rules accept
# with the same values.
_CANONICAL_RE = re.compile(
    r"v=0*1,sid=([0-9a-f]{1,32}),mid=([0-9a-f]{1,32}),"
    r"seq=([0-9]{1,18})/([0-9]{1,18}),exp=(-?[0-9]{1,18})"
)
_SIGNED_RE = re.compile(r"([+-]?)0*+([0-9]*)")
_a2b = binascii.a2b_base64
_b2a = binascii.b2a_base64


# Ids are cut from os.urandom output fetched in batches: one getrandom call
# per 256 ids instead of one per message (the syscall dominated small-message
# encoding). next() on a list iterator is atomic under the GIL, so threads
# never share an id; a forked child drops the parent's unused batch.
_ID_BATCH = 256
_id_pool: Iterator[str] = iter(())


def new_id() -> str:
    """Return a fresh session or message id: 8 CSPRNG bytes (``os.urandom``)
    as 16 lowercase hex characters (WIRE.md §Identifiers)."""
    global _id_pool
    value = next(_id_pool, None)
    if value is not None:
        return value
    raw = os.urandom(8 * _ID_BATCH).hex()
    _id_pool = iter([raw[i : i + 16] for i in range(16, len(raw), 16)])
    return raw[:16]


def _forget_id_pool() -> None:
    global _id_pool
    _id_pool = iter(())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_id_pool)


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
        """True when ``exp > 0`` and the whole unix second of ``now`` (seconds,
        floored) is strictly after ``exp`` (WIRE.md §Deadlines). At ``now ==
        exp + 0.999`` the part is still live."""
        # floor(now) > exp  <=>  now >= exp + 1, compared exactly (int vs float).
        return self.exp > 0 and now >= self.exp + 1


_new_object = object.__new__
_set_sid, _set_mid, _set_seq, _set_total, _set_exp, _set_chunk = (
    vars(Part)[name].__set__ for name in ("sid", "mid", "seq", "total", "exp", "chunk")
)


def _make_part(sid: str, mid: str, seq: int, total: int, exp: int, chunk: bytes) -> Part:
    """Build a :class:`Part` through its slot descriptors: equal to
    ``Part(...)`` but about twice as fast as the frozen dataclass
    ``__init__``, which matters for small messages (one Part per PM)."""
    part: Part = _new_object(Part)
    _set_sid(part, sid)
    _set_mid(part, mid)
    _set_seq(part, seq)
    _set_total(part, total)
    _set_exp(part, exp)
    _set_chunk(part, chunk)
    return part


def _go_trim(text: str) -> str:
    """Go's ``strings.TrimSpace`` (WIRE.md §Parsing rule 1). ``str.strip()``
    with no argument strips Go's set plus U+001C..U+001F and is much faster
    than stripping an explicit set, so it is used whenever none of those
    four separators occurs in ``text``."""
    if "\x1c" in text or "\x1d" in text or "\x1e" in text or "\x1f" in text:
        return text.strip(_GO_SPACE)
    return text.strip()


def _decode_body(text: str, start: int) -> bytes | None:
    """Decode ``text[start:]`` as Go's StdEncoding does after deleting the
    body whitespace: complete 4-character quanta, padding only as the last
    one or two characters, non-zero trailing bits tolerated, non-empty
    result (WIRE.md §Parsing rule 7)."""
    body = text[start:]
    try:
        # Fast path: no whitespace. strict_mode rejects any character outside
        # the alphabet, data after padding and misplaced padding, but still
        # accepts surplus '=' after a complete quantum ("QUJD=", "QUJD===="),
        # which the length and "===" checks below refuse.
        chunk = _a2b(body, strict_mode=True)
    except (binascii.Error, ValueError):
        chunk = None
    if chunk is not None:
        if len(body) % 4 or body.endswith("==="):
            return None
        return chunk or None
    try:
        raw = body.encode("ascii")
    except UnicodeEncodeError:
        return None
    del body  # keep peak memory low on huge inputs
    stripped = raw.translate(None, _BODY_SPACE)
    if len(stripped) == len(raw):
        return None  # no whitespace: the fast path's verdict stands
    del raw
    if len(stripped) % 4 or stripped.endswith(b"==="):
        return None
    try:
        chunk = _a2b(stripped, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    return chunk or None


def _value_span(text: str, key: str, start: int, end: int) -> tuple[int, int] | None:
    """Span of the value of the *last* item named ``key`` in the header
    ``text[start:end]``, or None when the key is absent. Only valid after
    :data:`_HEADER_RE` accepted the header."""
    pos = text.rfind("," + key + "=", start, end)
    if pos >= 0:
        value_start = pos + len(key) + 2
    elif text.startswith(key + "=", start, end):
        value_start = start + len(key) + 1
    else:
        return None
    value_end = text.find(",", value_start, end)
    return value_start, (end if value_end < 0 else value_end)


def _int_at(text: str, start: int, end: int) -> int:
    """The value of an int64 decimal already validated by :data:`_INT64`."""
    match = _SIGNED_RE.match(text, start, end)
    assert match is not None  # the pattern matches any string
    digits = match.group(2)
    value = int(digits) if digits else 0
    return -value if match.group(1) == "-" else value


def _general_header(text: str, start: int, end: int) -> tuple[str, str, int, int, int] | None:
    """Apply header rules 3-6 (WIRE.md §Parsing) to ``text[start:end]``.
    Every occurrence of a known key is validated by :data:`_HEADER_RE`;
    the last occurrence supplies the value."""
    if _HEADER_RE.fullmatch(text, start, end) is None:
        return None
    span = _value_span(text, "v", start, end)
    if span is None or _int_at(text, *span) != VERSION:
        return None
    span = _value_span(text, "sid", start, end)
    if span is None:
        return None
    sid = text[span[0] : span[1]]
    span = _value_span(text, "mid", start, end)
    if span is None:
        return None
    mid = text[span[0] : span[1]]
    span = _value_span(text, "seq", start, end)
    if span is None:
        return None
    slash = text.find("/", span[0], span[1])
    seq = _int_at(text, span[0], slash)
    total = _int_at(text, slash + 1, span[1])
    span = _value_span(text, "exp", start, end)
    exp = 0 if span is None else _int_at(text, *span)
    return sid, mid, seq, total, exp


def parse(text: str) -> Part | None:
    """Parse one PM body into a :class:`Part`.

    Returns None for anything that is not a well-formed part of version 1:
    human chat, other versions, malformed headers or bodies. Never raises
    for any ``str`` input, and works in time and extra memory linear in
    ``len(text)`` (WIRE.md §Parsing).
    """
    if not text.startswith(_TAG):
        if text[:1] not in _MAYBE_FIRST:
            return None
        text = _go_trim(text)
        if not text.startswith(_TAG):
            return None
    elif text[-1] in _GO_SPACE_SET:
        text = _go_trim(text)
    # The header is every character up to the first ']', which must be
    # followed by '--'. The body alphabet has no ']' so no second tag can hide.
    close = text.find("]", 6)
    if close < 0 or not text.startswith("--", close + 1):
        return None
    m = _CANONICAL_RE.fullmatch(text, 6, close)
    if m is not None:
        sid, mid, s_seq, s_total, s_exp = m.groups()
        seq = int(s_seq)
        total = int(s_total)
        if seq < 1 or seq > total or total > MAX_PARTS:
            return None
        chunk = _decode_body(text, close + 3)
        if chunk is None:
            return None
        return _make_part(sid, mid, seq, total, int(s_exp), chunk)
    # General path. The body is checked first: it is the cheaper test per
    # character, so hostile headers followed by junk are refused quickly.
    chunk = _decode_body(text, close + 3)
    if chunk is None:
        return None
    fields = _general_header(text, 6, close)
    if fields is None:
        return None
    sid, mid, seq, total, exp = fields
    if seq < 1 or seq > total or total > MAX_PARTS:
        return None
    return _make_part(sid, mid, seq, total, exp, chunk)


def is_envelope(text: str) -> bool:
    """True exactly when :func:`parse` accepts ``text`` (WIRE.md §Parsing).

    Ordinary chat is rejected on its first character, before any regex.
    """
    if text[:1] not in _MAYBE_FIRST:
        return False
    return parse(text) is not None


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _go_quote(value: object) -> str:
    """Quote like Go's ``%q`` for error texts: double quotes, backslash
    escapes, non-printable characters as ``\\x``/``\\u``/``\\U`` escapes."""
    if not isinstance(value, str):
        return repr(value)
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


# Ids that passed _check_id: a session sends many messages under one sid, so
# a set lookup replaces the regex. Bounded by clearing when full.
_valid_ids: set[str] = set()


def _check_id(name: str, value: object) -> str:
    if type(value) is str and value in _valid_ids:
        return value
    if not isinstance(value, str) or _ID_RE.fullmatch(value) is None:
        # Same text as the Go reference: wire: invalid sid "<sid>".
        raise WireError(f"wire: invalid {name} {_go_quote(value)}")
    if len(_valid_ids) >= 4096:
        _valid_ids.clear()
    _valid_ids.add(value)
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
    exp = int(exp)  # an int subclass (IntEnum) must still print as digits
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
