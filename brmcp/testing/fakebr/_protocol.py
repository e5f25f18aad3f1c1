"""The clientrpc protocol as brclient speaks it, for the fake: error codes,
the stream and ack methods per replay-log kind, the bound services, method
names with their decimal stream suffix, the JSON-RPC envelope, Go's HTTP
error and Basic-auth parsing, gorilla's Origin check, and brclient's texts
for amounts (docs/clientrpc.md §Transport, §Basic auth, §Requests and
responses, §Error texts)."""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from .params import MESSAGES, Pairs

__all__ = [
    "CODE_EOF",
    "CODE_INTERNAL",
    "CODE_INVALID_PARAMS",
    "KIND_KX",
    "KIND_PM",
    "KIND_TIP_PROGRESS",
    "KIND_TIP_RECEIVED",
    "RPCFault",
]

CODE_EOF = 10000
CODE_INVALID_PARAMS = -32602
CODE_INTERNAL = -32603

#: Replay-log kinds (brclient's replaymsglog prefixes).
KIND_PM = "pm"
KIND_TIP_RECEIVED = "tipstream"
KIND_TIP_PROGRESS = "tipprogress"
KIND_KX = "kx"

STREAMS = {
    "ChatService.PMStream": KIND_PM,
    "PaymentsService.TipStream": KIND_TIP_RECEIVED,
    "PaymentsService.TipProgress": KIND_TIP_PROGRESS,
    "ChatService.KXStream": KIND_KX,
}
ACKS = {
    "ChatService.AckReceivedPM": KIND_PM,
    "PaymentsService.AckTipReceived": KIND_TIP_RECEIVED,
    "PaymentsService.AckTipProgress": KIND_TIP_PROGRESS,
    "ChatService.AckKXCompleted": KIND_KX,
}
#: Services brclient binds (docs/clientrpc.md §Other services); methods the fake lacks are "unknown method".
_BOUND_SERVICES = frozenset(
    {
        "VersionService",
        "ChatService",
        "PostsService",
        "PaymentsService",
        "GCService",
        "ResourcesService",
        "ContentService",
    }
)
# Go's regexp: \w and \d are ASCII only.
_SUFFIX = re.compile(r"([0-9A-Za-z_]+\.[0-9A-Za-z_]+)\[([0-9]+)\]")
_ENVELOPE_KEYS = ("jsonrpc", "id", "params", "result", "error", "method")


class RPCFault(Exception):
    """A JSON-RPC error the fake answers with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def pad16(data: bytes) -> bytes:
    """brclient's pong payload: the ping payload zero-padded or truncated to 16 bytes."""
    return data[:16].ljust(16, b"\0")


def echo_id(raw: Any) -> Any:
    """The id as Go echoes it: numbers pass through a float64."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int):
        return raw if abs(raw) <= 1 << 53 else float(raw)
    return raw


def go_float(value: float) -> str:
    """Go's ``%v`` of a float64 (shortest repr; ``NaN``, ``+Inf``, ``-Inf``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def go_percent_f(value: float) -> str:
    """Go's ``%f`` of a float64: six decimals; ``NaN``, ``+Inf``, ``-Inf``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.6f}"


def method_name(method: str) -> str:
    """Strip a decimal stream suffix and check ``Service.Method``; raises
    :class:`RPCFault` for malformed or unknown names."""
    match = _SUFFIX.search(method)
    name = match.group(1) if match else method
    service, dot, _ = name.partition(".")
    if not dot:
        raise RPCFault(CODE_INTERNAL, "method is not Service.Method")
    if service not in _BOUND_SERVICES:
        raise RPCFault(CODE_INTERNAL, "unknown service")
    if name not in MESSAGES:
        raise RPCFault(CODE_INTERNAL, "unknown method")
    return name


def envelope_fields(value: Any) -> dict[str, Any] | None:
    """The JSON-RPC envelope fields, matched case-insensitively (Go's
    encoding/json), the last duplicate winning; None for a non-object."""
    if not isinstance(value, Pairs):
        return None
    env: dict[str, Any] = {}
    for key, item in value:
        folded = key.lower()
        if folded in _ENVELOPE_KEYS:
            env[folded] = item
    return env


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def http_error(status: int, text: str) -> web.Response:
    """Go's ``http.Error``: the text plus a newline, as plain text."""
    resp = web.Response(status=status, text=text + "\n")
    resp.headers["Content-Type"] = "text/plain; charset=utf-8"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


def basic_auth(header: str | None) -> tuple[str, str] | None:
    """Go's ``Request.BasicAuth`` parsing."""
    if header is None or len(header) < 6 or header[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(header[6:], validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(":")
    if not sep:
        return None
    return user, password


def origin_ok(request: web.Request) -> bool:
    """gorilla's same-origin check with brclient's port-stripping quirk: a host
    that carries a port is compared whole, a port-less one becomes ``""``."""
    origin = request.headers.get("Origin")
    if origin is None or origin == "null" or origin.startswith("file://"):
        return True

    def strip(host: str) -> str:
        return host if re.search(r":[0-9]*$", host) else ""

    try:
        origin_host = urlsplit(origin).netloc
    except ValueError:
        return False
    return strip(origin_host).lower() == strip(request.host).lower()
