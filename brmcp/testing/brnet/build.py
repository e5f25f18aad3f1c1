"""Building the brnet command (``interop/brnet``, a Go module) with ``go build``
into a cache directory keyed on a hash of its sources.

The cache is ``$BRMCP_CACHE_DIR/brnet`` or ``$XDG_CACHE_HOME/brmcp/brnet``
(default ``~/.cache/brmcp/brnet``); each build lands in ``<cache>/<hash>/brnet``
so a changed source tree never runs a stale binary. The first build downloads
the bisonrelay modules through the Go module proxy (about a minute) and
compiles them (minutes on a slow machine); later builds reuse Go's own module
and build caches. Sources are found in ``$BRMCP_BRNET_SRC``, beside the
installed package (a clone or editable install), or in ``interop/brnet`` under
the current directory or one of its parents.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "BrNetBuildError",
    "BrNetUnavailable",
    "brnet_binary",
    "brnet_cache_dir",
    "brnet_source_dir",
    "go_executable",
]

#: Go build tags: ``noaudio`` skips bisonrelay's cgo audio code.
BUILD_TAGS = "noaudio"
_SOURCE_SUFFIXES = (".go",)
_SOURCE_NAMES = ("go.mod", "go.sum")
# Signs that a failed build could not reach the module proxy (an environment
# problem, reported as "unavailable" rather than as a broken build).
_FETCH_ERRORS = (
    "dial tcp",
    "no such host",
    "i/o timeout",
    "connection refused",
    "403 Forbidden",
    "proxy.golang.org",
    "TLS handshake timeout",
    "network is unreachable",
)


class BrNetUnavailable(RuntimeError):
    """brnet cannot be built here: no Go toolchain, no sources, or the module
    proxy is unreachable. The message is one line fit for a skip reason."""


class BrNetBuildError(RuntimeError):
    """``go build`` failed for another reason (the message ends with Go's output)."""


def go_executable() -> str | None:
    """The ``go`` command: ``$BRMCP_GO`` if set, else ``go`` on ``PATH``; ``None`` if absent."""
    explicit = os.environ.get("BRMCP_GO")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return shutil.which("go")


def _candidate_sources() -> Iterator[Path]:
    env = os.environ.get("BRMCP_BRNET_SRC")
    if env:
        yield Path(env)
    yield Path(__file__).resolve().parents[3] / "interop" / "brnet"
    cwd = Path.cwd().resolve()
    for base in (cwd, *cwd.parents):
        yield base / "interop" / "brnet"


def brnet_source_dir() -> Path:
    """The ``interop/brnet`` directory (the first candidate holding a ``go.mod``
    and ``main.go``). Raises :class:`BrNetUnavailable` when none is found."""
    for cand in _candidate_sources():
        if (cand / "go.mod").is_file() and (cand / "main.go").is_file():
            return cand
    raise BrNetUnavailable(
        "brnet sources (interop/brnet) not found: run from a brmcp clone or set BRMCP_BRNET_SRC"
    )


def brnet_cache_dir() -> Path:
    """Where built binaries live (see the module docstring)."""
    explicit = os.environ.get("BRMCP_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser() / "brnet"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "brmcp" / "brnet"


def source_hash(src: Path) -> str:
    """SHA-256 (hex, first 16 characters) over the module's ``.go`` files,
    ``go.mod`` and ``go.sum``, in path order."""
    h = hashlib.sha256()
    files = sorted(
        p for p in src.iterdir() if p.is_file() and (p.suffix in _SOURCE_SUFFIXES or p.name in _SOURCE_NAMES)
    )
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(BUILD_TAGS.encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        if sys.platform != "win32":
            import fcntl

            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield


def brnet_binary(*, timeout: float = 1800.0) -> Path:
    """The path of a built brnet for the current sources, building it first if
    needed (``go build -tags noaudio``; concurrent callers wait on a file lock).

    Raises :class:`BrNetUnavailable` (no Go, no sources, module proxy
    unreachable) or :class:`BrNetBuildError` (any other build failure).
    """
    go = go_executable()
    if go is None:
        raise BrNetUnavailable(
            "Go toolchain not found (install Go >= 1.22 to build brnet, the real BR network)"
        )
    src = brnet_source_dir()
    out_dir = brnet_cache_dir() / source_hash(src)
    exe = out_dir / ("brnet.exe" if sys.platform == "win32" else "brnet")
    if exe.is_file():
        return exe
    with _build_lock(brnet_cache_dir() / ".lock"):
        if exe.is_file():
            return exe
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f".{exe.name}.{os.getpid()}.tmp"
        cmd = [go, "build", "-tags", BUILD_TAGS, "-buildvcs=false", "-trimpath", "-o", str(tmp), "."]
        try:
            proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise BrNetUnavailable(f"go build of brnet took longer than {timeout:.0f} s") from exc
        if proc.returncode != 0:
            output = (proc.stderr or proc.stdout).strip()
            last = output.splitlines()[-1] if output else f"exit status {proc.returncode}"
            if any(sign in output for sign in _FETCH_ERRORS):
                raise BrNetUnavailable(f"cannot download brnet's Go modules: {last}")
            raise BrNetBuildError(f"go build of brnet failed in {src}:\n{output}")
        os.replace(tmp, exe)
    return exe
