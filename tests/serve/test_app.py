"""brmcp-serve end to end: first-run templates, brmcp.json validation, the
serve app on a fake brclient with a caller on another (tools/list, a free
call, payment_required, a tip, the keyed retry charged once), hot reload of
the allowlist and rate, and the console command with SIGHUP/SIGTERM
(README §Running a real bot)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp.types import TextContent

from brmcp import parse_payment_required
from brmcp.clientrpc import atoms_to_dcr, load_bot_config
from brmcp.serve import (
    ECHO_DESCRIPTION,
    FORTUNE_DESCRIPTION,
    FORTUNES,
    TEMPLATE,
    ServeConfig,
    ServeConfigError,
    load_serve_config,
    main,
    write_serve_config,
)
from brmcp.server import RATE_LIMITED_TEXT
from tests.kit.serve import caller_on, prepare_serve_dir, serve_network, until


def text_of(result: object) -> str:
    content = getattr(result, "content", [])
    return "\n".join(c.text for c in content if isinstance(c, TextContent))


# -- first run and configuration ----------------------------------------------------------


def test_first_run_writes_the_templates_and_exits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    datadir = tmp_path / "d"
    assert main(["--datadir", str(datadir)]) == 0
    harness_file = datadir / "brmcp.json"
    conf = datadir / "brmcp-serve.conf"
    assert harness_file.read_bytes() == b'{\n  "allowed_uids": [],\n  "calls_per_minute": 30\n}'
    assert harness_file.read_text() == TEMPLATE
    assert stat.S_IMODE(harness_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    assert stat.S_IMODE(datadir.stat().st_mode) == 0o700
    cfg = load_bot_config(conf)
    brclient = Path.home() / ".brclient"
    assert cfg.brrpcurl == "wss://127.0.0.1:7676/ws"
    assert (cfg.servercertpath, cfg.clientcertpath, cfg.clientkeypath) == (
        str(brclient / "rpc.cert"),
        str(brclient / "rpc-client.cert"),
        str(brclient / "rpc-client.key"),
    )
    assert len(cfg.rpcuser) == 8
    assert len(cfg.rpcpass) == 16
    assert (cfg.debug, cfg.maxlogfiles, cfg.maxbufferlines) == ("info", 5, 1000)
    assert cfg.datadir == str(datadir)
    assert cfg.logfile == str(datadir / "logs" / "brmcp-serve.log")
    out = capsys.readouterr().out
    assert str(conf) in out
    assert str(harness_file) in out
    assert "allowed_uids" in out
    assert "jsonrpclisten" in out

    # Only a missing file is recreated; the other is left alone, and it is again a first run.
    conf_text = conf.read_text()
    harness_file.unlink()
    assert main(["--datadir", str(datadir)]) == 0
    assert harness_file.read_text() == TEMPLATE
    assert conf.read_text() == conf_text

    # Next run: the defaults point at a brclient that is not here, named in one line.
    capsys.readouterr()
    assert main(["--datadir", str(datadir)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err == (
        f"brmcp-serve: servercertpath {brclient / 'rpc.cert'}: file not found "
        f"(see {datadir / 'brmcp-serve.conf'})"
    )


def test_logging_follows_the_conf_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """debug sets the threshold (--log-level overrides it), logfile gets a
    copy of the log, and a log file that cannot be opened is one line."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    datadir = tmp_path / "d"
    d = str(datadir)
    assert main(["--datadir", d]) == 0
    conf = datadir / "brmcp-serve.conf"
    logfile = datadir / "logs" / "brmcp-serve.log"
    # An INFO line logged before the (expected) failure to find brclient's files.
    (datadir / "brmcp.json").write_text('{"allowed_uids": [], "directory": {}}')
    info = (
        "INFO brmcp.serve: "
        + f"{datadir / 'brmcp.json'}: the directory block is empty: this bot is not listed in any directory"
    )
    capsys.readouterr()

    assert main(["--datadir", d]) == 1  # debug=info (bisonbotkit's default)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].endswith(info)
    assert err[1].startswith("brmcp-serve: servercertpath ")
    assert _lines_with(logfile, "the directory block is empty") == 1
    assert stat.S_IMODE(logfile.parent.stat().st_mode) == 0o700

    conf.write_text(conf.read_text().replace("debug=info", "debug=warn"))
    assert main(["--datadir", d]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert _lines_with(logfile, "the directory block is empty") == 1
    assert main(["--datadir", d, "--log-level", "trace"]) == 1
    assert capsys.readouterr().err.splitlines()[0].endswith(info)
    assert _lines_with(logfile, "the directory block is empty") == 2

    logdir = str(datadir / "logs")
    conf.write_text(conf.read_text().replace(f"logfile={logdir}/brmcp-serve.log", f"logfile={logdir}"))
    assert main(["--datadir", d]) == 1
    err = capsys.readouterr().err
    assert err == f"brmcp-serve: cannot open log file {logdir}: is a directory (logfile in {conf})\n"


def _lines_with(path: Path, text: str) -> int:
    return sum(text in line for line in path.read_text().splitlines())


def test_console_command_first_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "brmcp.serve", "--datadir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "d" / "brmcp.json").read_text() == TEMPLATE
    assert "brmcp-serve.conf" in done.stdout


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "expected a JSON object, got a list"),
        ('{"allowed_uids": "abc"}', "allowed_uids must be a list of uids, got a string"),
        ('{"allowed_uids": ["abc"]}', 'allowed_uids[0] "abc" is not a Bison Relay uid'),
        ('{"allowed_uids": ["' + "a" * 64 + '", "' + "g" * 64 + '"]}', "allowed_uids[1]"),
        ('{"allowed_uids": ["' + "a" * 63 + '"]}', "allowed_uids[0]"),
        ('{"allowed_uids": [7]}', "allowed_uids[0] 7 is not"),
        ('{"calls_per_minute": "30"}', "calls_per_minute must be an integer, got a string"),
        ('{"calls_per_minute": 2.5}', "calls_per_minute must be an integer, got a number"),
        ('{"calls_per_minute": true}', "calls_per_minute must be an integer, got a boolean"),
        ('{"calls_per_minute": -1}', "calls_per_minute must be >= 0"),
    ],
)
def test_bad_brmcp_json_is_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, needle: str
) -> None:
    path = tmp_path / "brmcp.json"
    path.write_text(content)
    with pytest.raises(ServeConfigError) as info:
        load_serve_config(path)
    assert str(info.value).startswith(f"{path}: ")
    assert needle in str(info.value)
    # The command reports it in one line and exits 1 (before touching brclient).
    (tmp_path / "brmcp-serve.conf").write_text("brrpcurl=wss://127.0.0.1:1/ws\n")
    assert main(["--datadir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert str(path) in err
    assert needle in err


def test_brmcp_json_accepted_forms(tmp_path: Path) -> None:
    path = tmp_path / "brmcp.json"
    upper = "AB" * 32
    path.write_text(
        json.dumps({"allowed_uids": [upper, upper.lower()], "calls_per_minute": 0, "directory": {}})
    )
    cfg = load_serve_config(path)
    assert cfg == ServeConfig(allowed_uids=(upper.lower(),), calls_per_minute=0)
    assert cfg.rate == 30
    path.write_text('{"allowed_uids": null}')
    assert load_serve_config(path) == ServeConfig()
    write_serve_config(path, ServeConfig(allowed_uids=("cd" * 32,), calls_per_minute=5))
    assert (
        path.read_text()
        == '{\n  "allowed_uids": [\n    "' + "cd" * 32 + '"\n  ],\n  "calls_per_minute": 5\n}'
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(ServeConfigError, match="file not found"):
        load_serve_config(tmp_path / "missing.json")


# -- serving ------------------------------------------------------------------------------


async def test_paid_fortune_end_to_end_over_two_fake_brclients(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with serve_network(tmp_path) as env, caller_on(env.alice) as alice:
            harness = env.app.harness
            async with alice.session(env.bot.uid) as s:
                init = await s.initialize()
                assert (init.server_info.name, init.server_info.version) == ("brmcp-example", "0.1.0")
                tools = {t.name: t for t in (await s.list_tools()).tools}
                assert set(tools) == {"echo", "fortune"}
                echo, fortune = tools["echo"], tools["fortune"]
                assert echo.description == ECHO_DESCRIPTION
                assert fortune.description == FORTUNE_DESCRIPTION
                assert echo.meta == {"brmcp/priceAtoms": 0}
                assert fortune.meta == {"brmcp/priceAtoms": 10_000}
                assert echo.input_schema == {
                    "type": "object",
                    "properties": {"text": {"type": "string", "description": "the text to echo back"}},
                    "required": ["text"],
                    "additionalProperties": False,
                }
                assert fortune.input_schema == {"type": "object", "additionalProperties": False}

                result = await s.call_tool("echo", {"text": "hello over BR"})
                assert not result.is_error
                assert result.structured_content == {"echo": "hello over BR"}

                key = "0123456789abcdef0123456789abcdef"
                refused = await s.call_tool("fortune", {}, meta={"brmcp/callKey": key})
                assert refused.is_error
                pr = parse_payment_required(refused)
                assert pr is not None
                assert (pr.tool, pr.price_atoms, pr.balance_atoms, pr.shortfall_atoms) == (
                    "fortune",
                    10_000,
                    0,
                    10_000,
                )
                assert list(pr.accepted_rails) == ["tip"]

                await alice.client.tip_user(env.bot.uid, atoms_to_dcr(pr.shortfall_atoms), 3)

                async def funded() -> bool:
                    return await harness.balance(env.alice.uid) == 10_000

                await until(funded)
                paid = await s.call_tool("fortune", {}, meta={"brmcp/callKey": key})
                assert not paid.is_error, text_of(paid)
                assert paid.structured_content is not None
                assert paid.structured_content["fortune"] in FORTUNES
                # The same key again: the first outcome replayed, nothing charged.
                again = await s.call_tool("fortune", {}, meta={"brmcp/callKey": key})
                assert again.structured_content == paid.structured_content
            statement = await harness.statement(env.alice.uid)
            assert [(e.kind, e.atoms) for e in statement] == [("tip", 10_000), ("charge", -10_000)]
            assert [e.call_key for e in statement if e.kind == "charge"] == [key]
            assert await harness.balance(env.alice.uid) == 0
            assert harness.executions == 2  # echo once, fortune once


async def test_reload_applies_allowlist_and_rate_without_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    with anyio.fail_after(60):
        async with serve_network(tmp_path, allowed=[]) as env, caller_on(env.alice) as alice:
            app = env.app
            assert "NO CALLER IS ALLOWED" in caplog.text
            # Refused callers are ignored, not answered with an error: say so.
            assert "MCP messages from every caller are ignored (their requests get no answer" in caplog.text
            assert "refused" not in caplog.text
            assert str(app.config_path) in caplog.text
            assert not app.harness.allowed(env.alice.uid)
            # Her tip while not allowed is held, not lost.
            assert await app.harness.record_tip(env.alice.uid, 5_000_000, 901) == (True, 0)

            write_serve_config(
                app.config_path, ServeConfig(allowed_uids=(env.alice.uid,), calls_per_minute=2)
            )
            caplog.clear()
            config = app.reload()
            assert config.allowed_uids == (env.alice.uid,)
            assert app.harness.allowed(env.alice.uid)
            # What SIGHUP does after the reload: the held tip is credited, once.
            assert await app.release_held_tips() == 5_000
            assert await app.release_held_tips() == 0
            assert await app.harness.balance(env.alice.uid) == 5_000
            assert app.harness.calls_per_minute == 2
            assert "NO CALLER IS ALLOWED" not in caplog.text
            async with alice.session(env.bot.uid) as s:
                await s.initialize()
                await s.list_tools()
                first = await s.call_tool("echo", {"text": "1"})
                second = await s.call_tool("echo", {"text": "2"})
                third = await s.call_tool("echo", {"text": "3"})
            assert not first.is_error
            assert not second.is_error
            assert third.is_error
            assert text_of(third) == RATE_LIMITED_TEXT

            # A bad file is refused and the settings in force stay.
            app.config_path.write_text('{"allowed_uids": ["nope"]}')
            with pytest.raises(ServeConfigError, match="allowed_uids"):
                app.reload()
            assert app.harness.allowed(env.alice.uid)
            assert app.config.calls_per_minute == 2

            # Removing the caller takes effect for new messages at once.
            write_serve_config(app.config_path, TEMPLATE)
            app.reload()
            assert not app.harness.allowed(env.alice.uid)
            assert "NO CALLER IS ALLOWED" in caplog.text


async def _read_until(stream: anyio.abc.ByteReceiveStream, buffer: bytearray, needle: bytes) -> None:
    while needle not in buffer:
        buffer.extend(await stream.receive())


async def test_console_command_serves_and_reloads_on_sighup(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with anyio.fail_after(90):
        from tests.kit.clientrpc import fake_network

        async with fake_network(tmp_path / "br", "bot", "alice") as (_, (bot, alice)):
            datadir = tmp_path / "serve"
            prepare_serve_dir(datadir, bot, None)  # the template: nobody allowed
            cmd = [sys.executable, "-m", "brmcp.serve", "--datadir", str(datadir)]
            async with await anyio.open_process(cmd, env=env, stderr=subprocess.PIPE) as proc:
                try:
                    assert proc.stderr is not None
                    log = bytearray()
                    await _read_until(proc.stderr, log, f"serving as bot (uid {bot.uid})".encode())
                    assert b"NO CALLER IS ALLOWED" in log
                    write_serve_config(datadir / "brmcp.json", ServeConfig(allowed_uids=(alice.uid,)))
                    proc.send_signal(signal.SIGHUP)
                    await _read_until(proc.stderr, log, b"1 allowed caller(s), 30 calls per minute")
                    async with caller_on(alice) as caller, caller.session(bot.uid) as s:
                        await s.initialize()
                        result = await s.call_tool("echo", {"text": "after SIGHUP"})
                        assert result.structured_content == {"echo": "after SIGHUP"}
                    proc.send_signal(signal.SIGTERM)
                    assert await proc.wait() == 0
                finally:
                    if proc.returncode is None:
                        proc.kill()
            # brmcp-serve.conf's logfile (bisonbotkit's default path) got the same log.
            logged = (datadir / "logs" / "brmcp-serve.log").read_text()
            assert f"serving as bot (uid {bot.uid})" in logged
            assert "1 allowed caller(s), 30 calls per minute" in logged
