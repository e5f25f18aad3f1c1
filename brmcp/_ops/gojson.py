"""JSON the way Go's ``encoding/json`` writes and reads it.

Files and texts shared with the Go reference (``mcpclient.json``,
``mcpspend.json``, the ``payment_required`` text) must be byte-compatible in
both directions, so this module mirrors the parts of ``encoding/json`` they
rely on (docs/interop.md §Go's JSON rules; WIRE.md §Payments, BRIDGE.md
§Settings, §Spend log and approvals):

* encoding: keys in the order given (Go struct order), HTML-safe escaping of
  ``<``, ``>``, ``&``, U+2028 and U+2029, short escapes for control
  characters, invalid code points (lone surrogates) written as U+FFFD,
  ``MarshalIndent`` layout with two spaces and no trailing newline;
* decoding into a struct: keys matched exactly first, then
  case-insensitively; unknown keys ignored; ``null`` leaves a field alone;
  a wrong type, or a non-integer number for an integer field, is an error;
  ``NaN``/``Infinity`` are not JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["GoJSONError", "Kind", "decode_struct", "decode_struct_list", "dumps", "html_escape", "loads"]

#: Field kinds understood by :func:`decode_struct`.
Kind = Literal["string", "int64", "bool", "strings"]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_HTML_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


class GoJSONError(ValueError):
    """Text that Go's decoder would reject for the target shape."""


def _clean(value: Any) -> Any:
    """Replace lone surrogates in strings (Go writes them as U+FFFD)."""
    if isinstance(value, str):
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in value)
        return value
    if isinstance(value, Mapping):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def dumps(value: Any, *, indent: bool = False) -> str:
    """Serialize ``value`` (dicts in insertion order, lists, str, int, bool,
    None) as Go's ``json.Marshal`` (``indent=False``) or
    ``json.MarshalIndent(v, "", "  ")`` (``indent=True``) would."""
    if indent:
        text = json.dumps(_clean(value), ensure_ascii=False, indent=2, separators=(",", ": "))
    else:
        text = json.dumps(_clean(value), ensure_ascii=False, separators=(",", ":"))
    return html_escape(text)


def html_escape(text: str) -> str:
    """Escape ``<``, ``>``, ``&``, U+2028 and U+2029 in JSON ``text`` as
    Go's ``encoding/json`` does by default (``\\u003c`` …). These characters
    can only occur inside string literals, so a global replacement is exact;
    the decoded value is unchanged."""
    if any(ch in text for ch in _HTML_ESCAPES):
        text = "".join(_HTML_ESCAPES.get(ch, ch) for ch in text)
    return text


def _reject_constant(name: str) -> Any:
    raise GoJSONError(f"invalid character {name[0]!r} looking for beginning of value")


def loads(text: str | bytes) -> Any:
    """Parse JSON text as Go does (no NaN/Infinity). Objects come back as
    lists of ``(key, value)`` pairs so duplicate keys and their order are
    kept; raises :class:`GoJSONError` with the parser's reason."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text, object_pairs_hook=_Pairs, parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise GoJSONError(f"invalid UTF-8: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise GoJSONError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise GoJSONError("exceeded max depth") from None


class _Pairs(list[tuple[str, Any]]):
    """A decoded JSON object: its members in document order."""


def _fold(key: str) -> str:
    # Go folds each rune as unicode.ToUpper(unicode.ToLower(r)); Python's
    # full-case mappings may expand a character, which Go's simple mapping
    # never does, so such characters are kept as they are.
    out = []
    for ch in key:
        low = ch.lower()
        up = low.upper() if len(low) == 1 else ch
        out.append(up if len(up) == 1 else ch)
    return "".join(out)


def _type_name(value: Any) -> str:
    if isinstance(value, _Pairs):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    return "null"


_KIND_TEXT: dict[str, str] = {
    "string": "a string",
    "bool": "true or false",
    "int64": "a whole number (64-bit)",
    "strings": "a list of strings",
}


def _convert(field: str, kind: Kind, value: Any, struct: str) -> Any:
    # Go's json.Unmarshal refuses the same values; the message is written for
    # the person who edited the file rather than in Go's "into Go value" terms.
    def wrong(found: Any) -> GoJSONError:
        return GoJSONError(f'"{field}" must be {_KIND_TEXT[kind]}, not {_type_name(found)}')

    if kind == "string":
        if isinstance(value, str):
            return _clean(value)
        raise wrong(value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise wrong(value)
    if kind == "int64":
        if isinstance(value, int) and not isinstance(value, bool) and _INT64_MIN <= value <= _INT64_MAX:
            return value
        raise wrong(value)
    # "strings": a []string; null elements become "".
    if not isinstance(value, list) or isinstance(value, _Pairs):
        raise wrong(value)
    items: list[str] = []
    for item in value:
        if item is None:
            items.append("")
        elif isinstance(item, str):
            items.append(_clean(item))
        else:
            raise GoJSONError(f'"{field}" must be a list of strings, but an element is {_type_name(item)}')
    return items


def decode_struct(value: Any, fields: Mapping[str, Kind], *, struct: str) -> dict[str, Any]:
    """Decode one parsed JSON value (from :func:`loads`) into a Go struct
    with the JSON field names and kinds in ``fields``.

    Returns the fields that were set (by their canonical names); fields that
    were absent or ``null`` are missing from the result. A ``null`` value
    yields ``{}``. Raises :class:`GoJSONError` when Go's ``json.Unmarshal``
    would return an error (``struct`` names the type in the message).
    """
    if value is None:
        return {}
    if not isinstance(value, _Pairs):
        raise GoJSONError(f"expected a JSON object of {struct}, not {_type_name(value)}")
    folded = {_fold(name): name for name in fields}
    out: dict[str, Any] = {}
    for key, item in value:
        name = key if key in fields else folded.get(_fold(key))
        if name is None or item is None:
            continue
        out[name] = _convert(name, fields[name], item, struct)
    return out


def decode_struct_list(value: Any, fields: Mapping[str, Kind], *, struct: str) -> list[dict[str, Any]]:
    """Decode a parsed JSON array of structs (``null`` is an empty list, a
    ``null`` element a zero struct). Raises :class:`GoJSONError`."""
    if value is None:
        return []
    if not isinstance(value, list) or isinstance(value, _Pairs):
        raise GoJSONError(f"expected a JSON array of {struct}, not {_type_name(value)}")
    out: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        try:
            out.append(decode_struct(item, fields, struct=struct))
        except GoJSONError as exc:
            raise GoJSONError(f"entry {index}: {exc}") from None
    return out
