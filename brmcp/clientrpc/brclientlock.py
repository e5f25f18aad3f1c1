"""The one-consumer-per-brclient lock (SECURITY.md "One process per identity").

The lock file itself is :mod:`brmcp._ops.lockfile`'s; taking it for a
brclient first asks the brclient for its TLS certificate, which is this
package's (:func:`~.tls.check_server_certificate`), so the function that
does both lives here, above the lock files, and they never import clientrpc.
"""

from __future__ import annotations

import os
from pathlib import Path

from .._ops.lockfile import HARNESS, FileLock, LockHeldError, acquire, brclient_lock_path
from .errors import ClientrpcConfigError
from .tls import check_server_certificate

__all__ = ["acquire_brclient"]


def acquire_brclient(
    server_cert: str | os.PathLike[str],
    url: str,
    *,
    what: str,
    error: type[Exception],
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
    check_certificate: bool = True,
) -> FileLock:
    """Take the one-consumer-per-brclient lock (:func:`~brmcp._ops.lockfile.brclient_lock_path`)
    for the program *what* (:data:`HARNESS` or ``"brmcp-bridge"``) driving
    the brclient at *url*, or raise *error* with one line.

    brclient's PM and tip-progress streams go to every program connected to
    it and its acks are global and destructive (docs/clientrpc.md §Acks and replay): a second
    consumer would ack, and so delete, events the first has not handled yet,
    and two harnesses would each credit every tip into their own ledger.
    Harnesses and bridges therefore share this one lock.

    The lock is named after ``server_cert``, so a certificate that belongs to
    another brclient would take (or find taken) that other brclient's lock.
    With ``check_certificate`` (the default) the server at *url* is asked
    for its certificate first (:func:`~.tls.check_server_certificate`,
    one TLS handshake of at most 5 s, presenting ``client_cert``/``client_key``
    when given): a server that presents another certificate is refused,
    naming the file, before any lock is taken. When the server cannot be
    reached the lock is taken as usual; if it is held by a program that
    recorded another URL, the message says that ``servercertpath`` may name
    that other brclient's certificate rather than blaming an unrelated
    program. Blocking: run it in a thread from async code.

    Raises:
        error: the server at *url* presents another certificate than
            ``server_cert`` (the file and the URL are named); another
            program holds the lock (its kind and pid are named, with why two
            cannot share a brclient); brclient's certificate cannot be read;
            or the lock file cannot be created.
    """
    verified = False
    if check_certificate:
        try:
            verified = check_server_certificate(
                url, server_cert, client_cert=client_cert, client_key=client_key
            )
        except ClientrpcConfigError as exc:
            raise error(str(exc)) from None
    try:
        path = brclient_lock_path(server_cert)
    except OSError as exc:
        raise error(f"cannot read brclient's certificate {os.fspath(server_cert)}: {exc}") from None
    try:
        return acquire(path, what=what, detail=f"brclient at {url}")
    except LockHeldError as exc:
        raise error(_held_message(exc, path, url, what, os.fspath(server_cert), verified)) from None
    except OSError as exc:
        raise error(f"cannot create the brclient lock {path}: {exc}") from None


def _held_message(exc: LockHeldError, path: Path, url: str, what: str, cert: str, verified: bool) -> str:
    """The one line for a brclient lock held by another program."""
    holder = exc.holder.get("what")
    detail = exc.holder.get("detail")
    holder_url = detail.removeprefix("brclient at ") if isinstance(detail, str) else ""
    if holder_url and holder_url != url and not verified:
        # The lock is named after the certificate, and the holder drives a
        # brclient at another address: most likely servercertpath names that
        # brclient's certificate, not this one's.
        other = (
            "harness" if holder == HARNESS else holder if isinstance(holder, str) and holder else "program"
        )
        return (
            f"another {other} (pid {exc.pid}) holds the lock of the brclient whose certificate is "
            f"servercertpath {cert}, and it drives the brclient at {holder_url}, not {url}: if these are two "
            f"brclients, servercertpath names the other one's rpc.cert; point it at the rpc.cert of the "
            f"brclient at {url} (the brclient there could not be asked for its certificate; lock {path})"
        )
    if what == HARNESS and holder == HARNESS:
        return (
            f"another harness (pid {exc.pid}) is already serving the brclient at {url}; two "
            "harnesses on one brclient would both consume its tips and PMs (brclient's acks are "
            "global), crediting callers' tips to the wrong ledger: stop the other one first "
            f"(lock {path})"
        )
    other = "harness" if holder == HARNESS else holder if isinstance(holder, str) and holder else "program"
    return (
        f"another {other} (pid {exc.pid}) is already using the brclient at {url}; two processes on one "
        "brclient would each consume the other's PMs and tips (brclient's acks are global, so each "
        f"deletes events the other has not handled yet): stop the other one first (lock {path})"
    )
