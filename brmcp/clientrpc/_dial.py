"""Dialling brclient's clientrpc: the ``brrpcurl`` rules, the Basic-auth
header, the websocket handshake options, and a one-line reason for each way a
dial fails (docs/clientrpc.md §Transport, §Mutual TLS, §Basic auth).

* URL ``wss://host:port/ws`` (the path must be ``/ws``; docs/clientrpc.md
  §Transport); the server certificate file is the only CA and the client
  pair is presented (:func:`~brmcp.clientrpc.client_ssl_context`); an
  ``Authorization: Basic base64(user:pass)`` header is always sent, as the Go
  client does (``Basic Og==`` when both are empty; docs/clientrpc.md §Basic auth).
* ``websockets``' own pings are off (its 4-byte pings never match brclient's
  16-byte pongs, so the connection sends its own; docs/clientrpc.md
  §Keepalive); no message-size cap (BR messages reach ~18 MiB;
  docs/clientrpc.md §Transport), no compression, no proxy.
* websockets logs handshake headers at debug level: it gets a logger that
  redacts the Authorization value (SECURITY.md §2).
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import ssl
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidMessage, InvalidStatus

from .._ops.redact import RedactingLogger
from .config import BotConfig
from .errors import ClientrpcConfigError, ClientrpcConnectError

__all__ = ["_describe", "basic_auth", "check_bot_config", "dial_brclient", "parse_url"]

#: websockets' handshake log with the Basic-auth header's value redacted (SECURITY.md).
_WS_LOG = RedactingLogger(logging.getLogger("websockets.client"))

#: The certificate keys of a bot config and what each must name.
_CERT_KEYS = (
    ("servercertpath", "the path of brclient's rpc.cert (e.g. ~/.brclient/rpc.cert)"),
    ("clientcertpath", "the path of brclient's rpc-client.cert (e.g. ~/.brclient/rpc-client.cert)"),
    ("clientkeypath", "the path of brclient's rpc-client.key (e.g. ~/.brclient/rpc-client.key)"),
)
#: OpenSSL reasons for a peer that answered the ClientHello with something
#: that is not TLS (typically a plain-HTTP server).
NOT_TLS_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL", "RECORD_LAYER_FAILURE"}
)


def parse_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of a ``wss://host:port/ws`` URL (port 443 when absent);
    :class:`ClientrpcConfigError` naming the URL otherwise."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ClientrpcConfigError(f"brrpcurl {url!r}: {exc}") from None
    if parts.scheme != "wss":
        raise ClientrpcConfigError(f"brrpcurl {url!r}: the scheme must be wss (wss://host:port/ws)")
    if not parts.hostname:
        raise ClientrpcConfigError(f"brrpcurl {url!r}: no host (wss://host:port/ws)")
    if parts.path != "/ws":
        raise ClientrpcConfigError(
            f"brrpcurl {url!r}: the path must be exactly /ws (brclient serves the websocket only there)"
        )
    return parts.hostname, port or 443


def basic_auth(rpcuser: str, rpcpass: str) -> str:
    """The ``Authorization`` header value, sent even when both are empty (``Basic Og==``)."""
    token = base64.b64encode(f"{rpcuser}:{rpcpass}".encode()).decode("ascii")
    return f"Basic {token}"


def check_bot_config(cfg: BotConfig) -> None:
    """:class:`ClientrpcConfigError` (one line, naming the key) when a bot
    config lacks ``brrpcurl`` or one of the three certificate paths."""
    if not cfg.brrpcurl:
        raise ClientrpcConfigError("bot config: brrpcurl is required")
    for key, what in _CERT_KEYS:
        if not getattr(cfg, key).strip():
            raise ClientrpcConfigError(f"bot config: {key} is missing or empty; set it to {what}")


async def dial_brclient(
    url: str,
    *,
    ssl_context: ssl.SSLContext,
    auth_header: str,
    open_timeout: float,
    close_timeout: float,
    host: str,
    server_cert: str | os.PathLike[str],
    client_cert: str | os.PathLike[str],
) -> ClientConnection:
    """Open the websocket; :class:`ClientrpcConnectError` with a one-line
    reason (see :func:`_describe`) on any failure."""
    try:
        return await connect(
            url,
            ssl=ssl_context,
            additional_headers={"Authorization": auth_header},
            user_agent_header=None,
            compression=None,
            proxy=None,
            max_size=None,
            ping_interval=None,
            ping_timeout=None,
            open_timeout=open_timeout,
            close_timeout=close_timeout,
            logger=_WS_LOG,
        )
    except Exception as exc:
        reason = _describe(
            exc, host=host, server_cert=server_cert, client_cert=client_cert, open_timeout=open_timeout
        )
        raise ClientrpcConnectError(url, reason) from exc


def _describe(
    exc: BaseException,
    *,
    host: str,
    server_cert: str | os.PathLike[str],
    client_cert: str | os.PathLike[str],
    open_timeout: float,
) -> str:
    """A one-line reason for a failed dial, naming the file or setting to check."""
    server_cert = os.fspath(server_cert)
    client_cert = os.fspath(client_cert)
    cause: BaseException = exc
    while isinstance(cause, InvalidMessage | InvalidHandshake) and cause.__cause__ is not None:
        if isinstance(cause, InvalidStatus):
            break
        cause = cause.__cause__
    if isinstance(cause, InvalidStatus):
        status = cause.response.status_code
        phrase = cause.response.reason_phrase
        if status in (401, 403):
            return f"HTTP {status} {phrase}: Basic auth rejected (check rpcuser/rpcpass)"
        return f"HTTP {status} {phrase}: no clientrpc websocket at this URL"
    if isinstance(cause, ssl.SSLCertVerificationError):
        return (
            f"server certificate not trusted ({cause.verify_message}); "
            f"servercertpath {server_cert} must be this brclient's rpc.cert"
        )
    if isinstance(cause, ssl.SSLError) and _not_tls(cause):
        return (
            f"TLS failed ({cause.reason}): the server at this address does not speak TLS "
            "(a plain-HTTP port?); brrpcurl must be brclient's [clientrpc] jsonrpclisten address"
        )
    if isinstance(cause, ssl.SSLError):
        return (
            f"TLS failed ({cause.reason or cause}): brclient refused the client certificate "
            f"{client_cert}? it must be signed by brclient's rpc-ca.cert"
        )
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused (is brclient running with [clientrpc] jsonrpclisten on this address?)"
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve host {host!r}"
    if isinstance(cause, TimeoutError):
        return f"timed out after {open_timeout}s"
    if isinstance(cause, EOFError | ConnectionResetError | BrokenPipeError):
        return (
            "connection closed during the handshake (brclient may have refused the client "
            f"certificate {client_cert})"
        )
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    text = str(cause).splitlines()[0] if str(cause) else ""
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def _not_tls(exc: ssl.SSLError) -> bool:
    return (exc.reason or "").upper() in NOT_TLS_REASONS
