"""What an operator meets in the first hour with ``brmcp-serve``, as the
commands they run:

* a stdio upstream gets the TLS-trust and proxy variables of its caller's
  environment, more with ``--upstream-env NAME[=VALUE]``, and one that dies at
  start is one line naming the environment and the flag;
* a ``servercertpath`` that names another brclient's certificate is reported
  as such, not as another program holding that brclient;
* typos in ``brmcp.json``, ``mcpclient.json`` and ``prices.json`` are named,
  with the closest known key; wrong values name the file, key, value and
  what is allowed; Go-written files load without a word; a price for a tool
  the upstream does not list stops the start and is refused by a reload;
* ``--help`` says that no command runs the daemon, ``--upstream`` is last on
  its usage line, ``-datadir DIR`` (the Go flag) works, and amounts read
  ``10,000`` for humans and ``10000`` in ``--json``;
* a gateway's first run lists the upstream's tools in ``prices.json`` and
  numbers the files to edit as printed;
  ``brmcp-fakebr --write-confs --gateway CMD`` writes a gateway bot's configs.

The plain-chat reply is in test_chat_help.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from brmcp._ops.lockfile import HARNESS, acquire, brclient_lock_path
from brmcp.bridge.base import BridgeError, Settings, load_settings, settings_file_warnings
from brmcp.bridge.daemon import BridgeDaemon
from brmcp.clientrpc import ClientrpcConfigError, acquire_brclient, check_server_certificate, write_bot_config
from brmcp.gateway import (
    PASSTHROUGH_ENV,
    Gateway,
    GatewayError,
    PriceError,
    PriceTable,
    UpstreamConfig,
    UpstreamConfigError,
    load_upstream_block,
    prices_template,
)
from brmcp.serve import ServeConfig, ServeConfigError, init_datadir, write_serve_config
from brmcp.serve.cli import USAGE
from brmcp.server import Harness, HarnessConfig, HarnessError
from brmcp.server.store import open_database
from tests.kit.clientrpc import fake_network
from tests.kit.serve import serve_network

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
UID_A = "a" * 64

#: A stdio MCP server (mcp-server-time) that first checks that each variable
#: named on its command line is in its environment, else exits 3 saying so.
NEEDS_ENV = """\
import os, sys
missing = [name for name in sys.argv[1:] if name not in os.environ]
if missing:
    sys.exit("needs_env: not set: " + ", ".join(missing))
