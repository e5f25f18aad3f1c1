"""``brmcp-bridge`` as a new user types it, run as a command: Go's one-dash
long options, a mistyped settings key, a forgotten ``--datadir``, and a
hand-edited ``mcpclient.json`` that fails to load while the daemon runs
(BRIDGE.md "Running the daemon", §Settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from brmcp.bridge import BridgeError
from brmcp.bridge.base import setting_names
from brmcp.bridge.daemon import RUNTIME_FILE
from tests.bridge.test_daemon import bridge_settings, running_daemon
from tests.kit.serve import serve_network

BOT = "ab" * 32
OTHER_DATADIR = "if the daemon runs with another data directory, add --datadir DIR to this command"


def bridge(*argv: str) -> subprocess.CompletedProcess[str]:
    """``brmcp-bridge ARGV…`` in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "brmcp.bridge", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def abridge(*argv: str) -> subprocess.CompletedProcess[str]:
    """:func:`bridge` from async code (the daemon keeps running meanwhile)."""
    return await anyio.to_thread.run_sync(lambda: bridge(*argv))


def test_go_style_single_dash_options(tmp_path: Path) -> None:
    d = str(tmp_path)
    for argv in (["-datadir", d, "spend"], [f"-datadir={d}", "spend"], ["spend", "-datadir", d]):
        done = bridge(*argv)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "no payments yet\nspent in the last 24 hours: 0 atoms\n"
        assert f"no {tmp_path / RUNTIME_FILE}" in done.stderr
    done = bridge("-datadir", d, "-listen", "127.0.0.1:9", "-log-level", "debug", "-json", "spend")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"entries": [], "day_total_atoms": 0}
    done = bridge("-datadir", d, "settings", "-show-token")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["token"] == ""
    assert bridge("-help").returncode == 0
    # A value that merely looks like an option is not touched.
    done = bridge("-datadir", d, "settings", "set", "token=-not-an-option-0123")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "mcpclient.json").read_text())["token"] == "-not-an-option-0123"


def test_a_mistyped_settings_key_names_the_one_meant(tmp_path: Path) -> None:
    done = bridge("--datadir", str(tmp_path), "settings", "set", "per_call_cap=5000")
    assert done.returncode == 1
    assert done.stderr == (
        "brmcp-bridge: unknown setting 'per_call_cap' (did you mean per_call_cap_atoms?); "
        f"keys: {', '.join(setting_names())}\n"
    )
    assert not (tmp_path / "mcpclient.json").exists()


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["approvals"], "brmcp-bridge: approvals live in the running daemon's memory, and it is not running"),
        (["ui"], "brmcp-bridge: the approvals page is served by the running daemon, and it is not running"),
        (["config-snippet", BOT], "brmcp-bridge: the daemon is not running"),
    ],
)
def test_a_forgotten_datadir_is_named_as_the_likely_cause(
    tmp_path: Path, argv: list[str], start: str
) -> None:
    """No daemon on this data directory: the command says how to start one
    there, and that a daemon running with another data directory needs
    ``--datadir`` on this command line."""
    datadir = tmp_path / "not-the-daemon-s"
    done = bridge("--datadir", str(datadir), *argv)
    assert done.returncode == 1
    line = done.stderr.strip()
    assert line.count("\n") == 0
    assert line.startswith(start), line
    assert line.endswith(
        f"(no {datadir / RUNTIME_FILE}); start it with: brmcp-bridge --datadir {datadir} ({OTHER_DATADIR})"
    ), line
    # Reading the files says it too: they may be another directory's.
    done = bridge("--datadir", str(datadir), "spend")
    assert done.returncode == 0
    assert done.stderr.strip().endswith(f"({OTHER_DATADIR})")


async def test_a_hand_edit_that_fails_to_load_is_never_overwritten(tmp_path: Path) -> None:
    """The user raised the per-call cap and added a trailing comma in one
    edit, then sent SIGHUP: the reload is refused and the daemon keeps the
    settings it had. ``settings`` says the file on disk fails to load (and
    why) and that the daemon runs on its previous settings; ``settings
    set`` refuses to write over the file (which would drop the hand edit:
    the daemon never loaded it); once the file is fixed and reloaded, a set
    keeps every key the daemon has."""
    with anyio.fail_after(120):
        async with serve_network(tmp_path) as env:
            datadir = tmp_path / "bridge"
            d = str(datadir)
            first = bridge_settings(env.bot.uid, mode="approval", per_call_cap_atoms=0)
            async with running_daemon(env, datadir, first) as daemon:
                path = datadir / "mcpclient.json"
                edited = path.read_text().replace('"per_call_cap_atoms": 0', '"per_call_cap_atoms": 20000')
                edited = edited.replace(
                    '"tip_wait_secs": 180', f'"tip_wait_secs": 180,\n  "prepay_bots": ["{env.bot.uid}"],'
                )
                path.write_text(edited)
                with pytest.raises(BridgeError, match="Expecting property name"):
                    await daemon.reload()  # what SIGHUP does; the daemon logs "reload refused"
                assert daemon.bridge.settings == first

                shown = await abridge("--datadir", d, "--json", "settings")
                assert shown.returncode == 0, shown.stderr
                assert json.loads(shown.stdout)["per_call_cap_atoms"] == 0  # what the daemon runs on
                warning = shown.stderr.strip()
                assert warning.startswith(f"brmcp-bridge: warning: parse {path}: Expecting property name"), (
                    warning
                )
                assert "the daemon (pid" in warning
                assert "still runs on the settings it loaded before, shown below" in warning
                assert "fix the file, then send it SIGHUP (kill -HUP" in warning

                refused = await abridge("--datadir", d, "settings", "set", "mode=autopay")
                assert refused.returncode == 1
                line = refused.stderr.strip()
                assert line.startswith(f"brmcp-bridge: parse {path}: Expecting property name"), line
                assert "nothing was changed" in line
                assert "fix it or remove it, then change the settings again" in line
                assert path.read_text() == edited  # the hand edit is still there
                assert daemon.bridge.settings == first

                # Fixed and reloaded: the edit is in force, and a set keeps it.
                path.write_text(edited.replace('"],\n}', '"]\n}'))
                reloaded = await daemon.reload()
                assert (reloaded.per_call_cap_atoms, reloaded.prepay_bots) == (20_000, (env.bot.uid,))
                changed = await abridge("--datadir", d, "--json", "settings", "set", "mode=autopay")
                assert changed.returncode == 0, changed.stderr
                on_disk = json.loads(path.read_text())
                assert on_disk == reloaded.replace(mode="autopay").to_dict()
                shown = await abridge("--datadir", d, "settings")
                assert shown.stderr == ""
