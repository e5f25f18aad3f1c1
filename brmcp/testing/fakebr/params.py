"""Strict protojson decoding of request params, as brclient's server applies it
(``protojson.UnmarshalOptions{}``; docs/clientrpc.md §Encoding).

Accepted: JSON or proto field names; 64-bit integers as numbers or strings;
bytes in standard or URL-safe base64, padded or not; enums by name or number;
``null`` for "unset". Rejected (-32602 ``unable to decode params: ...``):
unknown fields, duplicate fields, values of the wrong type or out of range,
and params that are missing, ``null`` or not an object.

The error texts follow protobuf-go's shape
(``proto: (line L:C): unknown field "x"``); the position is computed on the
compact re-encoding of the params, which equals the original for the compact
JSON clients send.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...clientrpc.protojson import dumps

__all__ = ["MESSAGES", "Field", "Message", "Pairs", "ParamsError", "decode_params", "plain"]

_INT_TEXT = re.compile(r"-?(0|[1-9][0-9]*)")
_RANGES = {
    "uint64": (0, (1 << 64) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "uint32": (0, (1 << 32) - 1),
}


class Pairs(list[tuple[str, Any]]):
    """A JSON object as parsed with ``object_pairs_hook=Pairs``: its members in
    order, duplicates kept (Go's decoder sees them; a dict would hide them)."""


class ParamsError(ValueError):
    """The params do not decode into the request message; ``str()`` is the
    text after ``unable to decode params: ``."""


@dataclass(frozen=True, slots=True)
class Field:
    """One proto field: ``kind`` is a scalar type name, ``"enum"`` (with
    ``enum`` name → number) or ``"message"`` (with ``message``)."""

    proto_name: str
    json_name: str
    kind: str
    enum: Mapping[str, int] = field(default_factory=dict)
    message: Message | None = None


@dataclass(frozen=True, slots=True)
class Message:
    name: str
    fields: tuple[Field, ...] = ()

    def lookup(self, key: str) -> Field | None:
        for f in self.fields:
            if key in (f.json_name, f.proto_name):
                return f
        return None


_MESSAGE_MODE = {"MESSAGE_MODE_NORMAL": 0, "MESSAGE_MODE_ME": 1}
_RM_PRIVATE_MESSAGE = Message(
    "RMPrivateMessage",
    (Field("message", "message", "string"), Field("mode", "mode", "enum", enum=_MESSAGE_MODE)),
)
_EMPTY = Message("Empty")
_STREAM = (Field("unacked_from", "unackedFrom", "uint64"),)

#: Request messages of the methods the fake serves, by ``Service.Method``.
MESSAGES: dict[str, Message] = {
    "VersionService.Version": Message("VersionRequest"),
    "ChatService.UserPublicIdentity": Message("PublicIdentityReq"),
    "ChatService.UserNick": Message(
        "UserNickRequest", (Field("uid", "uid", "bytes"), Field("hex_uid", "hexUid", "string"))
    ),
    "ChatService.PM": Message(
        "PMRequest",
        (Field("user", "user", "string"), Field("msg", "msg", "message", message=_RM_PRIVATE_MESSAGE)),
    ),
    "ChatService.PMStream": Message("PMStreamRequest", _STREAM),
    "ChatService.AckReceivedPM": Message("AckRequest", (Field("sequence_id", "sequenceId", "uint64"),)),
    "ChatService.MediateKX": Message(
        "MediateKXRequest", (Field("mediator", "mediator", "string"), Field("target", "target", "string"))
    ),
    "ChatService.KXStream": Message("KXStreamRequest", _STREAM),
    "ChatService.AckKXCompleted": Message("AckRequest", (Field("sequence_id", "sequenceId", "uint64"),)),
    "PaymentsService.TipUser": Message(
        "TipUserRequest",
        (
            Field("user", "user", "string"),
            Field("dcr_amount", "dcrAmount", "double"),
            Field("max_attempts", "maxAttempts", "int32"),
        ),
    ),
    "PaymentsService.TipStream": Message("TipStreamRequest", _STREAM),
    "PaymentsService.AckTipReceived": Message("AckRequest", (Field("sequence_id", "sequenceId", "uint64"),)),
    "PaymentsService.TipProgress": Message("TipProgressRequest", _STREAM),
    "PaymentsService.AckTipProgress": Message("AckRequest", (Field("sequence_id", "sequenceId", "uint64"),)),
}


def _error(column: int, text: str) -> ParamsError:
    return ParamsError(f"proto: (line 1:{column}): {text}")


def _unexpected(column: int, value: Any) -> ParamsError:
    """protojson's syntax error for an unexpected token: its raw text, just
    the opening bracket for an array or object."""
    if isinstance(value, list):
        token = "["
    elif isinstance(value, dict):
        token = "{"
    else:
        token = _raw(value)[:20]
    return ParamsError(f"proto: syntax error (line 1:{column}): unexpected token {token}")


def _raw(value: Any) -> str:
    return dumps(value)


def _scalar(f: Field, value: Any, column: int) -> Any:
    def bad() -> ParamsError:
        return _error(column, f"invalid value for {f.kind} field {f.json_name}: {_raw(value)}")

    kind = f.kind
    if kind == "string":
        if not isinstance(value, str):
            raise bad()
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad()
        return value
    if kind in _RANGES:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            number = value
        elif (isinstance(value, float) and value.is_integer()) or (
            isinstance(value, str) and _INT_TEXT.fullmatch(value)
        ):
            number = int(value)
        else:
            raise bad()
        low, high = _RANGES[kind]
        if not low <= number <= high:
            raise bad()
        return number
    if kind == "double":
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
            if value in special:
                return special[value]
            try:
                return float(value)
            except ValueError:
                raise bad() from None
        raise bad()
    if kind == "bytes":
        if not isinstance(value, str):
            raise bad()
        text = value.rstrip("=").replace("-", "+").replace("_", "/")
        try:
            return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise bad() from None
    if kind == "enum":
        if isinstance(value, str):
            if value not in f.enum:
                raise _error(column, f"invalid value for enum field {f.json_name}: {_raw(value)}")
            return f.enum[value]
        if isinstance(value, int) and not isinstance(value, bool) and -(1 << 31) <= value < (1 << 31):
            return value
        raise bad()
    raise AssertionError(f"unknown field kind {kind}")


def _message(msg: Message, pairs: Any, column: int) -> dict[str, Any]:
    if not isinstance(pairs, Pairs):
        raise _unexpected(column, plain(pairs))
    out: dict[str, Any] = {}
    seen: set[str] = set()
    offset = column + 1  # just past "{"
    for index, (key, value) in enumerate(pairs):
        if index:
            offset += 1  # ","
        key_column = offset
        key_text = _raw(key)
        value_column = key_column + len(key_text) + 1
        f = msg.lookup(key)
        if f is None:
            raise _error(key_column, f"unknown field {key_text}")
        if f.proto_name in seen:
            raise _error(key_column, f"duplicate field {key_text}")
        seen.add(f.proto_name)
        if value is not None:
            if f.kind == "message":
                assert f.message is not None
                out[f.proto_name] = _message(f.message, value, value_column)
            else:
                out[f.proto_name] = _scalar(f, plain(value), value_column)
        offset = value_column + len(_raw(plain(value)))
    return out


def plain(value: Any) -> Any:
    """``value`` with every :class:`Pairs` turned into a dict (last duplicate wins)."""
    if isinstance(value, Pairs):
        return {k: plain(v) for k, v in value}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def decode_params(method: str, params: Any, *, present: bool = True) -> dict[str, Any]:
    """Decode ``params`` for ``method`` (a key of :data:`MESSAGES`).

    ``params`` is the value parsed with ``object_pairs_hook=Pairs`` (so
    duplicate keys are visible); ``present`` is False when the request had no
    ``params`` member. Returns the set fields by proto name (nested messages as
    dicts). Raises :class:`ParamsError`.
    """
    msg = MESSAGES[method]
    if not present:
        raise _error(1, "unexpected EOF")
    if params is None:
        raise _unexpected(1, None)
    return _message(msg, params, 1)
