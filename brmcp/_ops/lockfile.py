"""One process per identity: exclusive lock files that name their holder
(SECURITY.md "One process per identity").

:func:`acquire` takes a non-blocking ``flock`` on a file and writes the
holder's pid, process start time and purpose into it. The lock is the open
file, not the file's existence: it goes away with the process however it
ends (even SIGKILL), so there is nothing stale to clean up, and the next
process simply takes it. A second process gets :class:`LockHeldError`
naming the holder's pid.

Used for ``brmcp-serve`` and ``brmcp-bridge`` data directories, the
``brmcp-fakebr`` data directory, and one event consumer (a harness or a
``brmcp-bridge``) per brclient (:func:`brclient_lock_path`, taken by
:func:`brmcp.clientrpc.acquire_brclient`, which first asks brclient for its
certificate: that check is clientrpc's, which sits above this module).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows has no flock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "HARNESS",
    "FileLock",
    "LockHeldError",
    "acquire",
    "acquire_datadir",
    "brclient_lock_path",
    "lock_dir",
    "read_holder",
]

#: What a harness (``run_bot``, so ``brmcp-serve``) records in the brclient lock.
HARNESS = "brmcp harness"


class LockHeldError(Exception):
    """Another process holds the lock. ``holder``: what it wrote (``pid``,
    ``what``, ``started`` unix seconds, ``detail``), empty when unreadable;
    the message is one line naming the path and the holder's pid."""

    def __init__(self, message: str, path: Path, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder

    @property
    def pid(self) -> int | None:
        pid = self.holder.get("pid")
        return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


class FileLock:
    """A held lock; :meth:`release` (or leaving the ``with`` block) frees it.
    The file stays behind (removing it would race with the next taker)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock and close. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> FileLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def read_holder(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What the current holder of ``path`` wrote (empty when nothing readable)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def acquire(path: str | os.PathLike[str], *, what: str, detail: str = "") -> FileLock:
    """Take the exclusive lock ``path`` for ``what`` (e.g. ``"brmcp-serve"``),
    creating the file (mode 0600) and its directory (0700) when missing;
    ``detail`` (e.g. the data directory) is recorded for the next taker's
    message. Never blocks. Raises :class:`LockHeldError` when another open
    file holds it (another process, or another lock in this one), and OSError
    when the file cannot be created."""
    p = Path(path)
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = read_holder(p)
                pid = holder.get("pid")
                who = f"{holder.get('what') or 'another process'} (pid {pid})" if pid else "another process"
                where = f" for {holder['detail']}" if holder.get("detail") else ""
                raise LockHeldError(f"{who} already holds {p}{where}", p, holder) from None
        record = {"pid": os.getpid(), "what": what, "started": int(time.time()), "detail": detail}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return FileLock(p, fd)


def acquire_datadir(
    datadir: Path, lock_name: str, *, what: str, error: type[Exception], already: str = "is running"
) -> FileLock:
    """Take ``datadir/lock_name`` for the program *what*, or raise *error* with one clear line.

    Raises:
        error: another process holds the lock (its pid is named), or the lock file cannot be
            created (the OS reason is named).
    """
    path = datadir / lock_name
    try:
        return acquire(path, what=what, detail=str(datadir))
    except LockHeldError as exc:
        raise error(f"another {what} (pid {exc.pid}) {already} on {datadir} (lock {path})") from None
    except OSError as exc:
        raise error(f"cannot create the lock {path}: {exc}") from None


def lock_dir() -> Path:
    """Where per-user locks that are not tied to one data directory live:
    ``$BRMCP_LOCK_DIR``, else ``$XDG_RUNTIME_DIR/brmcp``, else
    ``~/.cache/brmcp/locks``."""
    explicit = os.environ.get("BRMCP_LOCK_DIR")
    if explicit:
        return Path(explicit).expanduser()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "brmcp"
    return Path.home() / ".cache" / "brmcp" / "locks"


def brclient_lock_path(server_cert: str | os.PathLike[str]) -> Path:
    """The lock naming one brclient: ``brclient-<sha256 of its rpc.cert>.lock``
    (first 32 hex digits) in :func:`lock_dir`. brclient's TLS certificate is
    unique to one brclient and every program driving it must pin it
    (docs/clientrpc.md §Mutual TLS), so every harness and ``brmcp-bridge`` on one brclient
    computes the same path even when their config files name different
    copies of the certificate. Raises OSError when the certificate cannot be
    read."""
    digest = hashlib.sha256(Path(server_cert).read_bytes()).hexdigest()
    return lock_dir() / f"brclient-{digest[:32]}.lock"
