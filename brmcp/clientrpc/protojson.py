"""The JSON that brclient's clientrpc puts on the wire, reproduced byte for byte.

Two layers are involved (docs/clientrpc.md §Requests and responses, §Encoding):

* **protojson** encodes the ``params``/``result`` messages: lowerCamelCase keys,
  64-bit integers as JSON strings, ``bytes`` as standard padded base64, enums by
  name, default values omitted, doubles in Go's shortest form (``0.0001``,
  ``0.00001``, ``1e-7``, never ``1.0``).
* Go's ``encoding/json`` ``Encoder`` writes the JSON-RPC envelope compactly with
  HTML escaping (``<`` → ``\\u003c``, ``>``, ``&``, U+2028, U+2029) and a trailing
  newline; each such line is one binary websocket message.

:func:`dumps` / :func:`frame` produce exactly that text; the ``decode_*`` helpers
are the lenient readers the client applies to server output (both JSON and
proto field names, numbers or strings for 64-bit integers, any base64 flavour).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

__all__ = [
    "ProtojsonError",
    "decode_bool",
    "decode_bytes",
    "decode_double",
    "decode_int",
    "decode_string",
    "dumps",
    "encode_bytes",
    "encode_int64",
    "field",
    "format_double",
    "frame",
]

_INT_TEXT = re.compile(r"-?[0-9]+")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_HTML_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


class ProtojsonError(ValueError):
    """A value in a clientrpc message does not have the protojson shape its field needs."""


# -- encoding ------------------------------------------------------------------------


def encode_int64(value: int) -> str:
    """A 64-bit integer as protojson writes it: a decimal JSON string (docs/clientrpc.md §Encoding)."""
    return str(int(value))


def encode_bytes(value: bytes) -> str:
    """``bytes`` as protojson writes them: standard base64 with ``=`` padding."""
    return base64.b64encode(value).decode("ascii")


def format_double(value: float) -> str:
    """A double in the text Go's protojson (and ``encoding/json``) writes.

    Shortest round-trip digits, plain decimal notation for 1e-6 <= |x| < 1e21
    and exponent notation (``1e-7``, ``1.5e+21``) outside it; ``1.0`` is ``1``.
    NaN and infinities are the JSON strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` (quotes included in the returned text).
    """
    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    shortest = repr(float(value))
    magnitude = abs(value)
    if 1e-6 <= magnitude < 1e21:
        text = format(Decimal(shortest), "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    mantissa, _, exponent = shortest.partition("e")
    if mantissa.endswith(".0"):
        mantissa = mantissa[:-2]
    sign = "-" if exponent.startswith("-") else "+"
    # Outside [1e-6, 1e21) the exponent has at least two digits; Go prints
    # e-07 and protojson trims that one leading zero (e-7), as repr's digits do.
    digits = exponent.lstrip("+-").lstrip("0") or "0"
    return f"{mantissa}e{sign}{digits}"


def _encode_string(text: str) -> str:
    out = json.dumps(text, ensure_ascii=False).translate(_HTML_ESCAPES)
    if _LONE_SURROGATE.search(out):
        out = _LONE_SURROGATE.sub("\\\\ufffd", out)
    return out


def _encode(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(_encode_string(value))
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif value is None:
        out.append("null")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(format_double(value))
    elif isinstance(value, Mapping):
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(_encode_string(str(key)))
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as clientrpc JSON")


def dumps(value: Any) -> str:
    """Compact JSON exactly as Go's ``json.Encoder`` writes it (key order kept,
    HTML-escaped strings, Go float text), without the trailing newline."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def frame(message: Mapping[str, Any]) -> bytes:
    """One JSON-RPC message as a websocket payload: :func:`dumps` plus ``\\n``,
    UTF-8 (docs/clientrpc.md §Transport)."""
    return (dumps(message) + "\n").encode("utf-8")


# -- lenient decoding (server output) ---------------------------------------------------


def field(params: Mapping[str, Any], json_name: str, proto_name: str | None = None) -> Any:
    """The value of a field under its JSON name or its proto name (protojson
    accepts both); ``None`` when absent or ``null``."""
    value = params.get(json_name)
    if value is None and proto_name is not None:
        value = params.get(proto_name)
    return value


def decode_string(value: Any, name: str) -> str:
    """A protojson ``string``; absent is ``""``."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ProtojsonError(f"field {name}: expected a string, got {type(value).__name__}")
    return value


def decode_bool(value: Any, name: str) -> bool:
    """A protojson ``bool``; absent is ``False``."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ProtojsonError(f"field {name}: expected a boolean, got {type(value).__name__}")
    return value


def decode_int(value: Any, name: str, *, signed: bool = False, bits: int = 64) -> int:
    """A protojson integer: a JSON number or a decimal string (64-bit integers are
    strings on the wire); absent is ``0``. Out-of-range values raise."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ProtojsonError(f"field {name}: expected an integer, got a boolean")
    if isinstance(value, int):
        result = value
    elif (isinstance(value, float) and value.is_integer()) or (
        isinstance(value, str) and _INT_TEXT.fullmatch(value)
    ):
        result = int(value)
    else:
        raise ProtojsonError(f"field {name}: expected an integer, got {value!r}")
    if signed:
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    else:
        low, high = 0, (1 << bits) - 1
    if not low <= result <= high:
        raise ProtojsonError(f"field {name}: {result} is out of range")
    return result


def decode_double(value: Any, name: str) -> float:
    """A protojson ``double``: a JSON number, a numeric string, or ``"NaN"``/
    ``"Infinity"``/``"-Infinity"``; absent is ``0.0``."""
    if value is None:
        return 0.0
    if isinstance(value, bool):
        raise ProtojsonError(f"field {name}: expected a number, got a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        if value in special:
            return special[value]
        try:
            return float(value)
        except ValueError:
            pass
    raise ProtojsonError(f"field {name}: expected a number, got {value!r}")


def decode_bytes(value: Any, name: str) -> bytes:
    """protojson ``bytes``: standard or URL-safe base64, padded or not; absent is ``b""``."""
    if value is None:
        return b""
    if not isinstance(value, str):
        raise ProtojsonError(f"field {name}: expected a base64 string, got {type(value).__name__}")
    text = value.rstrip("=")
    if "-" in text or "_" in text:
        text = text.replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtojsonError(f"field {name}: invalid base64 {value[:60]!r}") from exc
