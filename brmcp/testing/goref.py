"""Build the Go reference's interop command (``interop/go``) for tests and benches.

The Go reference (github.com/karamble/brmcp) is not served by the Go module
proxy, so ``interop/go/go.mod`` requires it at a pseudo-version and the build
happens in a copy: the git bundle is cloned into a cache directory, checked out
at the pinned commit, and a ``replace`` pointing at that clone is added to the
build copy of ``interop/go`` (nothing committed points outside the project).
The binary is cached under a key made of the bundle's hash, the sources of
``interop/go`` and the Go version, so it is rebuilt only when one changes.

Where things are looked up:

* the bundle: ``$BRMCP_GO_REFERENCE`` (a path to the ``.bundle`` file), else
  ``../shared/go-reference/brmcp.bundle`` relative to the project root;
* the cache: ``$BRMCP_CACHE_DIR``, else ``$XDG_CACHE_HOME/brmcp``, else
  ``~/.cache/brmcp``; the clone, build copies and binaries live in ``goref/``.

:func:`unavailable_reason` says why the command cannot be had (no bundle, no
Go, no ``interop/go`` in this install) so tests can skip with it;
:func:`build` returns the path of the built command or raises
:class:`GoRefError` with the failing step's output.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "BUNDLE_ENV",
    "GoRefError",
    "GoWire",
    "build",
    "build_reference_command",
    "bundle_path",
    "interop_dir",
    "pinned_commit",
    "project_root",
    "unavailable_reason",
]

#: Environment variable naming the reference's git bundle.
BUNDLE_ENV = "BRMCP_GO_REFERENCE"
_MODULE = "github.com/karamble/brmcp"
_PSEUDO = re.compile(r"^\s*" + re.escape(_MODULE) + r"\s+v\S+-([0-9a-f]{12})\s*$", re.MULTILINE)


class GoRefError(RuntimeError):
    """Cloning or building the Go reference failed; the message carries the
    failing command and its output."""


def project_root() -> Path:
    """The source tree this package was imported from (the directory holding
    ``pyproject.toml``); the package lives at ``<root>/brmcp``."""
    return Path(__file__).resolve().parents[2]


def interop_dir() -> Path:
    """``<project root>/interop/go``, our Go module."""
    return project_root() / "interop" / "go"


def bundle_path() -> Path:
    """Where the reference's git bundle is expected (it may not exist)."""
    env = os.environ.get(BUNDLE_ENV)
    if env:
        return Path(env).expanduser()
    return project_root().parent / "shared" / "go-reference" / "brmcp.bundle"


def pinned_commit() -> str:
    """The 12-hex commit prefix of the reference's pseudo-version in
    ``interop/go/go.mod``. Raises :class:`GoRefError` if it is missing."""
    text = (interop_dir() / "go.mod").read_text()
    m = _PSEUDO.search(text)
    if m is None:
        raise GoRefError(f"interop/go/go.mod does not require {_MODULE} at a pseudo-version")
    return m.group(1)


def unavailable_reason() -> str | None:
    """None when the command can be built here, else a one-line reason."""
    if not (interop_dir() / "go.mod").is_file():
        return f"interop/go is not in this installation ({interop_dir()})"
    bundle = bundle_path()
    if not bundle.is_file():
        if os.environ.get(BUNDLE_ENV):
            return f"Go reference bundle not found at {bundle} (from ${BUNDLE_ENV})"
        return f"Go reference bundle not found at {bundle} (put it there or set {BUNDLE_ENV} to its path)"
    if shutil.which("go") is None:
        return "Go toolchain not found on PATH (needed to build the Go reference)"
    if shutil.which("git") is None:
        return "git not found on PATH (needed to clone the Go reference bundle)"
    return None


def _cache_dir() -> Path:
    env = os.environ.get("BRMCP_CACHE_DIR")
    if env:
        base = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "brmcp"
    return base / "goref"


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).strip()
        raise GoRefError(f"{' '.join(cmd)} failed ({proc.returncode}): {out[-4000:]}")
    return proc.stdout


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            h.update(block)
    return h.hexdigest()


def _sources() -> list[Path]:
    src = interop_dir()
    return sorted(
        p for p in src.iterdir() if p.is_file() and (p.suffix == ".go" or p.name in {"go.mod", "go.sum"})
    )


