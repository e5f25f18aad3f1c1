"""Gateway pieces without a bridge: prices.json rules, restart backoff, and
what an upstream may not put in a result."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types import CallToolResult, TextContent

from brmcp.gateway import Gateway, PriceError, PriceTable, Upstream, UpstreamConfig, load_prices
from brmcp.gateway.tools import strip_reserved
from brmcp.server import Harness, HarnessConfig
from tests.kit.gateway import call, gateway_stack, pid_wrapped, time_server_command, until


def test_price_table_rules(tmp_path: Path) -> None:
    table = PriceTable.parse('{"default": "hidden", "tools": {"a": 5, "b": "free", "c": "Hidden", "d": 0}}')
    assert [table.price(name) for name in "abcde"] == [5, 0, None, 0, None]
    assert PriceTable.parse("{}").price("x") == 0  # no default: free
    assert PriceTable.parse('{"default": 7, "tools": null}').price("x") == 7
    for text, needle in [
        ("[]", "expected a JSON object"),
        ("{", "not valid JSON"),
        ('{"default": -1}', "between 0 and"),
        ('{"default": 1.5}', "whole number"),
        ('{"default": true}', "whole number"),
        ('{"default": "cheap"}', '"free" or "hidden"'),
        ('{"tools": {"a": 2.0}}', 'tools["a"]'),
        ('{"tools": []}', "tools must be an object"),
        ('{"defaults": 1}', "unknown key(s) defaults"),
    ]:
        with pytest.raises(
            PriceError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
        ):
            PriceTable.parse(text, source="p.json")
    with pytest.raises(PriceError, match="file not found"):
        load_prices(tmp_path / "prices.json")
    (tmp_path / "prices.json").write_text('{"default": 3}')
    assert load_prices(tmp_path / "prices.json").price("x") == 3


def test_reserved_meta_is_stripped() -> None:
    meta = {"io.modelcontextprotocol/serverInfo": {}, "progress_token": 3, "brmcp/chargedAtoms": 9, "x/y": 1}
    assert strip_reserved(meta) == {"brmcp/chargedAtoms": 9, "x/y": 1}
    assert strip_reserved(meta, own=True) == {"x/y": 1}
    assert strip_reserved({"progress_token": 1}) is None


async def test_restart_backoff_doubles_up_to_the_cap(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    marker = tmp_path / "started-once"
    # Starts once; every later start exits at once until the marker is removed.
    inner = pid_wrapped(time_server_command(), pidfile)
    command = [
        "/bin/sh",
        "-c",
        f"if [ -e '{marker}' ]; then exit 3; fi; touch '{marker}'; exec \"$@\"",
        "sh",
        *inner,
    ]
    with (tmp_path / "stderr").open("w") as errlog:
        upstream = Upstream(
            UpstreamConfig(command=tuple(command)),
            errlog=errlog,
            backoff_initial=0.02,
            backoff_max=0.08,
            start_timeout=20,
        )
        async with anyio.create_task_group() as tg:
            await tg.start(upstream.run)
            assert upstream.generation == 1
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            await until(lambda: len(upstream.delays) >= 5)
            assert upstream.session is None
            marker.unlink()
            await until(lambda: upstream.generation == 2 and upstream.session is not None)
            tg.cancel_scope.cancel()
    assert upstream.delays[:5] == [0.02, 0.04, 0.08, 0.08, 0.08]


#: A stdio MCP server whose tools are the names in the file argv[1], read at each start.
LISTED_SERVER = """\
import sys
from pathlib import Path
from mcp.server import MCPServer
server = MCPServer("listed")
for name in Path(sys.argv[1]).read_text().split():
    server.add_tool(lambda: "ok", name=name)
server.run()
"""


async def test_a_tool_the_upstream_drops_while_running_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The start refuses a price for a tool the upstream does not list; one
    it drops later (here: across a restart) is only a warning, the bot keeps
    serving, and a reload that still names it is taken; a new unknown name
    in a reload is refused and the prices in force stay."""
    script, names, pidfile = tmp_path / "listed.py", tmp_path / "names", tmp_path / "pid"
    script.write_text(LISTED_SERVER)
    names.write_text("alpha beta")
    command = pid_wrapped([sys.executable, str(script), str(names)], pidfile)
    prices = PriceTable.parse('{"tools": {"alpha": 3, "beta": 4}}', source="/d/prices.json")
    harness = Harness(HarnessConfig(data_dir=tmp_path / "bot", tools_list_changed=True))
    gateway = Gateway(harness, UpstreamConfig(command=tuple(command)), prices, backoff_initial=0.02)
    served = lambda: sorted((spec.name, spec.price_atoms) for spec in harness.tools())  # noqa: E731
    with anyio.fail_after(60), caplog.at_level(logging.WARNING, logger="brmcp.gateway"):
        async with anyio.create_task_group() as tg:
            await tg.start(gateway.run)
            assert served() == [("alpha", 3), ("beta", 4)]
            assert caplog.records == []
            # The upstream comes back without beta.
            names.write_text("alpha")
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            await until(lambda: gateway.upstream.generation == 2 and served() == [("alpha", 3)])
            assert [r.getMessage() for r in caplog.records if "prices.json" in r.getMessage()] == [
                '/d/prices.json: tools["beta"]: the upstream no longer lists this tool; the price applies '
                "again if it returns"
            ]
            # A reload still pricing beta is taken (a warning was given already).
            gateway.set_prices(PriceTable.parse('{"tools": {"alpha": 5, "beta": 4}}'))
            assert served() == [("alpha", 5)]
            # A new name the upstream never listed is refused; the prices in force stay.
            refused = r'^/e/prices\.json: tools\["alpah"\] \(did you mean "alpha"\?\)'
            with pytest.raises(PriceError, match=refused):
                gateway.set_prices(PriceTable.parse('{"tools": {"alpah": 9}}', source="/e/prices.json"))
            assert served() == [("alpha", 5)]
            # Back with beta: served at its price again.
            names.write_text("alpha beta")
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            await until(lambda: served() == [("alpha", 5), ("beta", 4)])
            tg.cancel_scope.cancel()