import asyncio
from mcp_server_time.server import serve
asyncio.run(serve("UTC"))
"""


def _serve(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brmcp.serve", *args],
        env=ENV if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def needs_env(tmp_path: Path) -> list[str]:
    script = tmp_path / "needs_env.py"
    script.write_text(NEEDS_ENV)
    return [sys.executable, str(script)]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in ENV.items() if k not in PASSTHROUGH_ENV and k != "MY_TOKEN"}
    env.update(extra)
    return env


# -- 1. the stdio upstream's environment ------------------------------------------------------


def test_process_env_passes_tls_and_proxy_variables_and_pass_env() -> None:
    environ = {
        "SSL_CERT_FILE": "/etc/corp-ca.pem",
        "REQUESTS_CA_BUNDLE": "/etc/corp-ca.pem",
        "HTTPS_PROXY": "http://proxy:3128",
        "no_proxy": "localhost",
        "SECRET_API_KEY": "s3cret",
        "MY_TOKEN": "t",
    }
    config = UpstreamConfig(command=("x",), env={"TZ": "UTC", "HTTPS_PROXY": "http://other:1"})
    assert config.process_env(environ) == {
        "SSL_CERT_FILE": "/etc/corp-ca.pem",
        "REQUESTS_CA_BUNDLE": "/etc/corp-ca.pem",
        "HTTPS_PROXY": "http://other:1",  # env wins
        "no_proxy": "localhost",
        "TZ": "UTC",
    }
    passed = config.with_env({}, ["MY_TOKEN"]).process_env(environ)
    assert passed["MY_TOKEN"] == "t"
    assert "SECRET_API_KEY" not in passed
    with pytest.raises(UpstreamConfigError, match="MISSING_VAR") as info:
        config.with_env({}, ["MISSING_VAR"]).process_env(environ)
    assert "\n" not in str(info.value)
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE"):
        assert name in PASSTHROUGH_ENV
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"):
        assert name in PASSTHROUGH_ENV
        assert name.lower() in PASSTHROUGH_ENV


def test_the_upstream_block_takes_pass_env(tmp_path: Path) -> None:
    path = tmp_path / "brmcp.json"
    path.write_text(json.dumps({"upstream": {"command": ["x"], "pass_env": ["MY_TOKEN"]}}))
    config = load_upstream_block(path)
    assert config is not None
    assert config.pass_env == ("MY_TOKEN",)
    path.write_text(json.dumps({"upstream": {"command": ["x"], "pass_envs": ["MY_TOKEN"]}}))
    with pytest.raises(UpstreamConfigError, match='unknown key "pass_envs" \\(did you mean "pass_env"\\?\\)'):
        load_upstream_block(path)
    path.write_text(json.dumps({"Upstream": {"command": ["y"]}}))  # Go's case-insensitive keys
    assert load_upstream_block(path) == UpstreamConfig(command=("y",))


def test_the_upstream_gets_ssl_cert_file_from_the_operators_environment(
    tmp_path: Path, needs_env: list[str]
) -> None:
    """The README's first run, with a custom CA and a proxy in the environment."""
    env = _clean_env(SSL_CERT_FILE="/etc/corp-ca.pem", https_proxy="http://127.0.0.1:9")
    done = _serve(
        "--datadir", str(tmp_path / "d"), "--upstream", *needs_env, "SSL_CERT_FILE", "https_proxy", env=env
    )
    assert done.returncode == 0, done.stderr
    prices = json.loads((tmp_path / "d" / "prices.json").read_text())
    assert prices == {"default": "free", "tools": {"get_current_time": 0, "convert_time": 0}}
    # The command to start it again is the one typed, upstream and all, ready to paste.
    again = shlex.join(
        [
            "brmcp-serve",
            "--datadir",
            str(tmp_path / "d"),
            "--upstream",
            *needs_env,
            "SSL_CERT_FILE",
            "https_proxy",
        ]
    )
    assert done.stdout.rstrip().splitlines()[-1] == f"Then start it again: {again}"


def test_an_upstream_that_dies_at_start_names_the_environment_and_the_flag(
    tmp_path: Path, needs_env: list[str]
) -> None:
    datadir = tmp_path / "d"
    done = _serve(
        "--datadir", str(datadir), "--upstream", *needs_env, "MY_TOKEN", env=_clean_env(MY_TOKEN="t")
    )
    assert done.returncode == 1
    assert "needs_env: not set: MY_TOKEN" in done.stderr  # the upstream's own stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("brmcp-serve: cannot start the upstream MCP server (stdio: ")
    assert "minimal environment" in last
    assert "--upstream-env NAME" in last
    assert not datadir.exists()  # nothing written for a run that cannot list the tools

    passed = _serve(
        "--datadir",
        str(datadir),
        "--upstream-env",
        "MY_TOKEN",
        "--upstream",
        *needs_env,
        "MY_TOKEN",
        env=_clean_env(MY_TOKEN="t"),
    )
    assert passed.returncode == 0, passed.stderr
    assert "get_current_time" in (datadir / "prices.json").read_text()

    other = tmp_path / "e"
    valued = _serve(
        "--datadir",
        str(other),
        "--upstream-env",
        "MY_TOKEN=v",
        "--upstream",
        *needs_env,
        "MY_TOKEN",
        env=_clean_env(),
    )
    assert valued.returncode == 0, valued.stderr

    unset = _serve(
        "--datadir",
        str(tmp_path / "f"),
        "--upstream-env",
        "NOT_SET_ANYWHERE",
        "--upstream",
        *needs_env,
        env=_clean_env(),
    )
    assert unset.returncode == 1
    assert (
        unset.stderr.strip()
        .splitlines()[-1]
        .startswith("brmcp-serve: upstream environment: NOT_SET_ANYWHERE ")
    )
    bad = _serve("--datadir", str(tmp_path / "g"), "--upstream-env", "1BAD", "--upstream", *needs_env)
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        "brmcp-serve: --upstream-env: '1BAD' is not an environment variable name "
        "(expected NAME or NAME=VALUE)"
    )
    http = _serve(
        "--datadir", str(tmp_path / "h"), "--upstream-url", "http://127.0.0.1:9/mcp", "--upstream-env", "X"
    )
    assert http.returncode == 1
    assert "--upstream-env sets the environment of a stdio upstream" in http.stderr


