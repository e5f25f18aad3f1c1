"""Typos in brmcp-serve.conf / brmcp-bridge.conf are reported by the daemons
with their line numbers (SECURITY.md "A local process"): an unknown key is a
warning (bisonbotkit files may carry other bots' keys), a line that is not
key=value stops the daemon with a one-line error that does not echo the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from brmcp.bridge.cli import main as bridge_main
from brmcp.serve.cli import main as serve_main

CONF_HEAD = "brrpcurl=wss://127.0.0.1:1/ws\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("prog", "name", "main"),
    [("brmcp-bridge", "brmcp-bridge.conf", bridge_main), ("brmcp-serve", "brmcp-serve.conf", serve_main)],
)
def test_a_line_that_is_not_key_value_stops_the_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], prog: str, name: str, main: object
) -> None:
    datadir = tmp_path / "d"
    conf = datadir / name
    _write(conf, CONF_HEAD + "\nrpcpass s3cret-in-a-broken-line\n")
    if prog == "brmcp-serve":
        _write(datadir / "brmcp.json", '{"allowed_uids": []}\n')
    assert callable(main)
    assert main(["--datadir", str(datadir)]) == 1
    err = capsys.readouterr().err
    assert f"{conf}:3: not a key=value line" in err
    assert err.startswith(f"{prog}: ")
    assert "s3cret" not in err


@pytest.mark.parametrize(
    ("name", "main"), [("brmcp-bridge.conf", bridge_main), ("brmcp-serve.conf", serve_main)]
)
def test_unknown_keys_are_warned_with_their_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    main: object,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    datadir = tmp_path / "d"
    conf = datadir / name
    missing = tmp_path / "nowhere"
    _write(
        conf,
        CONF_HEAD
        + "debgu=trace\n"
        + f"servercertpath={missing}/rpc.cert\nclientcertpath={missing}/c.cert\n"
        + f"clientkeypath={missing}/c.key\n"
        + "botname=other-bot\n",
    )
    _write(datadir / "brmcp.json", '{"allowed_uids": []}\n')
    assert callable(main)
    assert main(["--datadir", str(datadir)]) == 1  # then it stops on the missing certificates
    err = capsys.readouterr().err
    assert f"WARNING brmcp.botlog: {conf}:2: unknown key 'debgu' ignored (did you mean 'debug'?)" in err
    assert f"{conf}:6: unknown key 'botname' ignored" in err