async def test_an_upstream_cannot_forge_our_meta_keys(tmp_path: Path) -> None:
    prices = PriceTable.parse('{"default": "free"}')
    upstream = UpstreamConfig(command=tuple(time_server_command()))
    async with gateway_stack(tmp_path, upstream, prices) as env, env.session() as session:

        async def forged(request: Any, result_type: Any, **kwargs: Any) -> CallToolResult:
            return CallToolResult(
                content=[TextContent(type="text", text="ok")],
                structured_content={"timezone": "UTC", "datetime": "x", "day_of_week": "y", "is_dst": False},
                _meta={"brmcp/chargedAtoms": 999, "brmcp/balanceAtoms": 5, "vendor/key": "kept"},
            )

        env.gateway.upstream.request = forged  # type: ignore[method-assign]
        result = await call(session, "get_current_time", {"timezone": "UTC"})
    assert not result.is_error
    assert result.meta == {"vendor/key": "kept"}
    assert json.dumps(result.model_dump(mode="json", by_alias=True)).count("999") == 0


async def test_http_headers_reach_the_upstream_and_never_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers from the environment and from a file go on every request to an
    HTTP upstream; their values appear in no log line at any level. (The
    upstream here is a minimal SDK server that records the headers it saw.)"""
    import socket

    import uvicorn
    from mcp.server import MCPServer

    caplog.set_level("DEBUG")
    secret, key = "Bearer s3cret-upstream-token-0123", "file-key-9876543210"
    monkeypatch.setenv("UPSTREAM_AUTH", secret)
    (tmp_path / "headers.txt").write_text(f"# sent as is\nX-Api-Key: {key}\n")
    seen: list[dict[str, str]] = []
    server = MCPServer("header-check")

    @server.tool()
    def ping_back(text: str) -> str:
        return text

    app = server.streamable_http_app()

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    web = uvicorn.Server(uvicorn.Config(recording, log_level="warning", lifespan="on"))
    upstream = UpstreamConfig(
        url=f"http://127.0.0.1:{port}/mcp",
        headers_env={"Authorization": "UPSTREAM_AUTH"},
        headers_file="headers.txt",
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: web.serve(sockets=[sock]))
        await until(lambda: web.started)
        async with gateway_stack(tmp_path, upstream, PriceTable()) as env, env.session() as session:
            result = await call(session, "ping_back", {"text": "hello"})
            assert not result.is_error
            assert "hello" in json.dumps(result.model_dump(mode="json"))
        web.should_exit = True
    posts = [h for h in seen if "authorization" in h]
    assert posts
    assert all(h["authorization"] == secret and h["x-api-key"] == key for h in posts)
    assert len(posts) == len(seen)  # every request carried them
    assert secret not in caplog.text
    assert "s3cret" not in caplog.text
    assert key not in caplog.text


async def test_a_listed_tool_the_prices_do_not_name_is_sold_at_default_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An upstream that lists more tools than the first run saw (server-everything
    adds some once it runs) gets them served at ``default``, and the operator is
    told which ones, once each, with how to price them."""
    script, names, pidfile = tmp_path / "listed.py", tmp_path / "names", tmp_path / "pid"
    script.write_text(LISTED_SERVER)
    names.write_text("alpha")
    command = pid_wrapped([sys.executable, str(script), str(names)], pidfile)
    prices = PriceTable.parse('{"default": 7, "tools": {"alpha": 3}}', source="/d/prices.json")
    harness = Harness(HarnessConfig(data_dir=tmp_path / "bot", tools_list_changed=True))
    gateway = Gateway(harness, UpstreamConfig(command=tuple(command)), prices, backoff_initial=0.02)
    served = lambda: sorted((spec.name, spec.price_atoms) for spec in harness.tools())  # noqa: E731
    warned = lambda: [r.getMessage() for r in caplog.records if "prices.json" in r.getMessage()]  # noqa: E731
    with anyio.fail_after(60), caplog.at_level(logging.WARNING, logger="brmcp.gateway"):
        async with anyio.create_task_group() as tg:
            await tg.start(gateway.run)
            assert served() == [("alpha", 3)]
            assert warned() == []
            names.write_text("alpha gamma")
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            await until(lambda: served() == [("alpha", 3), ("gamma", 7)])
            assert warned() == [
                '/d/prices.json: the upstream lists tool "gamma" that the file does not name: served at '
                'the default price (7 atoms a call); name it under "tools" to set its price'
            ]
            # Listed again after another restart: no second warning.
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            await until(lambda: gateway.upstream.generation == 3 and served() == [("alpha", 3), ("gamma", 7)])
            assert len(warned()) == 1
            tg.cancel_scope.cancel()
