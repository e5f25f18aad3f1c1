"""Building the brnet command (a Go module) with ``go build`` into a cache
directory keyed on a hash of its sources.

The sources are ``interop/brnet`` in a brmcp clone; the package ships the
same files as package data (``brmcp/testing/brnet/gosrc``: ``go.mod``,
``go.sum`` and the ``.go`` files; in a clone that directory is a symlink to
``interop/brnet``), so an installed brmcp builds brnet too. They are looked
for in ``$BRMCP_BRNET_SRC``, then in the package, then in ``interop/brnet``
beside the package (a clone) or under the current directory or one of its
parents.

The cache is ``$BRMCP_CACHE_DIR/brnet`` or ``$XDG_CACHE_HOME/brmcp/brnet``
(default ``~/.cache/brmcp/brnet``); each build lands in ``<cache>/<hash>/brnet``
so a changed source tree never runs a stale binary. The first build on a
machine downloads bisonrelay and the modules it needs through the Go module
proxy (about 400 MB, into Go's module cache, ``go env GOMODCACHE``) and
compiles them (minutes on a slow machine); later builds reuse Go's module and
build caches. ``brnet_binary(progress=...)`` reports what a build is doing
while it runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

__all__ = [
    "PACKAGED_SOURCES",
    "BrNetBuildError",
    "BrNetUnavailable",
    "GoNotFound",
    "Progress",
    "brnet_binary",
    "brnet_cache_dir",
    "brnet_source_dir",
    "go_executable",
    "source_hash",
]

#: Go build tags: ``noaudio`` skips bisonrelay's cgo audio code.
BUILD_TAGS = "noaudio"
#: The oldest Go that builds brnet (the ``go`` line of its go.mod).
GO_MINIMUM = "1.22"
#: Where Go comes from.
GO_DOWNLOAD_URL = "https://go.dev/dl/"
#: The sources shipped inside the package (a symlink to ``interop/brnet`` in a clone).
PACKAGED_SOURCES = Path(__file__).resolve().parent / "gosrc"
#: The module whose presence in Go's module cache tells a first build from a later one.
_BISONRELAY = "github.com/companyzero/bisonrelay"
#: Seconds between "still building" lines while ``go build`` prints nothing.
HEARTBEAT_SECONDS = 15.0
#: Seconds between summary lines while Go downloads modules.
DOWNLOAD_SUMMARY_SECONDS = 5.0
_SOURCE_SUFFIXES = (".go",)
_SOURCE_NAMES = ("go.mod", "go.sum")
_DOWNLOADING = re.compile(r"^go: downloading (\S+) (\S+)\s*$")
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

#: Receives one progress line at a time (no trailing newline), from the
#: calling thread or a reader thread of the build.
Progress = Callable[[str], None]


class BrNetUnavailable(RuntimeError):
    """brnet cannot be built here: no Go toolchain, no sources, or the module
    proxy is unreachable. The message is one line fit for a skip reason."""


class GoNotFound(BrNetUnavailable):
    """No ``go`` command: ``$BRMCP_GO`` names a missing file, or ``go`` is not
    on ``PATH``."""


class BrNetBuildError(RuntimeError):
    """``go build`` failed for another reason (the message ends with Go's
    output; :attr:`summary` is one line: where it failed and Go's last line)."""

    def __init__(self, src: Path, output: str) -> None:
        super().__init__(f"go build of brnet failed in {src}:\n{output}")
        last = output.strip().splitlines()[-1] if output.strip() else "no output"
        #: ``go build of brnet failed in <src>: <Go's last line>``.
        self.summary = f"go build of brnet failed in {src}: {last}"


def go_executable() -> str | None:
    """The ``go`` command: ``$BRMCP_GO`` if set, else ``go`` on ``PATH``; ``None`` if absent."""
    explicit = os.environ.get("BRMCP_GO")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return shutil.which("go")


def _candidate_sources() -> Iterator[Path]:
    yield PACKAGED_SOURCES.resolve()
    yield Path(__file__).resolve().parents[3] / "interop" / "brnet"
    cwd = Path.cwd().resolve()
    for base in (cwd, *cwd.parents):
        yield base / "interop" / "brnet"


def _is_source_dir(path: Path) -> bool:
    return (path / "go.mod").is_file() and (path / "main.go").is_file()


def brnet_source_dir() -> Path:
    """The brnet sources: ``$BRMCP_BRNET_SRC`` when set, else the first of the
    package's ``gosrc`` directory, ``interop/brnet`` beside the package, and
    ``interop/brnet`` under the current directory or a parent that holds a
    ``go.mod`` and a ``main.go``. Raises :class:`BrNetUnavailable` when
    ``$BRMCP_BRNET_SRC`` does not hold them or none is found."""
    explicit = os.environ.get("BRMCP_BRNET_SRC")
    if explicit:
        path = Path(explicit).expanduser()
        if _is_source_dir(path):
            return path
        raise BrNetUnavailable(
            f"BRMCP_BRNET_SRC={explicit} holds no brnet sources (go.mod and main.go): "
            "point it at a copy of interop/brnet or unset it"
        )
    for cand in _candidate_sources():
        if _is_source_dir(cand):
            return cand
    raise BrNetUnavailable(
        f"brnet's Go sources are missing from this brmcp (expected in {PACKAGED_SOURCES}): "
        "reinstall brmcp, or set BRMCP_BRNET_SRC to a copy of interop/brnet"
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


def _say(progress: Progress | None, line: str) -> None:
    if progress is not None:
        progress(line)


@contextlib.contextmanager
def _build_lock(path: Path, progress: Progress | None) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        if sys.platform != "win32":
            import fcntl

            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _say(progress, f"brnet: another process is building brnet; waiting for it (lock {path})")
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield


def _go_env(go: str, name: str) -> str | None:
    """``go env NAME``, or None when Go cannot tell."""
    try:
        done = subprocess.run([go, "env", name], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    value = done.stdout.strip()
    return value if done.returncode == 0 and value else None


def _escape_module_path(text: str) -> str:
    """Go's module cache spelling: each capital letter becomes ``!`` and its lower case."""
    return re.sub(r"[A-Z]", lambda m: "!" + m.group(0).lower(), text)


def _modules_cached(modcache: str, src: Path) -> bool:
    """Whether the bisonrelay version pinned in ``src/go.mod`` is already in ``modcache``."""
    try:
        gomod = (src / "go.mod").read_text(encoding="utf-8")
    except OSError:
        return False
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(_BISONRELAY)}\s+(\S+)", gomod, re.MULTILINE)
    if found is None:
        return False
    name = f"{_escape_module_path(_BISONRELAY)}@{_escape_module_path(found.group(1))}"
    return (Path(modcache) / name).is_dir()


def _announce(go: str, src: Path, exe: Path, progress: Progress | None) -> None:
    if progress is None:
        return
    modcache = _go_env(go, "GOMODCACHE")
    if modcache is not None and _modules_cached(modcache, src):
        progress(
            f"brnet: building brnet with Go; its modules are already in {modcache}, "
            "so this only compiles (up to a few minutes, once)"
        )
    else:
        where = modcache or "Go's module cache (go env GOMODCACHE)"
        progress(
            "brnet: first build of brnet: Go downloads bisonrelay and the modules it needs "
            f"(about 400 MB, a one-time download) into {where}, then compiles them; "
            "this takes a few minutes, later runs start at once"
        )
    progress(f"brnet: the binary will be cached in {exe.parent} (sources: {src})")


class _BuildOutput:
    """``go build``'s output as progress: each ``go: downloading`` line is
    counted and summarised every :data:`DOWNLOAD_SUMMARY_SECONDS`; other
    lines are passed through; :meth:`tick` adds a "still building" line
    after :data:`HEARTBEAT_SECONDS` of silence. Thread-safe."""

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._said = self._started
        self._summarised = 0.0
        self._last_download = 0.0
        self._unsummarised = False
        self.downloads = 0
        self._latest = ""
        #: Every line but the download notices (for error messages).
        self.lines: list[str] = []

    def _emit(self, line: str, now: float) -> None:
        self._said = now
        _say(self._progress, line)

    def _summary(self, now: float) -> None:
        self._summarised = now
        self._unsummarised = False
        self._emit(f"brnet: downloading Go modules: {self.downloads} so far (latest {self._latest})", now)

    def feed(self, raw: str) -> None:
        line = raw.rstrip()
        now = time.monotonic()
        with self._lock:
            match = _DOWNLOADING.match(line)
            if match is not None:
                self.downloads += 1
                self._latest = f"{match.group(1)} {match.group(2)}"
                self._last_download = now
                if now - self._summarised >= DOWNLOAD_SUMMARY_SECONDS:
                    self._summary(now)
                else:
                    self._unsummarised = True
                return
            self.lines.append(line)
            if not line:
                return
            if self._unsummarised:
                self._summary(now)
            self._emit(f"brnet: go build: {line}", now)

    def tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._unsummarised and now - self._summarised >= DOWNLOAD_SUMMARY_SECONDS:
                self._summary(now)
            elif now - self._said >= HEARTBEAT_SECONDS:
                elapsed = now - self._started
                if self.downloads and now - self._last_download < HEARTBEAT_SECONDS:
                    doing = f"downloading Go modules, {self.downloads} so far"
                elif self.downloads:
                    doing = f"compiling; {self.downloads} Go modules downloaded"
                else:
                    doing = "compiling"
                self._emit(f"brnet: still building ({elapsed:.0f} s, {doing})", now)

    def finish(self) -> None:
        with self._lock:
            if self._unsummarised:
                self._summary(time.monotonic())


def _pump(stream: IO[str], output: _BuildOutput) -> None:
    for line in stream:
        output.feed(line)


def _run_build(cmd: list[str], src: Path, timeout: float, output: _BuildOutput) -> int:
    """Run ``cmd`` in ``src`` with its output fed to ``output``; returns the
    exit status. Raises :class:`BrNetUnavailable` after ``timeout`` seconds
    (the build is killed). ``go`` stays in the caller's process group, so a
    Ctrl-C reaches it too."""
    proc = subprocess.Popen(
        cmd,
        cwd=src,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    )
    assert proc.stdout is not None
    reader = threading.Thread(target=_pump, args=(proc.stdout, output), name="brnet-build", daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise BrNetUnavailable(f"go build of brnet took longer than {timeout:.0f} s") from None
                output.tick()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10.0)
        proc.stdout.close()
    output.finish()
    return proc.returncode


def brnet_binary(*, timeout: float = 1800.0, progress: Progress | None = None) -> Path:
    """The path of a built brnet for the current sources, building it first if
    needed (``go build -tags noaudio``; concurrent callers wait on a file lock).

    ``progress``, when given, receives one-line reports while a build runs
    (nothing when the binary is already cached): what is being done, that the
    first build is a one-time download of about 400 MB and where Go keeps
    it, where the binary goes, a summary of the modules downloaded every
    few seconds, Go's other output line by line, a "still building" line
    after 15 s of silence, and the result. ``timeout`` is in seconds.

    Raises :class:`GoNotFound` (a :class:`BrNetUnavailable`) without Go,
    :class:`BrNetUnavailable` (no sources, module proxy unreachable, build
    over ``timeout``) or :class:`BrNetBuildError` (any other build failure).
    """
    go = go_executable()
    if go is None:
        raise GoNotFound(
            f"Go toolchain not found (install Go >= {GO_MINIMUM} from {GO_DOWNLOAD_URL} "
            "to build brnet, the real BR network)"
        )
    src = brnet_source_dir()
    cache = brnet_cache_dir()
    out_dir = cache / source_hash(src)
    exe = out_dir / ("brnet.exe" if sys.platform == "win32" else "brnet")
    if exe.is_file():
        return exe
    with _build_lock(cache / ".lock", progress):
        if exe.is_file():
            return exe
        out_dir.mkdir(parents=True, exist_ok=True)
        _announce(go, src, exe, progress)
        tmp = out_dir / f".{exe.name}.{os.getpid()}.tmp"
        cmd = [go, "build", "-tags", BUILD_TAGS, "-buildvcs=false", "-trimpath", "-o", str(tmp), "."]
        output = _BuildOutput(progress)
        started = time.monotonic()
        try:
            try:
                status = _run_build(cmd, src, timeout, output)
            except OSError as exc:
                raise BrNetUnavailable(f"cannot run {go}: {exc.strerror or exc}") from None
            if status != 0:
                text = "\n".join(output.lines).strip()
                last = text.splitlines()[-1] if text else f"exit status {status}"
                if any(sign in text for sign in _FETCH_ERRORS):
                    raise BrNetUnavailable(f"cannot download brnet's Go modules: {last}")
                raise BrNetBuildError(src, text or f"exit status {status}")
            os.replace(tmp, exe)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        _say(progress, f"brnet: built {exe} in {time.monotonic() - started:.0f} s")
    return exe
