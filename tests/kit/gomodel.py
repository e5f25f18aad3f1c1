"""A deliberately literal, slow model of the Go reference's envelope parser
and assembler (WIRE.md §Parsing, §Deadlines, §Reassembly), written independently of
``brmcp.wire`` so tests can compare the two.

Nothing here is optimised or clever: each rule of WIRE.md §Parsing is one
step, the base64 decoder re-implements Go's ``StdEncoding`` quantum by
quantum without ``binascii``, and the assembler scans every pending message
on every call. Use it only on small inputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Rule 1: Go's unicode.IsSpace / strings.TrimSpace set.
GO_TRIM_SET = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)

# Rule 2: the whole-body pattern. Go's \s is [\t\n\f\r ].
_ENVELOPE = re.compile(r"--mcp\[([^\]]*)\]--([A-Za-z0-9+/=\t\n\f\r ]+)")
_GO_REGEX_SPACE = "\t\n\f\r "

_ID = re.compile(r"[0-9a-f]{1,32}")
_DECIMAL = re.compile(r"[+-]?[0-9]+")

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_B64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {ch: i for i, ch in enumerate(_B64_ALPHABET)}


class _Reject(Exception):
    """Internal: the body is not an envelope."""


def go_trim_space(text: str) -> str:
    start = 0
    end = len(text)
    while start < end and text[start] in GO_TRIM_SET:
        start += 1
    while end > start and text[end - 1] in GO_TRIM_SET:
        end -= 1
    return text[start:end]


def go_atoi(text: str) -> int:
    """strconv.ParseInt(text, 10, 64): sign, ASCII digits, int64 range."""
    if _DECIMAL.fullmatch(text) is None:
        raise _Reject
    value = int(text, 10)
    if value < INT64_MIN or value > INT64_MAX:
        raise _Reject
    return value


def go_std_base64_decode(text: str) -> bytes:
    """Go's base64.StdEncoding.DecodeString (non-strict) on text that has no
    CR/LF left: complete quanta of four, '=' only at the end of the last
    quantum (two or one of them), nothing after padding; the bits a short
    quantum leaves over are discarded whatever their value."""
    out = bytearray()
    i = 0
    n = len(text)
    while i < n:
        values: list[int] = []
        pad_seen = False
        while len(values) < 4:
            if i == n:
                # A quantum cut short without padding: corrupt.
                raise _Reject
            ch = text[i]
            i += 1
            if ch in _B64_VALUE:
                values.append(_B64_VALUE[ch])
                continue
            if ch != "=":
                raise _Reject
            # Padding: allowed only in the third or fourth position.
            if len(values) < 2:
                raise _Reject
            if len(values) == 2:
                if i == n or text[i] != "=":
                    raise _Reject
                i += 1
            pad_seen = True
            break
        if pad_seen and i != n:
            raise _Reject  # data after the padding
        bits = 0
        for v in values:
            bits = (bits << 6) | v
        bits <<= 6 * (4 - len(values))
        full = bits.to_bytes(3, "big")
        out += full[: len(values) - 1]
    return bytes(out)


@dataclass(frozen=True)
class ModelPart:
    sid: str
    mid: str
    seq: int
    total: int
    exp: int
    chunk: bytes


def model_parse(text: str) -> ModelPart | None:
    """WIRE.md §Parsing rules 1-7, one by one."""
    try:
        return _model_parse(text)
    except _Reject:
        return None


def _model_parse(text: str) -> ModelPart:
    trimmed = go_trim_space(text)  # rule 1
    match = _ENVELOPE.fullmatch(trimmed)  # rule 2
    if match is None:
        raise _Reject
    header, body = match.group(1), match.group(2)

    version = 0
    sid = ""
    mid = ""
    seq = 0
    total = 0
    exp = 0
    for element in header.split(","):  # rule 3
        if "=" not in element:
            raise _Reject
        key, value = element.split("=", 1)
        if key == "v":  # rule 4
            version = go_atoi(value)
        elif key == "sid":
            if _ID.fullmatch(value) is None:
                raise _Reject
            sid = value
        elif key == "mid":
            if _ID.fullmatch(value) is None:
                raise _Reject
            mid = value
        elif key == "seq":
            if "/" not in value:
                raise _Reject
            left, right = value.split("/", 1)
            seq = go_atoi(left)
            total = go_atoi(right)
        elif key == "exp":
            exp = go_atoi(value)
    # Rule 6.
    if version != 1:
        raise _Reject
    if sid == "" or mid == "":
        raise _Reject
    if not (1 <= seq <= total <= 64):
        raise _Reject
    # Rule 7.
    joined = "".join(ch for ch in body if ch not in _GO_REGEX_SPACE)
    chunk = go_std_base64_decode(joined)
    if len(chunk) == 0:
        raise _Reject
    return ModelPart(sid, mid, seq, total, exp, chunk)


# ---------------------------------------------------------------------------
# Assembler (WIRE.md §Deadlines and §Reassembly), literal.


class ModelError(Exception):
    """Carries the name of the Go error the model returned."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def model_expired(exp: int, now: float) -> bool:
    """WIRE.md §Deadlines: exp > 0 and the current whole unix second is after exp."""
    whole_second = int(now // 1)
    return exp > 0 and whole_second > exp


@dataclass
class _ModelPending:
    total: int
    exp: int
    first_seen: float
    chunks: dict[int, bytes] = field(default_factory=dict)
    size: int = 0


@dataclass
class ModelAssembler:
    max_pending_per_peer: int = 8
    max_message_bytes: int = 16 * 1024 * 1024
    max_total_bytes: int = 64 * 1024 * 1024
    timeout: float = 600.0
    pending: dict[str, _ModelPending] = field(default_factory=dict)
    per_peer: dict[str, int] = field(default_factory=dict)
    total_bytes: int = 0

    def _remove(self, key: str) -> None:
        state = self.pending.pop(key)
        self.total_bytes -= state.size
        peer = key.split("/", 1)[0]
        self.per_peer[peer] -= 1
        if self.per_peer[peer] == 0:
            del self.per_peer[peer]

    def add(self, peer: str, part: ModelPart, now: float) -> bytes | None:
        # Step 1: expiry, nothing touched.
        if model_expired(part.exp, now):
            raise ModelError("expired")
        # Step 2: single part bypass.
        if part.total == 1:
            if len(part.chunk) > self.max_message_bytes:
                raise ModelError("too_large")
            return part.chunk
        # Step 3: lazy GC over everything pending.
        for key in list(self.pending):
            state = self.pending[key]
            if model_expired(state.exp, now) or now - state.first_seen > self.timeout:
                self._remove(key)
        # Step 4: lookup / create.
        key = peer + "/" + part.sid + "/" + part.mid
        state = self.pending.get(key)
        if state is None:
            if self.per_peer.get(peer, 0) >= self.max_pending_per_peer:
                raise ModelError("overflow")
            state = _ModelPending(part.total, part.exp, now)
            self.pending[key] = state
            self.per_peer[peer] = self.per_peer.get(peer, 0) + 1
        # Step 5: total mismatch.
        if part.total != state.total:
            self._remove(key)
            raise ModelError("part_count")
        # Step 6: duplicate seq.
        if part.seq in state.chunks:
            return None
        # Step 7: byte bounds.
        if (
            state.size + len(part.chunk) > self.max_message_bytes
            or self.total_bytes + len(part.chunk) > self.max_total_bytes
        ):
            self._remove(key)
            raise ModelError("too_large")
        # Step 8: store; complete?
        state.chunks[part.seq] = part.chunk
        state.size += len(part.chunk)
        self.total_bytes += len(part.chunk)
        if len(state.chunks) < state.total:
            return None
        payload = b"".join(state.chunks[i] for i in range(1, state.total + 1))
        self._remove(key)
        return payload
