"""Options a user types after the command: ``brmcp-serve balances --json``,
``brmcp-bridge spend --json --datadir D`` mean the same as with the options
first (README: "add ``--json`` for machine-readable output"); and
``brmcp-fakebr --port`` out of range is one clear line, not a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from brmcp.bridge.cli import main as bridge_main
from brmcp.serve.cli import main as serve_main
from brmcp.server.store import open_database
from brmcp.testing.fakebr.cli import main as fakebr_main

BOT = "b" * 64


def _run(main: Callable[[Sequence[str] | None], int], *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
            if isinstance(exc.code, str):
                err.write(exc.code + "\n")
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("command", [["balances"], ["stats"], ["statement", "a" * 64]])
def test_serve_reports_take_json_and_datadir_after_the_command(tmp_path: Path, command: list[str]) -> None:
    open_database(tmp_path).close()
    first = _run(serve_main, "--datadir", str(tmp_path), "--json", *command)
    assert first[0] == 0
    json.loads(first[1])
    assert _run(serve_main, "--datadir", str(tmp_path), *command, "--json") == first
    assert _run(serve_main, *command, "--json", "--datadir", str(tmp_path)) == first
    # Without --json anywhere: the table, not JSON.
    plain = _run(serve_main, *command, "--datadir", str(tmp_path))
    assert plain[0] == 0
    assert plain[1] != first[1]


def test_bridge_commands_take_json_and_datadir_after_the_command(tmp_path: Path) -> None:
    entries = [
        {
            "ts": int(time.time()) - 60,
            "bot": BOT,
            "tool": "fortune",
            "rail": "tip",
            "atoms": 7,
            "status": "paid",
        }
    ]
    (tmp_path / "mcpspend.json").write_text(json.dumps(entries))
    first = _run(bridge_main, "--datadir", str(tmp_path), "--json", "spend")
    assert first[0] == 0
    assert json.loads(first[1])["entries"] == entries
    assert _run(bridge_main, "--datadir", str(tmp_path), "spend", "--json") == first
    assert _run(bridge_main, "spend", "--json", "--datadir", str(tmp_path)) == first
    plain = _run(bridge_main, "spend", "--datadir", str(tmp_path))
    assert plain[0] == 0
    assert "spent in the last 24 hours: 7 atoms" in plain[1]
    status, out, _ = _run(bridge_main, "settings", "--datadir", str(tmp_path), "--json")
    assert status == 0
    assert json.loads(out)["mode"] == "approval"


@pytest.mark.parametrize(("port", "users"), [("70000", "bot"), ("65535", "bot,alice"), ("-5", "bot")])
def test_fakebr_port_out_of_range_is_one_line(tmp_path: Path, port: str, users: str) -> None:
    status, out, err = _run(fakebr_main, "--datadir", str(tmp_path / "br"), "--users", users, "--port", port)
    assert status != 0
    assert out == ""
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("brmcp-fakebr")
    assert "--port" in err.strip().splitlines()[-1]
