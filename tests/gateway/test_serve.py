"""``brmcp-serve --upstream``: selling an existing MCP server (here
``mcp-server-time``) over fake brclients, prices.json first run and reload,
and the upstream settings of the command line and of brmcp.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from brmcp.gateway import PriceTable, UpstreamConfig, UpstreamConfigError, load_upstream_block
from brmcp.protocol.payment import PRICE_ATOMS_KEY
from brmcp.serve import ServeApp, ServeConfig, ServeConfigError, main, write_serve_config
from tests.kit.clientrpc import FAST, fake_network
from tests.kit.gateway import time_server_command
from tests.kit.paths import REPO
from tests.kit.serve import caller_on, prepare_serve_dir
from tests.serve.test_app import _read_until

PRICES = {"default": 700, "tools": {"get_current_time": "free"}}


def test_first_run_with_upstream_writes_prices_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    datadir = tmp_path / "serve"
    assert main(["--datadir", str(datadir), "--upstream", *time_server_command()]) == 0
    out = capsys.readouterr().out
    assert "prices.json" in out
    prices = json.loads((datadir / "prices.json").read_text())
    assert prices == {"default": "free", "tools": {"get_current_time": 0, "convert_time": 0}}
    assert (datadir / "prices.json").stat().st_mode & 0o777 == 0o600
    # A later run with prices.json present but no upstream serves the example:
    # nothing new to create.
    assert not load_upstream_block(datadir / "brmcp.json")


def test_upstream_options_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    datadir = tmp_path / "serve"
    assert main(["--datadir", str(datadir), "--upstream-url", "ftp://x", "--log-level", "error"]) == 1
    assert "url must start with http:// or https://" in capsys.readouterr().err
    assert main(["--datadir", str(datadir), "--upstream-header-env", "Authorization=TOKEN_VAR"]) == 1
    assert "need --upstream or --upstream-url" in capsys.readouterr().err
    assert main(["--datadir", str(datadir), "--upstream"]) == 1
    assert "--upstream needs a command" in capsys.readouterr().err


def test_upstream_block_forms(tmp_path: Path) -> None:
    path = tmp_path / "brmcp.json"
    block = {"command": "uvx mcp-server-time --x 'a b'"}
    path.write_text(json.dumps({"allowed_uids": [], "upstream": block}))
    config = load_upstream_block(path)
    assert config == UpstreamConfig(command=("uvx", "mcp-server-time", "--x", "a b"))
    path.write_text(
        json.dumps(
            {
                "upstream": {
                    "url": "http://127.0.0.1:9/mcp",
                    "headers_env": {"Authorization": "UPSTREAM_AUTH"},
                    "headers_file": "h.txt",
                    "send_caller_uid": True,
                }
            }
        )
    )
    config = load_upstream_block(path)
    assert config is not None
    assert config.kind == "http"
    assert config.send_caller_uid
    (tmp_path / "h.txt").write_text("# comment\nX-Api-Key: k1\n")
    os.environ.pop("UPSTREAM_AUTH", None)
    with pytest.raises(UpstreamConfigError, match="UPSTREAM_AUTH is not set"):
        config.headers(tmp_path)
    os.environ["UPSTREAM_AUTH"] = "Bearer s3cret"
    try:
        assert config.headers(tmp_path) == {"X-Api-Key": "k1", "Authorization": "Bearer s3cret"}
    finally:
        del os.environ["UPSTREAM_AUTH"]
    for bad, message in [
        ({"command": ["a"], "url": "http://x"}, "exactly one of"),
        ({}, "exactly one of"),
        ({"command": 3}, "list of strings"),
        ({"command": ["a"], "surprise": 1}, "unknown key"),
        ({"command": ["a"], "call_timeout_seconds": 0}, "call_timeout_seconds"),
        ({"url": "http://x", "headers_env": {"Bad Header": "V"}}, "not a valid HTTP header name"),
    ]:
        path.write_text(json.dumps({"upstream": bad}))
        with pytest.raises(UpstreamConfigError, match=message):
            load_upstream_block(path)
    # brmcp.json's own parser accepts the block without a notice.
    assert ServeConfig.parse(json.dumps({"upstream": {"command": ["a"]}})) == ServeConfig()


async def test_serve_app_sells_the_upstream_and_reloads_prices(tmp_path: Path) -> None:
    with anyio.fail_after(90):
        async with fake_network(tmp_path / "br", "bot", "alice") as (_, (bot, alice)):
            datadir = tmp_path / "serve"
            prepare_serve_dir(datadir, bot, [alice.uid])
            (datadir / "prices.json").write_text(json.dumps(PRICES))
            upstream = UpstreamConfig(command=tuple(time_server_command()))
            app = ServeApp.from_datadir(datadir, client_options=FAST, upstream=upstream)
            assert app.gateway is not None
            async with anyio.create_task_group() as tg:
                await tg.start(app.run)
                await app.client.wait_connected()
                async with caller_on(alice) as caller, caller.session(bot.uid) as s:
                    init = await s.initialize()
                    assert init.server_info.name == "brmcp-gateway"
                    assert init.capabilities.tools is not None
                    assert init.capabilities.tools.list_changed
                    tools = {t.name: t.meta for t in (await s.list_tools()).tools}
                    assert tools == {
                        "get_current_time": {PRICE_ATOMS_KEY: 0},
                        "convert_time": {PRICE_ATOMS_KEY: 700},
                    }
                    free = await s.call_tool("get_current_time", {"timezone": "UTC"})
                    assert not free.is_error
                    # Reload: convert_time hidden, get_current_time priced.
                    write_serve_config(
                        datadir / "prices.json", '{"default": "hidden", "tools": {"get_current_time": 5}}'
                    )
                    app.reload()
                    tools = {t.name: t.meta for t in (await s.list_tools()).tools}
                    assert tools == {"get_current_time": {PRICE_ATOMS_KEY: 5}}
                    # A broken prices.json is refused and the prices in force stay.
                    write_serve_config(datadir / "prices.json", '{"default": -1}')
                    with pytest.raises(ServeConfigError, match=r"prices\.json"):
                        app.reload()
                    assert [spec.price_atoms for spec in app.harness.tools()] == [5]
                    # So is a price for a tool the upstream does not list.
                    write_serve_config(datadir / "prices.json", '{"tools": {"get_curent_time": 5}}')
                    with pytest.raises(ServeConfigError) as info:
                        app.reload()
                    assert str(info.value).startswith(
                        f'{datadir / "prices.json"}: tools["get_curent_time"] (did you mean '
                        '"get_current_time"?): the upstream lists no such tool; correct or remove the name'
                    )
                    assert [spec.price_atoms for spec in app.harness.tools()] == [5]
                tg.cancel_scope.cancel()


async def test_console_command_with_upstream_reloads_prices_on_sighup(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with anyio.fail_after(90):
        async with fake_network(tmp_path / "br", "bot", "alice") as (_, (bot, alice)):
            datadir = tmp_path / "serve"
            prepare_serve_dir(datadir, bot, [alice.uid])
            (datadir / "prices.json").write_text(json.dumps(PRICES))
            cmd = [sys.executable, "-m", "brmcp.serve", "--datadir", str(datadir)]
            cmd += ["--upstream", *time_server_command()]
            async with await anyio.open_process(cmd, env=env, stderr=subprocess.PIPE) as proc:
                try:
                    assert proc.stderr is not None
                    log = bytearray()
                    await _read_until(proc.stderr, log, f"serving as bot (uid {bot.uid})".encode())
                    assert b"selling 2 tool(s) of stdio:" in log
                    write_serve_config(datadir / "prices.json", '{"default": 9}')
                    proc.send_signal(signal.SIGHUP)
                    await _read_until(proc.stderr, log, b"1 allowed caller(s)")
                    # A misspelt tool name: the reload is refused, the prices in force stay.
                    write_serve_config(datadir / "prices.json", '{"default": 9, "tools": {"convert_tme": 1}}')
                    proc.send_signal(signal.SIGHUP)
                    await _read_until(proc.stderr, log, b'(did you mean "convert_time"?)')
                    assert b"reload refused, keeping the previous settings: " in log
                    async with caller_on(alice) as caller, caller.session(bot.uid) as s:
                        await s.initialize()
                        tools = {t.name: t.meta for t in (await s.list_tools()).tools}
                        assert tools == {
                            "get_current_time": {PRICE_ATOMS_KEY: 9},
                            "convert_time": {PRICE_ATOMS_KEY: 9},
                        }
                    proc.send_signal(signal.SIGTERM)
                    assert await proc.wait() == 0
                finally:
                    if proc.returncode is None:
                        proc.kill()


def test_readme_examples_parse() -> None:
    """The README's prices.json and upstream block are valid as written."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Sell an MCP server you already have", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("\n", 1)[1] for block in section.split("```json")[1:]]
    blocks = [block.split("```", 1)[0] for block in blocks]
    prices = PriceTable.parse(blocks[0])
    assert prices.price("convert_time") == 2500
    assert prices.price("get_current_time") == 0
    assert prices.price("debug_dump") is None
    assert prices.price("anything_else") == 1000
    upstream = UpstreamConfig.from_block(json.loads("{" + blocks[1] + "}")["upstream"], source="README")
    assert upstream.kind == "http"
    assert dict(upstream.headers_env) == {"Authorization": "UPSTREAM_AUTHORIZATION"}
    agent = json.loads(blocks[2])["mcpServers"]["my-bot"]
    assert agent["args"][:2] == ["--transport", "streamablehttp"]
    assert "API_ACCESS_TOKEN" in agent["env"]
