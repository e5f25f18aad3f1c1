"""What a new user meets in the first hour, as commands they run:

* ``brmcp demo --network real`` from an installed brmcp: the wheel ships
  brnet's Go sources, an installed copy finds and builds them, a first build
  reports its progress on stderr, and without Go the demo says what to
  install in one line;
* a taken port: ``brmcp-fakebr --port``, ``brmcp demo --port`` and the
  daemons' ``--metrics`` each print one line naming the address, exit 1 and
  leave nothing behind;
* metrics: no ``_created`` series, a ``brmcp_build_info`` metric, the
  bridge's tool-call counter labelled by tool;
* ``brmcp version`` and ``brmcp --version`` agree, and a normal start of the
  daemons logs under brmcp's logger names only (no ``uvicorn.error``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

import brmcp
from brmcp.demo import NO_GO
from brmcp.metrics import (
    BridgeMetrics,
    MetricsEndpoint,
    MetricsListenError,
    ServeMetrics,
    check_listen_address,
)
from brmcp.testing.brnet import BrNetBuildError, brnet_binary, build, go_executable
from brmcp.testing.brnet.build import source_hash
from tests.kit.paths import REPO

BRNET_SRC = REPO / "interop" / "brnet"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _taken(port: int, option: str, host: str = "127.0.0.1") -> str:
    return (
        f"cannot listen on {host}:{port}: address already in use "
        f"(another process holds it; choose another with {option})"
    )


@contextlib.contextmanager
def _held_port() -> Iterator[int]:
    """A loopback port held (bound and listening) by this test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


# -- 1. brnet from an installed brmcp ---------------------------------------------------


