"""The client side of clientrpc's mutual TLS (docs/clientrpc.md §Mutual TLS).

brclient's ``rpc.cert`` is self-signed and is trusted as the only CA (pinning);
the client presents ``rpc-client.cert``/``rpc-client.key`` (Ed25519, signed by
``rpc-ca.cert``). TLS 1.2 is the minimum; hostnames are verified against the
certificate's SANs (``127.0.0.1``, ``localhost``, ...).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from pathlib import Path

from .errors import ClientrpcConfigError

__all__ = ["HOSTNAME_MISMATCH", "check_server_certificate", "client_ssl_context"]

#: OpenSSL's ``X509_V_ERR_HOSTNAME_MISMATCH``: the certificate verifies but
#: does not name the host of the URL.
HOSTNAME_MISMATCH = 62


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
    ctx = _verifying_context(server_path)
    _read_pem(cert_path, "clientcertpath", "-----BEGIN CERTIFICATE-----", "certificate")
    _read_pem(key_path, "clientkeypath", "PRIVATE KEY-----", "private key")
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


def check_server_certificate(
    url: str,
    server_cert: str | os.PathLike[str],
    *,
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
    timeout: float = 5.0,
) -> bool:
    """Ask the server at ``url`` (``wss://host:port/ws``) for its certificate
    with one TLS handshake, trusting only ``server_cert``, and say whether it
    is that brclient: True when the certificate verifies, False when it
    cannot be told (nothing listens, a timeout after ``timeout`` seconds, a
    server that does not speak TLS). The client pair, when given and
    loadable, is presented so that brclient completes the handshake quietly;
    the server's certificate is checked before brclient checks ours, so the
    answer does not depend on it. Blocking: run it in a thread from async
    code.

    Raises :class:`ClientrpcConfigError` with one line when the server
    presents another certificate: ``servercertpath`` names another
    brclient's ``rpc.cert`` (or an old copy), or the URL's host is not one
    the certificate names; or when ``url`` or ``server_cert`` is unusable.
    """
    from ._dial import parse_url

    host, port = parse_url(url)
    server_path = Path(server_cert)
    ctx = _verifying_context(server_path)
    if client_cert is not None and client_key is not None:
        with contextlib.suppress(ssl.SSLError, OSError):
            ctx.load_cert_chain(client_cert, client_key)
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            ctx.wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.getpeercert()
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code == HOSTNAME_MISMATCH:
            raise ClientrpcConfigError(
                f"the brclient at {url} presents the certificate of servercertpath {server_path}, but it "
                f"does not name the host {host!r} ({exc.verify_message}): use a host it names in brrpcurl "
                "(127.0.0.1 or localhost for a local brclient)"
            ) from None
        raise ClientrpcConfigError(
            f"servercertpath {server_path} is not the certificate of the brclient at {url} (TLS: "
            f"{exc.verify_message}): it is another brclient's rpc.cert or an old copy; point servercertpath "
            f"at the rpc.cert of the brclient listening on {host}:{port} (in its app data directory, "
            "e.g. ~/.brclient/rpc.cert)"
        ) from None
    except ssl.SSLError as exc:
        # Not a certificate mismatch: the server speaks no TLS (cannot tell),
        # or its certificate passed (it is checked first) and it then refused
        # our client certificate, which the connection itself will report.
        from ._dial import NOT_TLS_REASONS

        return (exc.reason or "").upper() not in NOT_TLS_REASONS
    except OSError:
        return False
    return True


def _verifying_context(server_path: Path) -> ssl.SSLContext:
    """A TLS 1.2+ client context that trusts only brclient's certificate
    ``server_path`` (``servercertpath``), hostname checked. Raises
    :class:`ClientrpcConfigError` with one line naming the file."""
    pem = _read_pem(server_path, "servercertpath", "-----BEGIN CERTIFICATE-----", "certificate")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    try:
        ctx.load_verify_locations(cadata=pem)
    except ssl.SSLError as exc:
        raise ClientrpcConfigError(
            f"servercertpath {server_path}: not a usable certificate ({exc.reason})"
        ) from None
    return ctx
