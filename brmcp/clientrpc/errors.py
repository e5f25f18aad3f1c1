"""Exceptions of the clientrpc client. Every message is one line and names the
file, address or method involved, so it can be shown to an operator as is."""

from __future__ import annotations

__all__ = [
    "ClientrpcConfigError",
    "ClientrpcConnectError",
    "ClientrpcConnectionError",
    "ClientrpcConnectionLost",
    "ClientrpcError",
    "ClientrpcNotConnected",
    "ClientrpcProtocolError",
    "RPCError",
    "StatusServerError",
    "StatusServerUnavailable",
]


class ClientrpcError(Exception):
    """Base class of every error raised by :mod:`brmcp.clientrpc`."""


class ClientrpcConfigError(ClientrpcError, ValueError):
    """Unusable configuration: a missing or unreadable certificate/key file, a
    file without the expected PEM block, a malformed ``brrpcurl`` or config file.
    The message names the offending file, key or URL."""


class ClientrpcConnectionError(ClientrpcError, ConnectionError):
    """Base class of the connection-state errors below."""


class ClientrpcConnectError(ClientrpcConnectionError):
    """One attempt to connect to brclient failed (refused, TLS or HTTP
    rejection, timeout). ``url`` is the address; ``reason`` the one-line cause.
    The client keeps retrying with backoff; this is what it logs and what
    :meth:`Client.wait_connected` raises after its timeout."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"brclient clientrpc at {url}: {reason}")
        self.url = url
        self.reason = reason


class ClientrpcNotConnected(ClientrpcConnectionError):
    """No connection to brclient right now; nothing was sent. Safe to retry later."""

    def __init__(self, message: str = "brclient not connected") -> None:
        super().__init__(message)


class ClientrpcConnectionLost(ClientrpcConnectionError):
    """The connection dropped after the request was sent and before its reply:
    brclient may or may not have carried it out (the Go client's "run done")."""


class ClientrpcProtocolError(ClientrpcError):
    """brclient answered with a result that does not have the documented shape."""


class RPCError(ClientrpcError):
    """brclient answered a request with a JSON-RPC error object.

    ``code`` is the JSON-RPC code (-32603 for handler errors and unknown
    methods, -32602 for undecodable params, 10000 "EOF" for a stream end;
    docs/clientrpc.md §Error replies), ``message`` brclient's text (e.g. ``user <x> not found``),
    ``method`` the request's method. ``str()`` is the message alone, as the Go
    client's error text is.
    """

    def __init__(self, method: str, code: int, message: str, data: object = None) -> None:
        super().__init__(message)
        self.method = method
        self.code = code
        self.message = message
        self.data = data

    def __repr__(self) -> str:
        return f"RPCError(method={self.method!r}, code={self.code}, message={self.message!r})"


class StatusServerError(ClientrpcError):
    """A request to brclientd's status server (``brstatusurl``) failed: it
    answered with a status other than 200/204 (``status`` is that code,
    ``detail`` the first 512 bytes of its body on one line), or it could not
    be reached (``status`` is None, ``detail`` the cause). ``url`` is the
    endpoint. The message is one line naming the endpoint."""

    def __init__(self, url: str, status: int | None, detail: str) -> None:
        what = f"HTTP {status}" if status is not None else "unreachable"
        super().__init__(
            f"brclientd status server {url}: {what}: {detail}"
            if detail
            else f"brclientd status server {url}: {what}"
        )
        self.url = url
        self.status = status
        self.detail = detail


class StatusServerUnavailable(StatusServerError):
    """This host has no status server configured (``brstatusurl`` is not set
    in the bot config): KX suggestions cannot be sent. Nothing was sent."""

    def __init__(self, message: str) -> None:
        ClientrpcError.__init__(self, message)
        self.url = ""
        self.status = None
        self.detail = message