def test_a_missing_command_is_named(tmp_path: Path) -> None:
    done = _serve("--datadir", str(tmp_path / "d"), "--upstream", str(tmp_path / "no-such-server"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].endswith("installed and on PATH?)")


# -- 2. a certificate of another brclient ---------------------------------------------------


async def test_another_brclients_certificate_is_named_not_blamed_on_its_harness(tmp_path: Path) -> None:
    with anyio.fail_after(120):
        async with serve_network(tmp_path, extra=("carol",)) as env:
            carol = env.others[0]
            # A second bot meant for carol's brclient, but with the bot's rpc.cert (whose
            # harness runs): the old message blamed that harness for carol's brclient.
            other = tmp_path / "carol-serve"
            cfg = dataclasses.replace(carol.bot_config(other), servercertpath=str(env.bot.certs.server_cert))
            init_datadir(other, bot_config=cfg, allowed_uids=[env.alice.uid])
            done = await anyio.run_process(
                [sys.executable, "-m", "brmcp.serve", "--datadir", str(other)], env=ENV, check=False
            )
            assert done.returncode == 1
            last = done.stderr.decode().strip().splitlines()[-1]
            assert last.startswith(
                f"brmcp-serve: servercertpath {env.bot.certs.server_cert} is not the certificate of the "
                f"brclient at {carol.url} (TLS: "
            ), last
            assert "another harness" not in last
            assert "point servercertpath at the rpc.cert of the brclient" in last

            # The bridge daemon shares the check (brmcp.clientrpc.acquire_brclient).
            bridge_dir = tmp_path / "bridge"
            bridge_dir.mkdir()
            bcfg = dataclasses.replace(
                carol.bot_config(bridge_dir, "brmcp-bridge"), servercertpath=str(env.bot.certs.server_cert)
            )
            write_bot_config(bridge_dir / "brmcp-bridge.conf", bcfg)
            daemon = BridgeDaemon.from_datadir(bridge_dir, listen="127.0.0.1:0")
            with pytest.raises(BridgeError) as caught:
                await daemon.run()
            assert f"is not the certificate of the brclient at {carol.url}" in str(caught.value)
            assert "\n" not in str(caught.value)


async def test_a_wrong_certificate_is_refused_before_any_lock(tmp_path: Path) -> None:
    def check(cert: Path, url: str) -> bool:
        return check_server_certificate(url, cert)

    def lock(cert: Path, url: str) -> None:
        acquire_brclient(cert, url, what=HARNESS, error=HarnessError).release()

    with anyio.fail_after(60):
        async with fake_network(tmp_path, "bot", "eve") as (_, (bot, eve)):
            # The fakes run on this event loop: the blocking checks go to a thread.
            assert await anyio.to_thread.run_sync(check, bot.certs.server_cert, bot.url) is True
            with pytest.raises(ClientrpcConfigError, match="is not the certificate of the brclient at"):
                await anyio.to_thread.run_sync(check, eve.certs.server_cert, bot.url)
            with pytest.raises(HarnessError, match="is not the certificate"):
                await anyio.to_thread.run_sync(lock, eve.certs.server_cert, bot.url)
            # Nothing took eve's lock: eve's own harness may start.
            await anyio.to_thread.run_sync(lock, eve.certs.server_cert, eve.url)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unreachable_brclient_with_a_lock_held_elsewhere_names_the_certificate(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            cert = bot.certs.server_cert
            with acquire(brclient_lock_path(cert), what=HARNESS, detail=f"brclient at {bot.url}"):
                url = f"wss://127.0.0.1:{_closed_port()}/ws"
                with pytest.raises(HarnessError) as caught:
                    acquire_brclient(cert, url, what=HARNESS, error=HarnessError)
    message = str(caught.value)
    assert f"servercertpath {cert}" in message
    assert f"drives the brclient at {bot.url}, not {url}" in message
    assert "already serving" not in message


# -- 3. typos in the JSON settings ----------------------------------------------------------


def test_brmcp_json_typos_warn_with_the_closest_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="brmcp.serve"):
        config = ServeConfig.parse(
            json.dumps({"allowed_uid": [UID_A], "calls_per_minute": 5}), source="b.json"
        )
    assert config.allowed_uids == ()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ['b.json: unknown key "allowed_uid" ignored (did you mean "allowed_uids"?)']
    # Go's decoder matches keys case-insensitively: so do we, without a word.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="brmcp.serve"):
        config = ServeConfig.parse(json.dumps({"Allowed_UIDs": [UID_A], "CALLS_PER_MINUTE": 7}))
    assert (config.allowed_uids, config.calls_per_minute) == ((UID_A,), 7)
    assert caplog.records == []
    # The Go template and a Go file with its directory block load as before.
    assert ServeConfig.parse('{\n  "allowed_uids": [],\n  "calls_per_minute": 30\n}') == ServeConfig()
    with pytest.raises(ServeConfigError) as info:
        ServeConfig.parse('{"calls_per_minute": "30"}', source="b.json")
    assert str(info.value) == (
        'b.json: calls_per_minute must be an integer, got a string ("30"); '
        "use a whole number >= 0 (0 selects 30)"
    )
    with pytest.raises(ServeConfigError) as info:
        ServeConfig.parse('{"chat_help": 3}', source="b.json")
    assert str(info.value).startswith("b.json: chat_help: 3 is not allowed: use true")


def test_the_command_warns_about_a_brmcp_json_typo(tmp_path: Path) -> None:
    datadir = tmp_path / "d"
    env = {**ENV, "HOME": str(tmp_path / "home")}
    assert _serve("--datadir", str(datadir), env=env).returncode == 0  # first run
    write_serve_config(datadir / "brmcp.json", json.dumps({"allowed_uid": [UID_A]}))
    done = _serve("--datadir", str(datadir), env=env)
    assert done.returncode == 1  # brclient's files are not in this HOME
    warning = (
        f"WARNING brmcp.serve: {datadir / 'brmcp.json'}: "
        'unknown key "allowed_uid" ignored (did you mean "allowed_uids"?)'
    )
    assert any(line.endswith(warning) for line in done.stderr.splitlines()), done.stderr


GO_SETTINGS = (
    '{\n  "enabled": false,\n  "token": "",\n  "mode": "approval",\n  "per_call_cap_atoms": 0,\n'
    '  "per_day_cap_atoms": 0,\n  "allowed_bots": null,\n  "approval_timeout_secs": 120,\n'
    '  "tip_wait_secs": 180\n}'
)


def test_mcpclient_json_typos_warn_and_a_go_file_loads_quietly(tmp_path: Path) -> None:
    assert settings_file_warnings(GO_SETTINGS, "m.json") == []
    assert settings_file_warnings(Settings().to_json(), "m.json") == []
    text = json.dumps({"mode": "autopy", "per_call_cap": 100, "Per_Day_Cap_Atoms": 5, "allowed_bot": []})
    assert settings_file_warnings(text, "m.json") == [
        'm.json: unknown key "per_call_cap" ignored (did you mean "per_call_cap_atoms"?)',
        'm.json: unknown key "allowed_bot" ignored (did you mean "allowed_bots"?)',
        'm.json: "mode": "autopy" is not allowed (use "approval" or "autopay", in lower case; did you mean '
        '"autopay"?): it loads as approval, so every payment waits for your approval',
    ]
    datadir = tmp_path / "bridge"
    datadir.mkdir()
    (datadir / "mcpclient.json").write_text(text)
    assert load_settings(datadir / "mcpclient.json").mode == "approval"  # as Go loads it
    done = subprocess.run(
        [sys.executable, "-m", "brmcp.bridge", "--datadir", str(datadir), "settings", "--json"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    path = datadir / "mcpclient.json"
    assert f'{path}: unknown key "per_call_cap" ignored (did you mean "per_call_cap_atoms"?)' in done.stderr
    assert f'{path}: "mode": "autopy" is not allowed' in done.stderr
    (datadir / "mcpclient.json").write_text('{"enabled": "yes"}')
    with pytest.raises(BridgeError) as info:
        load_settings(datadir / "mcpclient.json")
    assert (
        str(info.value) == f'parse {path}: "enabled" must be true or false, not string (the file has "yes")'
    )


def test_prices_json_typos_are_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(PriceError) as info:
        PriceTable.parse('{"defualt": 1000}', source="p.json")
    assert (
        str(info.value)
        == 'p.json: unknown key(s) defualt (did you mean "default"?); the keys are default, tools and '
        "allow_unlisted"
    )


#: The one line for a price of a tool the upstream does not list (mcp-server-time's).
UNLISTED = (
    '{}: tools["convert_tme"] (did you mean "convert_time"?): the upstream lists no such tool; correct '
    'or remove the name, or add "allow_unlisted": true to keep a price for a tool the upstream lists later'
)


async def test_a_price_for_a_tool_the_upstream_does_not_list_is_an_error_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, needs_env: list[str]
) -> None:
    """A misspelt name would sell the real tool at "default" (the first
    run writes "free"): the gateway does not start, unless allow_unlisted."""
    upstream = UpstreamConfig(command=tuple(needs_env))
    prices = PriceTable.parse('{"tools": {"convert_tme": 2500}}', source="/d/prices.json")
    harness = Harness(HarnessConfig(data_dir=tmp_path / "a", tools_list_changed=True))
    with anyio.fail_after(60), pytest.raises(GatewayError) as info:
        await Gateway(harness, upstream, prices).run()
    assert str(info.value) == UNLISTED.format("/d/prices.json")
    # A name with nothing close: the line says what the upstream lists.
    far = PriceTable.parse('{"tools": {"weather": 1}}', source="p.json")
    harness = Harness(HarnessConfig(data_dir=tmp_path / "b", tools_list_changed=True))
    with anyio.fail_after(60), pytest.raises(GatewayError) as info:
        await Gateway(harness, upstream, far).run()
    assert str(info.value).startswith(
        'p.json: tools["weather"]: the upstream lists no such tool (it lists get_current_time, '
        "convert_time); correct or remove the name"
    )
    # Allowed: a warning, and the bot starts.
    allowed = PriceTable.parse(
        '{"tools": {"convert_tme": 2500}, "allow_unlisted": true}', source="/d/prices.json"
    )
    harness = Harness(HarnessConfig(data_dir=tmp_path / "c", tools_list_changed=True))
    gateway = Gateway(harness, upstream, allowed)
    with anyio.fail_after(60), caplog.at_level(logging.WARNING, logger="brmcp.gateway"):
        async with anyio.create_task_group() as tg:
            await tg.start(gateway.run)
            assert sorted(spec.name for spec in harness.tools()) == ["convert_time", "get_current_time"]
            tg.cancel_scope.cancel()
    assert [r.getMessage() for r in caplog.records] == [
        '/d/prices.json: tools["convert_tme"] (did you mean "convert_time"?): the upstream lists no such '
        "tool, so this price is not used",
        '/d/prices.json: the upstream lists tools "get_current_time", "convert_time" that the file does not '
        'name: served at the default price (free); name them under "tools" to set their price',
    ]
    with pytest.raises(PriceError, match='allow_unlisted must be true or false, got "yes"'):
        PriceTable.parse('{"allow_unlisted": "yes"}')


# -- 4. the command line --------------------------------------------------------------------


def test_help_says_no_command_runs_the_daemon_and_upstream_comes_last() -> None:
    done = _serve("--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "Without a COMMAND, run the bot daemon" in text
    usage = done.stdout.split("\n\n", 1)[0].splitlines()
    upstream_lines = [line for line in usage if "--upstream CMD" in line]
    assert len(upstream_lines) == 1
    after = upstream_lines[0].split("--upstream CMD [ARG ...]", 1)[1]
    assert "--" not in after.replace("(--upstream last", "")  # no option after it
    assert usage[0].startswith("usage: brmcp-serve ")
    assert USAGE.count("%(prog)s") == 3


def test_go_style_datadir_flag(tmp_path: Path) -> None:
    open_database(tmp_path).close()
    for argv in (["-datadir", str(tmp_path)], [f"-datadir={tmp_path}"]):
        done = _serve(*argv, "balances", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"balances": [], "held_tips": []}
    done = _serve("-log-level", "debug")
    assert done.returncode == 2
    assert done.stderr == "brmcp-serve: -log-level: long options take two dashes here: --log-level\n"
    # The upstream's own single-dash options are its business.
    assert "--upstream" in USAGE


async def test_amounts_have_separators_for_humans_and_none_in_json(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={UID_A}))
    async with harness:
        assert await harness.credit_tip(UID_A, 12_345_000, 1) == 12_345
    text = _serve("--datadir", str(tmp_path), "balances").stdout
    assert "12,345" in text
    assert "12345" not in text
    assert json.loads(_serve("--datadir", str(tmp_path), "balances", "--json").stdout)["balances"] == [
        {"uid": UID_A, "atoms": 12345}
    ]
    stats = _serve("--datadir", str(tmp_path), "stats").stdout
    assert "12,345 atoms" in stats
    assert "12345" not in stats


# -- 5. prices.json from the upstream's tools; a gateway bot over fakebr --------------------


def test_prices_template_lists_the_tools() -> None:
    assert json.loads(prices_template(["b", "a", "b"])) == {"default": "free", "tools": {"b": 0, "a": 0}}
    assert prices_template([]) == '{\n  "default": "free",\n  "tools": {}\n}\n'
    assert PriceTable.parse(prices_template(["x"])).price("x") == 0


def test_an_existing_prices_json_is_kept(tmp_path: Path, needs_env: list[str]) -> None:
    datadir = tmp_path / "d"
    env = {**_clean_env(), "HOME": str(tmp_path / "home")}
    assert _serve("--datadir", str(datadir), "--upstream", *needs_env, env=env).returncode == 0
    mine = '{"default": 5, "tools": {"convert_time": "hidden"}}'
    (datadir / "prices.json").write_text(mine)
    done = _serve("--datadir", str(datadir), "--upstream", *needs_env, env=env)
    assert done.returncode == 1  # goes on to serve: brclient's files are not in this HOME
    assert (datadir / "prices.json").read_text() == mine


@contextlib.contextmanager
def _fakebr(tmp_path: Path, *extra: str) -> Iterator[Path]:
    confs = tmp_path / "confs"
    cmd = [sys.executable, "-m", "brmcp.testing.fakebr", "--datadir", str(tmp_path / "br")]
    cmd += ["--users", "bot,alice", "--write-confs", str(confs), *extra]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C to stop" in line:
                break
        else:
            raise AssertionError(f"brmcp-fakebr exited with {proc.wait()}: {lines}")
        yield confs
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_stderr_until(proc: subprocess.Popen[str], marker: str, limit: float = 90) -> list[str]:
    """stderr lines of ``proc`` up to the first containing ``marker``."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line.rstrip("\n"))
            if marker in line:
                found.set()
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(limit)
    assert found.is_set(), seen
    return seen


def test_fakebr_writes_a_gateway_bot_that_serves(tmp_path: Path, needs_env: list[str]) -> None:
    gateway_cmd = " ".join(f"'{part}'" for part in needs_env)
    with _fakebr(tmp_path, "--gateway", gateway_cmd) as confs:
        summary = json.loads((tmp_path / "br" / "fakebr.json").read_text())
        bot, alice = summary["users"]
        gateway_dir = confs / "brmcp-gateway"
        assert summary["confs"]["gateway"] == str(gateway_dir)
        harness = json.loads((gateway_dir / "brmcp.json").read_text())
        assert harness == {
            "allowed_uids": [alice["uid"]],
            "calls_per_minute": 30,
            "upstream": {"command": needs_env},
        }
        assert bot["url"] in (gateway_dir / "brmcp-serve.conf").read_text()
        first = _serve("--datadir", str(gateway_dir), env=_clean_env())
        assert first.returncode == 0, first.stderr
        assert json.loads((gateway_dir / "prices.json").read_text())["tools"] == {
            "get_current_time": 0,
            "convert_time": 0,
        }
        prices = gateway_dir / "prices.json"
        # fakebr wrote brmcp-serve.conf and brmcp.json: one item to edit, numbered 1.
        assert first.stdout == (
            f"brmcp-serve: created {prices}\n"
            "\n"
            "Before the next run:\n"
            f"  1. {prices} lists the 2 tool(s) of the upstream MCP server,\n"
            "     each at 0 atoms (free): get_current_time, convert_time.\n"
            '     Set atoms per call, "free" or "hidden" per tool under "tools"; "default" prices\n'
            "     tools the upstream adds later.\n"
            "\n"
            f"Then start it again: brmcp-serve --datadir {gateway_dir}\n"
        )
        # A misspelt tool name is refused at start, naming the file, the key and the fix.
        good = prices.read_text()
        prices.write_text('{"default": "free", "tools": {"get_current_time": 0, "convert_tme": 2500}}')
        refused = _serve("--datadir", str(gateway_dir), env=_clean_env())
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines()[-1] == "brmcp-serve: " + UNLISTED.format(prices)
        prices.write_text(good)
        proc = subprocess.Popen(
            [sys.executable, "-m", "brmcp.serve", "--datadir", str(gateway_dir)],
            env=_clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            lines = _read_stderr_until(proc, "selling 2 tool(s)")
            assert any(f"brclient at {bot['url']}" in line for line in lines), lines
            # SIGHUP with the misspelt name: refused, the bot keeps serving.
            prices.write_text('{"default": "free", "tools": {"get_current_time": 0, "convert_tme": 2500}}')
            proc.send_signal(signal.SIGHUP)
            lines = _read_stderr_until(proc, "reload refused")
            assert lines[-1].endswith(
                "reload refused, keeping the previous settings: " + UNLISTED.format(prices)
            ), lines
            assert proc.poll() is None
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0


def test_fakebr_gateway_needs_write_confs(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "brmcp.testing.fakebr",
            "--datadir",
            str(tmp_path),
            "--users",
            "bot",
            "--gateway",
            "x",
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        == "brmcp-fakebr: --gateway CMD needs --write-confs DIR (it writes the bot's configs)"
    )


def test_the_startup_line_prints_the_price_with_separators(tmp_path: Path) -> None:
    with _fakebr(tmp_path) as confs:
        proc = subprocess.Popen(
            [sys.executable, "-m", "brmcp.serve", "--datadir", str(confs / "brmcp-serve")],
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            lines = _read_stderr_until(proc, "brmcp-serve: echo (free) and fortune (")
            assert "fortune (10,000 atoms)" in lines[-1], lines
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        # A stop ends with a line that says it is over.
        assert proc.stderr is not None
        rest = proc.stderr.read().splitlines()
        assert any(line.endswith("SIGTERM: stopping") for line in rest), rest
        assert re.search(r"stopped \(\d+\.\d s after the signal\)$", rest[-1]), rest
