"""The client side of clientrpc's mutual TLS (docs/clientrpc.md §Mutual TLS).

brclient's ``rpc.cert`` is self-signed and is trusted as the only CA (pinning);
the client presents ``rpc-client.cert``/``rpc-client.key`` (Ed25519, signed by
``rpc-ca.cert``). TLS 1.2 is the minimum; hostnames are verified against the
certificate's SANs (``127.0.0.1``, ``localhost``, ...).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from .errors import ClientrpcConfigError

__all__ = ["client_ssl_context"]


def _read_pem(path: Path, role: str, marker: str, kind: str) -> str:
    if str(path) in ("", "."):
        raise ClientrpcConfigError(f"{role} is empty: it must name the {kind} file")
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        raise ClientrpcConfigError(f"{role} {path}: file not found") from None
    except IsADirectoryError:
        raise ClientrpcConfigError(f"{role} {path}: is a directory, not a file") from None
    except OSError as exc:
        reason = exc.strerror.lower() if exc.strerror else type(exc).__name__
        raise ClientrpcConfigError(f"{role} {path}: {reason}") from None
    if marker not in text:
        raise ClientrpcConfigError(f"{role} {path}: no PEM {kind} block in the file")
    return text


def client_ssl_context(
    server_cert: str | os.PathLike[str],
    client_cert: str | os.PathLike[str],
    client_key: str | os.PathLike[str],
) -> ssl.SSLContext:
    """An SSL context that trusts only ``server_cert`` and presents the client pair.

    Raises :class:`ClientrpcConfigError` with one line naming the file when a file
    is missing, unreadable, not PEM of the right kind, or when the key does not
    match the certificate.
    """
    server_path, cert_path, key_path = Path(server_cert), Path(client_cert), Path(client_key)
    server_pem = _read_pem(server_path, "servercertpath", "-----BEGIN CERTIFICATE-----", "certificate")
    _read_pem(cert_path, "clientcertpath", "-----BEGIN CERTIFICATE-----", "certificate")
    _read_pem(key_path, "clientkeypath", "PRIVATE KEY-----", "private key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    try:
        ctx.load_verify_locations(cadata=server_pem)
    except ssl.SSLError as exc:
        raise ClientrpcConfigError(
            f"servercertpath {server_path}: not a usable certificate ({exc.reason})"
        ) from None
    try:
        ctx.load_cert_chain(cert_path, key_path)
    except ssl.SSLError as exc:
        raise ClientrpcConfigError(_chain_error(cert_path, key_path, exc)) from None
    except OSError as exc:
        reason = exc.strerror.lower() if exc.strerror else type(exc).__name__
        raise ClientrpcConfigError(
            f"clientcertpath {cert_path} / clientkeypath {key_path}: {reason}"
        ) from None
    return ctx


def _chain_error(cert_path: Path, key_path: Path, exc: ssl.SSLError) -> str:
    reason = (exc.reason or str(exc)).upper()
    if "KEY_VALUES_MISMATCH" in reason:
        return f"clientkeypath {key_path}: key does not match the certificate in clientcertpath {cert_path}"
    # Tell which file is bad by loading each half against a known-good partner.
    if not _cert_loads(cert_path):
        return f"clientcertpath {cert_path}: not a usable certificate ({exc.reason})"
    return f"clientkeypath {key_path}: not a usable private key ({exc.reason})"


def _cert_loads(cert_path: Path) -> bool:
    try:
        pem = cert_path.read_text(encoding="ascii", errors="replace")
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem)
    except (ssl.SSLError, OSError, ValueError):
        return False
    return True
