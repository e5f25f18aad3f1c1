"""brmcp-bridge subcommands without a daemon to ask: ``settings`` and
``spend`` read the files (and say so), ``settings set`` edits
``mcpclient.json`` with the daemon's validation, ``approvals`` explains that
it needs the daemon; stale runtime files (a daemon killed with SIGKILL, a
reused pid) are recognised."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brmcp.bridge import Settings
from brmcp.bridge.base import load_settings
from brmcp.bridge.cli import main
from brmcp.bridge.daemon._runtime import RUNTIME_FILE, process_started, runtime_stale_reason

BOT = "ab" * 32
OTHER_DATADIR = "if the daemon runs with another data directory, add --datadir DIR to this command"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_settings_set_and_show_without_a_daemon(tmp_path: Path) -> None:
    datadir = tmp_path / "new" / "bridge"  # configured before the first start: nothing exists yet
    d = str(datadir)
    runtime = datadir / RUNTIME_FILE
    path = datadir / "mcpclient.json"

    status, out, err = run("--datadir", d, "settings")
    assert status == 0
    assert json.loads(out) == Settings().to_dict()
    assert err.strip() == (
        f"brmcp-bridge: the daemon is not running (no {runtime}); {path} does not exist yet (defaults shown)"
        f" ({OTHER_DATADIR})"
    )

    # The CLI's validation, before anything is written.
    for pair, message in [
        ("mode=autopy", "mode='autopy': use approval or autopay"),
        ("enabled=maybe", "enabled='maybe': use true or false"),
        ("allowed_bots=nothex", 'allowed bot "nothex" is not a 64-hex uid'),
        ("colour=blue", "unknown setting 'colour'"),
        ("per_day_cap_atoms=lots", "per_day_cap_atoms='lots': not an integer number of atoms"),
        ("token=abc", "token is 3 character(s): use at least 16 (or token= and enabled=true"),
        ("token=0123456789abcde", "token is 15 character(s): use at least 16"),
        ("token=0123456789 abcdef", "token must not contain spaces"),
    ]:
        status, _, err = run("--datadir", d, "settings", "set", pair)
        assert status == 1, pair
        assert err.startswith(f"brmcp-bridge: {message}"), pair
        assert err.count("\n") == 1
        assert not path.exists()

    status, out, err = run(
        "--datadir", d, "--json", "settings", "set", "enabled=true", "mode=AUTOPAY", f"allowed_bots={BOT}"
    )
    assert status == 0, err
    assert err.strip() == (
        f"brmcp-bridge: saved {path}; the daemon is not running (no {runtime}), so these settings "
        f"apply when it starts: brmcp-bridge --datadir {datadir} ({OTHER_DATADIR})"
    )
    saved = load_settings(path)
    assert (saved.enabled, saved.mode, saved.allowed_bots) == (True, "autopay", (BOT,))
    assert len(saved.token) == 32  # minted when enabling without one, as the daemon does
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(out) == {**saved.to_dict(), "token": "<hidden>"}

    status, out, err = run("--datadir", d, "settings")
    assert status == 0
    assert json.loads(out) == {**saved.to_dict(), "token": "<hidden>"}
    assert saved.token not in out
    assert err.strip() == (
        f"brmcp-bridge: the daemon is not running (no {runtime}); read from {path} ({OTHER_DATADIR})"
    )
    status, out, _ = run("--datadir", d, "--json", "settings", "--show-token")
    assert json.loads(out) == saved.to_dict()

    # A token of at least 16 characters may be set.
    status, _, err = run("--datadir", d, "settings", "set", "token=0123456789abcdef")
    assert status == 0, err
    assert load_settings(path).token == "0123456789abcdef"
    status, _, err = run("--datadir", d, "settings", "set", f"token={saved.token}")
    assert status == 0, err

    # A later change keeps the token; a malformed file is named and left alone.
    status, _, _ = run("--datadir", d, "settings", "set", "per_call_cap_atoms=500")
    assert status == 0
    assert load_settings(path) == saved.replace(per_call_cap_atoms=500)
    path.write_text('{"enabled": "yes"}')
    for argv in (["settings"], ["settings", "set", "mode=approval"]):
        status, _, err = run("--datadir", d, *argv)
        assert status == 1
        assert err.startswith(f"brmcp-bridge: parse {path}: ")
    assert path.read_text() == '{"enabled": "yes"}'


def test_a_file_mode_the_cli_refuses_still_loads_as_approval(tmp_path: Path) -> None:
    """Go compatibility: a hand-written unknown mode means approval when loaded."""
    path = tmp_path / "mcpclient.json"
    path.write_text('{"mode": "autopy"}')
    assert load_settings(path).mode == "approval"
    status, out, _ = run("--datadir", str(tmp_path), "settings")
    assert status == 0
    assert json.loads(out)["mode"] == "approval"


def test_spend_from_the_file(tmp_path: Path) -> None:
    now = int(time.time())
    entries = [
        {"ts": now - 2 * 86400, "bot": BOT, "tool": "old", "rail": "tip", "atoms": 7, "status": "paid"},
        {"ts": now - 60, "bot": BOT, "tool": "fortune", "rail": "tip", "atoms": 10_000, "status": "paid"},
        {"ts": now - 30, "bot": BOT, "tool": "fortune", "rail": "tip", "atoms": 10_000}
        | {"status": "failed", "err": "no route"},
        {"ts": now - 20, "bot": BOT, "tool": "fortune", "rail": "tip", "atoms": 10_000}
        | {"status": "failed", "err": "denied", "prepay": True},
    ]
    path = tmp_path / "mcpspend.json"
    path.write_text(json.dumps(entries, indent=2))
    status, out, err = run("--datadir", str(tmp_path), "--json", "spend")
    assert status == 0
    assert json.loads(out) == {"entries": entries, "day_total_atoms": 10_000}
    assert err.strip() == (
        f"brmcp-bridge: the daemon is not running (no {tmp_path / RUNTIME_FILE}); read from {path}"
        f" ({OTHER_DATADIR})"
    )
    status, out, _ = run("--datadir", str(tmp_path), "spend")
    assert status == 0
    assert "failed (no route)" in out
    # A prepayment is marked as one in the table too (the JSON has "prepay": true).
    assert "failed (prepayment) (denied)" in out
    # Atoms with thousands separators in the table, as on the approvals page.
    assert "  10,000  paid" in out
    assert "10000" not in out
    assert out.endswith("spent in the last 24 hours: 10,000 atoms\n")
    path.write_text("[{")
    status, _, err = run("--datadir", str(tmp_path), "spend")
    assert status == 1
    assert err.startswith(f"brmcp-bridge: parse {path}: ")


def test_approvals_need_the_daemon(tmp_path: Path) -> None:
    d = str(tmp_path)
    status, _, err = run("--datadir", d, "approvals")
    assert status == 1
    assert err.strip() == (
        "brmcp-bridge: approvals live in the running daemon's memory, and it is not running "
        f"(no {tmp_path / RUNTIME_FILE}); start it with: brmcp-bridge --datadir {tmp_path} ({OTHER_DATADIR})"
    )
    status, _, err = run("--datadir", d, "approvals", "approve")
    assert status == 1
    assert err.strip() == (
        f"brmcp-bridge: approvals approve needs a payment ID; list them with: "
        f"brmcp-bridge --datadir {tmp_path} approvals"
    )


def test_a_stale_runtime_file_means_not_running(tmp_path: Path) -> None:
    runtime = tmp_path / RUNTIME_FILE
    (tmp_path / "mcpadmin.token").write_text("f" * 32 + "\n")
    pid = dead_pid()
    runtime.write_text(json.dumps({"pid": pid, "url": "http://127.0.0.1:1", "sighup": True}))
    stale = f"stale runtime file {runtime}: process {pid} is gone"
    status, _, err = run("--datadir", str(tmp_path), "approvals")
    assert status == 1
    assert stale in err
    status, out, err = run("--datadir", str(tmp_path), "settings")
    assert status == 0
    assert json.loads(out) == Settings().to_dict()
    assert f"the daemon is not running ({stale})" in err
    # settings set edits the file and signals nobody.
    status, _, err = run("--datadir", str(tmp_path), "settings", "set", "per_day_cap_atoms=9")
    assert status == 0
    assert f"the daemon is not running ({stale}), so these settings apply when it starts" in err
    assert load_settings(tmp_path / "mcpclient.json").per_day_cap_atoms == 9


def test_runtime_stale_reason() -> None:
    me = os.getpid()
    assert runtime_stale_reason({"pid": me}) is None
    assert runtime_stale_reason({"pid": me, "started": None}) is None
    assert runtime_stale_reason({"pid": "1"}) == "it names no process"
    assert runtime_stale_reason({}) == "it names no process"
    gone = dead_pid()
    assert runtime_stale_reason({"pid": gone}) == f"process {gone} is gone"


@pytest.mark.skipif(process_started(os.getpid()) is None, reason="no /proc start times on this system")
def test_a_reused_pid_is_recognised(tmp_path: Path) -> None:
    me = os.getpid()
    started = process_started(me)
    assert isinstance(started, int)
    assert runtime_stale_reason({"pid": me, "started": started}) is None
    record = {"pid": me, "started": started + 1, "url": "http://127.0.0.1:1", "sighup": True}
    assert runtime_stale_reason(record) == f"pid {me} now belongs to another process"
    (tmp_path / RUNTIME_FILE).write_text(json.dumps(record))
    status, _, err = run("--datadir", str(tmp_path), "approvals")
    assert status == 1
    assert f"pid {me} now belongs to another process" in err
