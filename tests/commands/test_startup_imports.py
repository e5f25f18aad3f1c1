"""The console commands start without the heavy parts they do not use.

``--version``, ``--help`` and the ``brmcp-bridge`` commands that only talk
to a running daemon must not import the MCP SDK, the web server, the
PostgreSQL driver or the daemon itself: importing them is what made these
commands take seconds (bench/startup_bench.py measures the time; this test
holds the cause by module set, which does not depend on the machine's load).
Each case runs in a fresh interpreter, since this process has imported
everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: What none of the light command lines may load.
HEAVY = (
    "mcp",
    "uvicorn",
    "starlette.applications",
    "starlette.routing",
    "psycopg",
    "brmcp.transport",
    "brmcp.clientrpc",
    "brmcp.bridge.agent",
    "brmcp.bridge.find",
    "brmcp.bridge.pay",
    "brmcp.bridge.daemon._daemon",
)


def _loaded_after(code: str) -> list[str]:
    """The modules of :data:`HEAVY` that are in ``sys.modules`` after
    ``code`` ran in a fresh interpreter (a SystemExit from argparse's
    ``--version`` or ``--help`` ends ``code`` normally)."""
    probe = (
        "import contextlib, io, json, sys\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    try:\n" + "".join(f"        {line}\n" for line in code.splitlines()) + "    except SystemExit:\n"
        "        pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_import_brmcp_is_light() -> None:
    assert _loaded_after("import brmcp") == []


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["version"]])
def test_brmcp_command_is_light(args: list[str]) -> None:
    assert _loaded_after(f"from brmcp.cli import main\nmain({args!r})") == []


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["approvals", "--help"]])
def test_bridge_version_and_help_are_light(args: list[str]) -> None:
    assert _loaded_after(f"from brmcp.bridge.cli import main\nmain({args!r})") == []


@pytest.mark.parametrize("command", ["approvals", "ui", "config-snippet " + "ab" * 32])
def test_bridge_daemon_commands_are_light(tmp_path: Path, command: str) -> None:
    """With no daemon on the data directory they fail, after the same
    imports as when they reach one (locating it and calling its admin API)."""
    args = ["--datadir", str(tmp_path), *command.split()]
    assert _loaded_after(f"from brmcp.bridge.cli import main\nmain({args!r})") == []


def test_runtime_file_reader_is_light() -> None:
    assert _loaded_after("from brmcp.bridge.daemon import read_runtime, runtime_stale_reason") == []


def test_lazy_exports_still_resolve() -> None:
    """Every name of ``__all__`` of the packages made lazy is there, is the
    defining module's object, and ``from … import`` works for it."""
    code = (
        "import importlib\n"
        "for name in ('brmcp', 'brmcp.bridge', 'brmcp.bridge.daemon', 'brmcp.bridge.cli'):\n"
        "    package = importlib.import_module(name)\n"
        "    for export in package.__all__:\n"
        "        assert getattr(package, export) is not None, (name, export)\n"
        "        assert export in dir(package), (name, export)\n"
        "from brmcp.bridge import Bridge, BridgeDaemon, DEFAULT_LISTEN\n"
        "from brmcp.bridge._bridge import Bridge as B\n"
        "assert Bridge is B\n"
        "from brmcp import Router\n"
        "from brmcp.transport.router import Router as R\n"
        "assert Router is R\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    probe = subprocess.run(
        [sys.executable, "-c", "import brmcp.bridge as b; b.NoSuchName"], capture_output=True, text=True
    )
    assert probe.returncode == 1
    assert "has no attribute 'NoSuchName'" in probe.stderr
