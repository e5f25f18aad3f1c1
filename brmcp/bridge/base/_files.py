"""Durable file replacement for the bridge's state files."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["read_text", "write_atomic"]


def write_atomic(path: Path, data: str, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` (UTF-8) so readers see the old or the
    new content, never a mix: write a temporary file in the same directory
    with ``mode``, fsync it, rename it over ``path``, then fsync the
    directory. The directory is created (mode 0700) when missing. Raises
    OSError; on failure ``path`` is untouched and the temporary is removed."""
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def read_text(path: Path) -> str | None:
    """The file's content, or None when it does not exist. Raises OSError
    for other failures and UnicodeDecodeError for non-UTF-8 content."""
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