def _go_sources() -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in BRNET_SRC.iterdir()
        if p.is_file() and (p.suffix == ".go" or p.name in ("go.mod", "go.sum"))
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel . --no-deps`` of a copy of the project's sources (built
    outside the working tree, which setuptools would write build/ into)."""
    src = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in ("build_backend", "brmcp", "examples/serve"):
        shutil.copytree(REPO / folder, src / folder, symlinks=True, ignore=skip)
    (src / "interop" / "brnet").mkdir(parents=True)
    for name, data in _go_sources().items():
        (src / "interop" / "brnet" / name).write_bytes(data)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-w", str(out)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = out.glob("brmcp-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel unpacked as site-packages would hold it."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(site)
    return site


@pytest.mark.slow
def test_the_wheel_ships_brnets_go_sources(wheel: Path) -> None:
    expected = _go_sources()
    assert {"go.mod", "go.sum", "main.go"} <= set(expected)
    with zipfile.ZipFile(wheel) as whl:
        shipped = {
            name.removeprefix("brmcp/testing/brnet/gosrc/"): whl.read(name)
            for name in whl.namelist()
            if name.startswith("brmcp/testing/brnet/gosrc/")
        }
    assert shipped == expected


def _installed_env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in ENV.items() if k not in ("BRMCP_BRNET_SRC", "BRMCP_GO")}
    env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env


@pytest.mark.slow
def test_an_installed_brmcp_finds_its_packaged_sources_outside_a_clone(
    installed: Path, tmp_path: Path
) -> None:
    code = (
        "import json, brmcp\n"
        "from brmcp.testing.brnet import brnet_source_dir\n"
        "from brmcp.testing.brnet.build import source_hash\n"
        "src = brnet_source_dir()\n"
        "print(json.dumps({'brmcp': brmcp.__file__, 'src': str(src), 'hash': source_hash(src)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_installed_env(installed),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert Path(found["brmcp"]).is_relative_to(installed)
    assert Path(found["src"]) == installed / "brmcp" / "testing" / "brnet" / "gosrc"
    assert found["hash"] == source_hash(BRNET_SRC)


@pytest.mark.slow
@pytest.mark.realnet
@pytest.mark.skipif(go_executable() is None, reason="needs Go to build brnet")
def test_an_installed_brmcp_builds_brnet_into_its_cache(installed: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    code = (
        "import sys\n"
        "from brmcp.testing.brnet import brnet_binary\n"
        "print(brnet_binary(progress=lambda line: print(line, file=sys.stderr, flush=True)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_installed_env(installed, BRMCP_CACHE_DIR=str(cache)),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    exe = Path(done.stdout.strip())
    assert exe == cache / "brnet" / source_hash(BRNET_SRC) / "brnet"
    assert os.access(exe, os.X_OK)
    progress = done.stderr.splitlines()
    assert progress[0].startswith("brnet: "), progress
    assert f"(sources: {installed / 'brmcp' / 'testing' / 'brnet' / 'gosrc'})" in done.stderr
    assert progress[-1].startswith(f"brnet: built {exe} in "), progress


FAKE_GO = """#!/bin/sh
if [ "$1" = env ]; then echo "$FAKE_GOMODCACHE"; exit 0; fi
out=""
while [ $# -gt 0 ]; do
    if [ "$1" = -o ]; then out="$2"; fi
    shift
done
{body}
printf '#!/bin/sh\\necho fake brnet ran "$@"\\n' > "$out"
chmod +x "$out"
"""

DOWNLOADS = 'for m in a b c; do echo "go: downloading example.com/$m v1.0.0" >&2; done'


def _fake_go(tmp_path: Path, body: str = DOWNLOADS) -> Path:
    go = tmp_path / "fake-go"
    go.write_text(FAKE_GO.replace("{body}", body))
    go.chmod(0o755)
    return go


@pytest.fixture
def fake_go_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """BRMCP_GO is a fake go; the brnet cache and Go's module cache are empty
    directories under ``tmp_path``. Returns the module cache."""
    modcache = tmp_path / "gomodcache"
    modcache.mkdir()
    monkeypatch.setenv("BRMCP_GO", str(_fake_go(tmp_path)))
    monkeypatch.setenv("BRMCP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_GOMODCACHE", str(modcache))
    monkeypatch.delenv("BRMCP_BRNET_SRC", raising=False)
    return modcache


def test_a_first_build_says_what_it_does_and_summarises_the_downloads(fake_go_env: Path) -> None:
    lines: list[str] = []
    exe = brnet_binary(progress=lines.append)
    assert lines[0].startswith("brnet: first build of brnet: Go downloads bisonrelay"), lines
    assert "about 400 MB, a one-time download" in lines[0]
    assert f"into {fake_go_env}," in lines[0]
    assert lines[1] == f"brnet: the binary will be cached in {exe.parent} (sources: {BRNET_SRC})"
    assert "brnet: downloading Go modules: 1 so far (latest example.com/a v1.0.0)" in lines
    assert "brnet: downloading Go modules: 3 so far (latest example.com/c v1.0.0)" in lines
    assert lines[-1].startswith(f"brnet: built {exe} in "), lines
    assert not any("go: downloading" in line for line in lines)
    # Built once: the next call reports nothing.
    again: list[str] = []
    assert brnet_binary(progress=again.append) == exe
    assert again == []


def test_a_build_with_the_modules_cached_only_compiles(fake_go_env: Path) -> None:
    version = re.search(r"github\.com/companyzero/bisonrelay (\S+)", (BRNET_SRC / "go.mod").read_text())
    assert version is not None
    (fake_go_env / "github.com" / "companyzero" / f"bisonrelay@{version.group(1)}").mkdir(parents=True)
    lines: list[str] = []
    brnet_binary(progress=lines.append)
    assert lines[0] == (
        f"brnet: building brnet with Go; its modules are already in {fake_go_env}, "
        "so this only compiles (up to a few minutes, once)"
    )


def test_a_quiet_build_reports_that_it_is_still_running(
    fake_go_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(build, "HEARTBEAT_SECONDS", 0.2)
    monkeypatch.setenv("BRMCP_GO", str(_fake_go(tmp_path, "sleep 2")))
    lines: list[str] = []
    brnet_binary(progress=lines.append)
    still = [line for line in lines if line.startswith("brnet: still building (")]
    assert still, lines
    assert still[0].endswith(" s, compiling)")


def test_gos_output_is_passed_through_and_a_failed_build_leaves_no_file(
    fake_go_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    go = _fake_go(tmp_path, 'echo "./main.go:3:2: undefined: x" >&2; echo partial > "$out"; exit 1')
    monkeypatch.setenv("BRMCP_GO", str(go))
    lines: list[str] = []
    with pytest.raises(BrNetBuildError, match="undefined: x") as raised:
        brnet_binary(progress=lines.append)
    assert raised.value.summary == f"go build of brnet failed in {BRNET_SRC}: ./main.go:3:2: undefined: x"
    assert "brnet: go build: ./main.go:3:2: undefined: x" in lines
    out_dir = tmp_path / "cache" / "brnet" / source_hash(BRNET_SRC)
    assert list(out_dir.iterdir()) == []


def test_python_m_brnet_prints_build_progress_on_stderr(tmp_path: Path) -> None:
    modcache = tmp_path / "gomodcache"
    modcache.mkdir()
    env = {
        **ENV,
        "BRMCP_GO": str(_fake_go(tmp_path)),
        "BRMCP_CACHE_DIR": str(tmp_path / "cache"),
        "FAKE_GOMODCACHE": str(modcache),
    }
    done = subprocess.run(
        [sys.executable, "-m", "brmcp.testing.brnet", "-users", "a,b"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # A test network tips at once unless told otherwise (brclient waits a minute).
    assert done.stdout == "fake brnet ran -tiprestartdelay=1s -users a,b\n"
    progress = done.stderr.splitlines()
    assert progress[0].startswith("brnet: first build of brnet:")
    assert progress[-1].startswith("brnet: built ")


def test_the_demo_prints_brnet_build_progress_on_stderr_not_in_the_transcript(tmp_path: Path) -> None:
    modcache = tmp_path / "gomodcache"
    modcache.mkdir()
    env = {
        **ENV,
        "BRMCP_GO": str(_fake_go(tmp_path)),
        "BRMCP_CACHE_DIR": str(tmp_path / "cache"),
        "FAKE_GOMODCACHE": str(modcache),
    }
    done = subprocess.run(
        [sys.executable, "-m", "brmcp", "demo", "--network", "real", "--datadir", str(tmp_path / "d")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # The fake brnet exits at once, so the network step fails after the build.
    assert done.returncode == 1
    assert "brnet: first build of brnet:" in done.stderr
    assert "brnet: downloading Go modules: 3 so far" in done.stderr
    assert "brnet: built " in done.stderr
    assert "brnet: " not in done.stdout.replace("brnet (the real Bison Relay network): ", "")
    assert "brmcp demo failed: brnet did not start" in done.stderr


def _path_without_go() -> str:
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    return os.pathsep.join(d for d in dirs if not (Path(d) / "go").exists())


def test_the_demo_without_go_is_one_line_naming_what_to_install(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "BRMCP_GO"}
    env["PATH"] = _path_without_go()
    done = subprocess.run(
        [sys.executable, "-m", "brmcp", "demo", "--network", "real"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"brmcp demo: {NO_GO}"]
    assert "Go >= 1.22" in NO_GO
    assert "https://go.dev/dl/" in NO_GO
    assert "plain 'brmcp demo' needs no Go" in NO_GO
    assert list(tmp_path.iterdir()) == []


def test_python_m_brnet_without_go_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "BRMCP_GO"}
    env["PATH"] = _path_without_go()
    done = subprocess.run(
        [sys.executable, "-m", "brmcp.testing.brnet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "brnet: Go toolchain not found (install Go >= 1.22 from https://go.dev/dl/ "
        "to build brnet, the real BR network)"
    ]


# -- 2. a taken port -------------------------------------------------------------------


def _fakebr(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brmcp.testing.fakebr", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_fakebr_on_a_taken_port_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    datadir = tmp_path / "br"
    with _held_port() as port:
        done = _fakebr("--datadir", str(datadir), "--users", "bot,alice", "--port", str(port), cwd=tmp_path)
        assert done.returncode == 1
        assert done.stdout == ""
        assert done.stderr.splitlines() == [f"brmcp-fakebr: {_taken(port, '--port')}"]
        assert not datadir.exists()
        # The second user's port (N+1) taken: that one is named.
        done = _fakebr(
            "--datadir", str(datadir), "--users", "bot,alice", "--port", str(port - 1), cwd=tmp_path
        )
        assert done.returncode == 1
        # (N itself may be held by some other process of the machine: then it is named.)
        assert done.stderr.splitlines() in (
            [f"brmcp-fakebr: {_taken(port, '--port')}"],
            [f"brmcp-fakebr: {_taken(port - 1, '--port')}"],
        )
        assert not datadir.exists()


def test_fakebr_on_an_address_of_no_interface_names_host(tmp_path: Path) -> None:
    datadir = tmp_path / "br"
    done = _fakebr("--datadir", str(datadir), "--users", "bot", "--host", "192.0.2.1", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "brmcp-fakebr: cannot listen on 192.0.2.1: address not available "
        "(no interface of this machine has it; choose another with --host)"
    ]
    assert not datadir.exists()


def test_fakebr_removes_what_it_made_when_a_port_is_taken_after_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from brmcp.testing.fakebr import cli

    monkeypatch.setattr(cli, "_check_ports", lambda host, first, count: None)
    datadir = tmp_path / "br"
    with _held_port() as port:
        argv = ["--datadir", str(datadir), "--users", "bot,alice", "--port", str(port - 1)]
        assert cli.main(argv) == 1
        assert capsys.readouterr().err.splitlines() == [f"brmcp-fakebr: {_taken(port, '--port')}"]
        assert not datadir.exists()
        # A data directory that was there before keeps what it had.
        datadir.mkdir()
        (datadir / "notes.txt").write_text("mine")
        assert cli.main(argv) == 1
        assert sorted(p.name for p in datadir.iterdir()) == ["notes.txt"]


def test_the_demo_on_a_taken_port_is_one_line(tmp_path: Path) -> None:
    with _held_port() as port:
        done = subprocess.run(
            [sys.executable, "-m", "brmcp", "demo", "--port", str(port)],
            cwd=tmp_path,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"brmcp demo: {_taken(port, '--port')}"]


async def test_the_metrics_endpoint_on_a_taken_port_names_the_address() -> None:
    metrics = ServeMetrics()
    with _held_port() as port:
        with pytest.raises(MetricsListenError) as raised:
            check_listen_address(f"127.0.0.1:{port}")
        assert str(raised.value) == _taken(port, "--metrics")
        assert raised.value.errno == errno.EADDRINUSE
        endpoint = MetricsEndpoint(metrics.registry, f"127.0.0.1:{port}")
        with pytest.raises(MetricsListenError, match=re.escape(_taken(port, "--metrics"))):
            endpoint.check()
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                with pytest.raises(MetricsListenError) as started:
                    await endpoint.start(tg)
                assert str(started.value) == _taken(port, "--metrics")
                assert isinstance(started.value, OSError)
    check_listen_address("127.0.0.1:0")
    with pytest.raises(ValueError, match="loopback"):
        check_listen_address("0.0.0.0:9465")


@contextlib.contextmanager
def _fakebr_with_confs(tmp_path: Path) -> Iterator[Path]:
    """A running brmcp-fakebr (users bot, alice) with ``--write-confs``;
    yields the confs directory (brmcp-serve/, brmcp-bridge-alice/)."""
    confs = tmp_path / "confs"
    cmd = [sys.executable, "-m", "brmcp.testing.fakebr", "--datadir", str(tmp_path / "br")]
    cmd += ["--users", "bot,alice", "--write-confs", str(confs)]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            if "Ctrl-C to stop" in line:
                break
            assert time.monotonic() < deadline
        else:
            raise AssertionError(f"brmcp-fakebr exited with {proc.wait()}")
        yield confs
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Daemon:
    """A daemon process whose stderr is read line by line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, *markers: str, timeout: float = 60) -> str | None:
        """The first marker seen in a stderr line, or None once the process
        has exited without any."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for marker in markers:
                    if any(marker in line for line in self.lines):
                        return marker
                if not self._reader.is_alive():
                    return None
                left = deadline - time.monotonic()
                assert left > 0, f"none of {markers} within {timeout} s: {self.lines}"
                self._changed.wait(left)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=10)
        return code


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


#: What a daemon that runs on without its metrics endpoint logs.
_RUNS_ON = "metrics endpoint not started"


def test_brmcp_serve_on_a_taken_metrics_port_is_one_line(tmp_path: Path) -> None:
    with _fakebr_with_confs(tmp_path) as confs, _held_port() as port:
        serve_dir = confs / "brmcp-serve"
        before = _files(serve_dir)
        daemon = _Daemon("brmcp.serve", "--datadir", str(serve_dir), "--metrics", f"127.0.0.1:{port}")
        seen = daemon.wait_for(_RUNS_ON)
        code = daemon.stop()
        assert seen is None, daemon.lines
        assert code == 1
        assert daemon.lines == [f"brmcp-serve: {_taken(port, '--metrics')}"]
        assert _files(serve_dir) == before


def test_brmcp_bridge_on_a_taken_metrics_port_is_one_line(tmp_path: Path) -> None:
    with _fakebr_with_confs(tmp_path) as confs, _held_port() as port:
        bridge_dir = confs / "brmcp-bridge-alice"
        before = _files(bridge_dir)
        daemon = _Daemon(
            "brmcp.bridge",
            *("--datadir", str(bridge_dir), "--listen", "127.0.0.1:0", "--metrics", f"127.0.0.1:{port}"),
        )
        seen = daemon.wait_for(_RUNS_ON)
        code = daemon.stop()
        assert seen is None, daemon.lines
        assert code == 1
        assert daemon.lines == [f"brmcp-bridge: {_taken(port, '--metrics')}"]
        assert _files(bridge_dir) == before


def test_a_stopped_bridge_says_it_stopped(tmp_path: Path) -> None:
    with _fakebr_with_confs(tmp_path) as confs:
        bridge_dir = confs / "brmcp-bridge-alice"
        daemon = _Daemon("brmcp.bridge", "--datadir", str(bridge_dir), "--listen", "127.0.0.1:0")
        assert daemon.wait_for("settings in force:") == "settings in force:", daemon.lines
        code = daemon.stop()
        assert code == 0, daemon.lines
        assert daemon.lines[-2].endswith("SIGTERM: stopping"), daemon.lines
        assert re.search(r"stopped \(\d+\.\d s after the signal\)$", daemon.lines[-1]), daemon.lines


# -- 3. metrics ------------------------------------------------------------------------


async def _scrape(metrics: ServeMetrics | BridgeMetrics, accept: str = "") -> str:
    endpoint = MetricsEndpoint(metrics.registry, "127.0.0.1:0")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await endpoint.start(tg)
            try:
                async with httpx2.AsyncClient(timeout=10) as http:
                    headers = {"accept": accept} if accept else {}
                    page = await http.get(endpoint.url, headers=headers)
            finally:
                await endpoint.stop()
    assert page.status_code == 200
    return page.text


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
async def test_metrics_have_build_info_and_no_created_series(accept: str) -> None:
    serve, bridge = ServeMetrics(), BridgeMetrics()
    serve.calls.labels("fortune", "ok").inc()
    serve.call_seconds.labels("fortune").observe(0.2)
    serve.tip_atoms.inc(10)
    bridge.calls.labels("fortune", "ok").inc()
    bridge.call_seconds.observe(0.3)
    bridge.payments.labels("paid").inc()
    python = ".".join(str(part) for part in sys.version_info[:3])
    for metrics in (serve, bridge):
        text = await _scrape(metrics, accept)
        assert "_created" not in text
        build_info = f'brmcp_build_info{{python="{python}",version="{brmcp.__version__}"}} 1.0'
        assert build_info in text
    assert 'brmcp_bridge_tool_calls_total{outcome="ok",tool="fortune"} 1.0' in text


def test_only_our_registries_drop_created_series() -> None:
    other = CollectorRegistry()
    Counter("host_requests", "A host's own counter", registry=other).inc()
    assert b"host_requests_created" in generate_latest(other)
    restricted = ServeMetrics().registry.restricted_registry(
        ["brmcp_serve_tip_atoms_total", "brmcp_serve_tip_atoms_created"]
    )
    assert b"_created" not in generate_latest(restricted)


def test_the_bridge_counts_tool_calls_by_tool_and_outcome() -> None:
    metrics = BridgeMetrics()
    metrics.calls.labels("fortune", "ok").inc()
    metrics.calls.labels("fortune", "tool_error").inc()
    metrics.calls.labels(tool="echo", outcome="ok").inc()
    value = metrics.registry.get_sample_value
    assert value("brmcp_bridge_tool_calls_total", {"tool": "fortune", "outcome": "ok"}) == 1
    assert value("brmcp_bridge_tool_calls_total", {"tool": "fortune", "outcome": "tool_error"}) == 1
    assert value("brmcp_bridge_tool_calls_total", {"tool": "echo", "outcome": "ok"}) == 1
    with pytest.raises(ValueError, match="label"):
        metrics.calls.labels("ok")


# -- 4. version line and log names -----------------------------------------------------


def test_brmcp_version_and_dash_dash_version_print_the_same_line() -> None:
    lines = []
    for args in (["version"], ["--version"]):
        done = subprocess.run(
            [sys.executable, "-m", "brmcp", *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        lines.append(done.stdout)
    assert lines == [f"brmcp {brmcp.__version__}\n"] * 2


_LOG_LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) (?P<name>[\w.]+): ")


def _logger_names(lines: list[str]) -> set[str]:
    return {m["name"] for m in map(_LOG_LINE.match, lines) if m is not None}


def test_a_normal_start_of_the_daemons_logs_brmcp_names_only(tmp_path: Path) -> None:
    with _fakebr_with_confs(tmp_path) as confs:
        serve = _Daemon("brmcp.serve", "--datadir", str(confs / "brmcp-serve"), "--metrics", "127.0.0.1:0")
        bridge = _Daemon(
            "brmcp.bridge",
            *("--datadir", str(confs / "brmcp-bridge-alice"), "--listen", "127.0.0.1:0"),
            *("--metrics", "127.0.0.1:0"),
        )
        try:
            assert serve.wait_for("metrics at http") is not None, serve.lines
            assert bridge.wait_for("settings in force") is not None, bridge.lines
            assert bridge.wait_for("metrics at http") is not None, bridge.lines
            url = next(re.search(r"http://\S+/metrics", line) for line in serve.lines if "metrics at" in line)
            assert url is not None
            page = httpx2.get(url.group(0), timeout=10)
            assert "brmcp_build_info{" in page.text
            assert "_created" not in page.text
        finally:
            codes = serve.stop(), bridge.stop()
    assert codes == (0, 0), serve.lines + bridge.lines
    for daemon in (serve, bridge):
        assert not any("uvicorn" in line for line in daemon.lines), daemon.lines
        names = _logger_names(daemon.lines)
        assert names, daemon.lines
        assert all(name.startswith("brmcp") for name in names), names