def _clone(bundle: Path, bundle_hash: str, commit: str, cache: Path) -> Path:
    dest = cache / f"src-{bundle_hash[:16]}-{commit}"
    if (dest / "go.mod").is_file():
        return dest
    tmp = cache / f"src-{bundle_hash[:16]}-{commit}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    _run(["git", "clone", "--quiet", "--no-checkout", str(bundle), str(tmp)])
    _run(["git", "-c", "advice.detachedHead=false", "checkout", "--quiet", commit], cwd=tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def _prepare() -> tuple[Path, Path, str, dict[str, str]]:
    """Check availability, clone the pinned commit; return (clone, cache,
    base key, build environment)."""
    reason = unavailable_reason()
    if reason is not None:
        raise GoRefError(reason)
    bundle = bundle_path()
    commit = pinned_commit()
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    bundle_hash = _hash_file(bundle)
    env = dict(os.environ)
    env["GOFLAGS"] = "-mod=mod -buildvcs=false"
    env.setdefault("GOTOOLCHAIN", "local")
    go_version = _run(["go", "env", "GOVERSION"], env=env).strip()
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        clone = _clone(bundle, bundle_hash, commit, cache)
    return clone, cache, f"{bundle_hash}\n{commit}\n{go_version}\n", env


def build() -> Path:
    """Build (or reuse) our ``brmcp-goref`` command and return its path.

    Raises :class:`GoRefError` when the reference is unavailable (see
    :func:`unavailable_reason`) or a clone/build step fails.
    """
    clone, cache, base, env = _prepare()
    key = hashlib.sha256(base.encode())
    for path in _sources():
        key.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest = key.hexdigest()[:20]
    binary = cache / "bin" / f"brmcp-goref-{digest}"
    if binary.is_file():
        return binary
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file():
            return binary
        work = cache / f"build-{digest}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for path in _sources():
            shutil.copy2(path, work / path.name)
        _run(["go", "mod", "edit", f"-replace={_MODULE}={clone}"], cwd=work, env=env)
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp_bin = binary.with_name(binary.name + f".tmp{os.getpid()}")
        _run(["go", "build", "-o", str(tmp_bin), "."], cwd=work, env=env)
        tmp_bin.rename(binary)
        shutil.rmtree(work, ignore_errors=True)
    return binary


def build_reference_command(package: str) -> Path:
    """Build (or reuse) one of the reference's own commands, e.g.
    ``"cmd/brmcp-serve"``, from the pinned clone and return its path.
    Raises :class:`GoRefError` as :func:`build` does."""
    clone, cache, base, env = _prepare()
    name = package.rstrip("/").rsplit("/", 1)[-1]
    digest = hashlib.sha256(f"{base}{package}".encode()).hexdigest()[:20]
    binary = cache / "bin" / f"{name}-{digest}"
    if binary.is_file():
        return binary
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file():
            return binary
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp_bin = binary.with_name(binary.name + f".tmp{os.getpid()}")
        _run(["go", "build", "-o", str(tmp_bin), "./" + package], cwd=clone, env=env)
        tmp_bin.rename(binary)
    return binary


class GoWire:
    """The reference codec as a subprocess (``brmcp-goref wire``), one JSON
    request line and one JSON response line per batch. Use as a context
    manager; :meth:`request` sends ``{"op": op, **fields}`` and returns the
    decoded response (a dict with ``results``, or ``ns``/``ok``/``bytes`` for
    the bench ops). Raises :class:`GoRefError` if the process dies or answers
    with an ``error``.

    Ops (see ``interop/go/wire.go``): ``parse`` (``texts``), ``encode``
    (``cases``: sid, payload_b64, exp, chunk_size, mid), ``assemble``
    (``seqs``: config and steps of parts with ``now_ns``), ``bench_parse``
    and ``bench_encode`` (the same batches plus ``rounds``).
    """

    def __init__(self, binary: Path) -> None:
        self._proc = subprocess.Popen(
            [str(binary), "wire"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        proc = self._proc
        assert proc.stdin is not None
        assert proc.stdout is not None
        line = json.dumps({"op": op, **fields}, separators=(",", ":")).encode() + b"\n"
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
            answer = proc.stdout.readline()
        except BrokenPipeError as exc:
            raise GoRefError(f"brmcp-goref wire died: {self._stderr()}") from exc
        if not answer:
            raise GoRefError(f"brmcp-goref wire died: {self._stderr()}")
        out: dict[str, Any] = json.loads(answer)
        if "error" in out:
            raise GoRefError(f"brmcp-goref wire: {out['error']}")
        return out

    def _stderr(self) -> str:
        self._proc.kill()
        _, err = self._proc.communicate(timeout=10)
        return err.decode(errors="replace").strip()[-2000:]

    def close(self) -> None:
        proc = self._proc
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> GoWire:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()
