"""The ``brmcpdir`` command (brmcp/directory/cli.py): the first run writes
the bot config and the policy template and exits 0; Go's ``-datadir`` is
accepted; unusable files are one line on stderr with status 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brmcp.directory.cli import default_datadir, main
from brmcp.directory.model import Policy, load_policy


def test_first_run_writes_files_and_exits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    datadir = tmp_path / "d"
    assert main(["-datadir", str(datadir)]) == 0
    out = capsys.readouterr().out
    assert str(datadir / "brmcpdir.conf") in out
    assert str(datadir / "brmcpdir.json") in out
    assert load_policy(datadir / "brmcpdir.json") == Policy()
    assert json.loads((datadir / "brmcpdir.json").read_text())["admin_uids"] == []
    assert (datadir / "brmcpdir.json").stat().st_mode & 0o777 == 0o600


def test_bad_policy_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--datadir", str(tmp_path)]) == 0
    (tmp_path / "brmcpdir.json").write_text('{"listing_fee_atoms": true}')
    capsys.readouterr()
    assert main(["--datadir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("brmcpdir: ")
    assert 'key "listing_fee_atoms": value true' in err


def test_unusable_bot_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--datadir", str(tmp_path)]) == 0
    conf = tmp_path / "brmcpdir.conf"
    conf.write_text(conf.read_text().replace("servercertpath=", f"servercertpath={tmp_path}/missing.cert#"))
    capsys.readouterr()
    assert main(["--datadir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("brmcpdir: ")
    assert "missing.cert" in err[-1] or "file not found" in err[-1]


def test_default_datadir_is_gos() -> None:
    assert default_datadir().name in (".brmcpdir", "Brmcpdir")
