"""What a new user meets in the first hour, as commands they run:

* a taken port: ``brmcp-fakebr --port``, ``brmcp demo --port`` and the
  daemons' ``--metrics`` each print one line naming the address, exit 1 and
  leave nothing behind;
* metrics: no ``_created`` series, a ``brmcp_build_info`` metric, the
  bridge's tool-call counter labelled by tool;
* ``brmcp version`` and ``brmcp --version`` agree, and a normal start of the
  daemons logs under brmcp's logger names only (no ``uvicorn.error``).

``brmcp demo --network real`` from an installed brmcp is in test_brnet_install.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

import brmcp
from brmcp.metrics import (
    BridgeMetrics,
    MetricsEndpoint,
    MetricsListenError,
    ServeMetrics,
    check_listen_address,
)

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


# -- 1. a taken port -------------------------------------------------------------------


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


@pytest.mark.slow  # over 10 s of subprocess start-ups
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
    # The port below the held one must be free for the first listener; a
    # process beside this test (a parallel worker) may take it meanwhile, so
    # a try whose first port was the taken one is made again on another.
    for _ in range(5):
        with _held_port() as port:
            argv = ["--datadir", str(datadir), "--users", "bot,alice", "--port", str(port - 1)]
            assert cli.main(argv) == 1
            said = capsys.readouterr().err.splitlines()
            if said == [f"brmcp-fakebr: {_taken(port - 1, '--port')}"]:
                continue
            assert said == [f"brmcp-fakebr: {_taken(port, '--port')}"]
            assert not datadir.exists()
            # A data directory that was there before keeps what it had.
            datadir.mkdir()
            (datadir / "notes.txt").write_text("mine")
            assert cli.main(argv) == 1
            assert sorted(p.name for p in datadir.iterdir()) == ["notes.txt"]
            return
    pytest.fail("the port below a held one was taken by another process five times")


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


@pytest.mark.slow  # over 10 s of subprocess start-ups
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


# -- 2. metrics ------------------------------------------------------------------------


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


# -- 3. version line and log names -----------------------------------------------------


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


@pytest.mark.slow  # over 10 s of subprocess start-ups
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
