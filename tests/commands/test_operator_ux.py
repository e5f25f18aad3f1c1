"""What users and operators see: the HTTP auth answers, quiet
disconnects, ``--version``, a closed stdout pipe, one-line config and
connection errors, readable file errors, and the packaging metadata."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import anyio
import anyio.abc
import pytest

from brmcp import __version__
from brmcp.bridge.agent import bearer_matches
from brmcp.bridge.cli import main as bridge_main
from brmcp.cli import main as brmcp_main
from brmcp.clientrpc import BotConfig, Client, ClientrpcConfigError
from brmcp.clientrpc.tls import client_ssl_context
from brmcp.metrics import BridgeMetrics
from brmcp.serve.cli import main as serve_main
from brmcp.testing.fakebr.cli import main as fakebr_main
from tests.clientrpc.test_config import _first_dial_error
from tests.kit.bridge import (
    BOT,
    INIT,
    MCP_HEADERS,
    OTHER_BOT,
    TOKEN,
    auth,
    bridge_env,
    fixture_settings,
    until,
)
from tests.kit.clientrpc import FAST, fake_network
from tests.kit.paths import REPO

ROOT = REPO

# -- HTTP auth ------------------------------------------------------------------------------


def test_bearer_scheme_rules() -> None:
    token = "s3cret-token-0123456789"
    for header in (f"Bearer {token}", f"bearer {token}", f"BEARER {token}", f"Bearer   {token}"):
        assert bearer_matches(header.encode(), token), header
    for header in (token, f"Basic {token}", f"Bearer{token}", "Bearer", f"Bearer {token}x", ""):
        assert not bearer_matches(header.encode(), token), header
    assert not bearer_matches(b"Bearer ", "")  # an empty configured token never authorizes
    assert not bearer_matches(None, token)


async def test_401_says_bearer_and_where_the_token_comes_from(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            path = f"/mcp/{BOT}"
            # The hint's command names this bridge's (non-default) data dir, ready to paste.
            snippet = f"brmcp-bridge --datadir {env.data_dir} config-snippet <bot uid>"
            for headers in (MCP_HEADERS, auth("wrong"), {"Authorization": TOKEN, **MCP_HEADERS}):
                refused = await http.post(path, json=INIT, headers=headers)
                assert refused.status_code == 401
                challenge = refused.headers["www-authenticate"]
                assert challenge.startswith("Bearer ")
                assert "resource_metadata" not in challenge
                if "Authorization" in headers:
                    assert 'error="invalid_token"' in challenge
                    assert snippet in challenge
                else:
                    # No credentials sent: no error code in the challenge (RFC 6750 §3.1).
                    assert challenge == 'Bearer realm="brmcp-bridge"'
                assert refused.headers["content-type"] == "application/json"
                body = refused.json()
                assert body["error"] == "unauthorized"
                assert snippet in body["error_description"]
                # A wrong token and a missing header are told apart.
                if "Authorization" in headers:
                    assert body["error_description"].startswith("the token sent was not accepted")
                else:
                    assert body["error_description"].startswith("no Authorization header was sent")
                assert TOKEN not in refused.text
            for scheme in ("bearer", "BEARER", "Bearer"):
                headers = {"Authorization": f"{scheme} {TOKEN}", **MCP_HEADERS}
                ok = await http.post(path, json=INIT, headers=headers)
                assert ok.status_code == 200, scheme
            admin = await http.get("/admin/settings", headers=auth())
            assert admin.status_code == 401
            assert admin.headers["www-authenticate"].startswith(
                'Bearer realm="brmcp-bridge", error="invalid_token"'
            )
            assert "mcpadmin.token" in admin.json()["error_description"]
            bare = await http.get("/admin/settings")
            assert bare.status_code == 401
            assert bare.headers["www-authenticate"] == 'Bearer realm="brmcp-bridge"'
            assert "mcpadmin.token" in bare.json()["error_description"]
            lower = await http.get(
                "/admin/settings", headers={"Authorization": f"bearer {env.bridge.admin_token}"}
            )
            assert lower.status_code == 200


async def test_uids_without_case_and_a_not_allowed_bot_is_told_how(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.http() as http:
            upper = await http.post(f"/mcp/{BOT.upper()}", json=INIT, headers=auth())
            assert upper.status_code == 200
            mixed = BOT[:32] + BOT[32:].upper()
            assert (await http.post(f"/mcp/{mixed}", json=INIT, headers=auth())).status_code == 200
            unlisted = await http.post(f"/mcp/{OTHER_BOT.upper()}", json=INIT, headers=auth())
            assert unlisted.status_code == 404
            assert OTHER_BOT in unlisted.text
            assert f"brmcp-bridge --datadir {env.data_dir} settings set allowed_bots=" in unlisted.text
            malformed = await http.post("/mcp/xyz", json=INIT, headers=auth())
            assert malformed.status_code == 404
            assert malformed.text.startswith('unknown bot: malformed uid "xyz" in the path')


# -- a disconnecting agent ------------------------------------------------------------------


async def _post_and_reset(host: str, port: int, sid: str, body: bytes | None, wait: float) -> None:
    """Send one request on a raw socket and drop the connection with a TCP
    reset (SO_LINGER 0), as a killed agent does."""
    method = "POST" if body is not None else "GET"
    payload = body or b""
    head = (
        f"{method} /mcp/{BOT} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Mcp-Session-Id: {sid}\r\nMcp-Protocol-Version: 2025-06-18\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    stream = await anyio.connect_tcp(host, port)
    await stream.send(head.encode() + payload)
    await anyio.sleep(wait)
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


async def test_a_disconnecting_agent_leaves_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(60):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env:
            host, port = env.bridge.listen_address or ("", 0)
            metrics = BridgeMetrics()
            env.bridge.use_metrics(metrics)
            async with env.http() as http:
                init = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth())
                sid = init.headers["mcp-session-id"]
                note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                headers = {**auth(), "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}
                assert (await http.post(f"/mcp/{BOT}", json=note, headers=headers)).status_code == 202
            free = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "free", "arguments": {}},
            }
            paid = {
                "jsonrpc": "2.0",
                "id": 8,
                "method": "tools/call",
                "params": {"name": "paid", "arguments": {"text": "x", "count": 1}},
            }
            await _post_and_reset(host, port, sid, json.dumps(free).encode(), 0)
            await _post_and_reset(host, port, sid, None, 0.3)  # a GET stream
            await _post_and_reset(host, port, sid, json.dumps(paid).encode()[:20], 0)  # half a body
            await _post_and_reset(host, port, sid, json.dumps(paid).encode(), 0.5)
            await until(lambda: bool(env.bridge.pending_payments()))
            for pending in env.bridge.pending_payments():
                env.bridge.resolve_payment(pending.id, False)
            # The declined call ends at the bridge (a tool error for its gone agent).
            ended = {"tool": "paid", "outcome": "tool_error"}
            await until(
                lambda: metrics.registry.get_sample_value("brmcp_bridge_tool_calls_total", ended) == 1
            )
            # The endpoint still serves.
            async with env.session() as session:
                assert not (await session.call_tool("free", {})).is_error
    noisy = [r for r in caplog.records if r.exc_info is not None or r.levelno >= logging.ERROR]
    assert noisy == [], [(r.name, r.getMessage()) for r in noisy]


# -- commands ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("main", "prog"),
    [
        (brmcp_main, "brmcp"),
        (serve_main, "brmcp-serve"),
        (bridge_main, "brmcp-bridge"),
        (fakebr_main, "brmcp-fakebr"),
    ],
)
def test_every_command_has_version(main: object, prog: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert callable(main)
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"{prog} {__version__}\n"


def test_a_closed_stdout_pipe_is_no_traceback(tmp_path: Path) -> None:
    code = "import sys; from brmcp.bridge.cli._main import main; sys.exit(main(sys.argv[1:]))"
    for args in (["settings"], ["spend"], ["--help"]):
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "--datadir", str(tmp_path / "bridge"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()  # like `| head` that has read enough
        err = proc.stderr.read().decode()
        proc.wait(timeout=60)
        assert "Traceback" not in err, err
        assert "BrokenPipeError" not in err, err


# -- configuration and connection errors ----------------------------------------------------


def test_a_missing_certificate_path_is_named(tmp_path: Path) -> None:
    base = BotConfig(
        brrpcurl="wss://127.0.0.1:7676/ws",
        servercertpath=str(tmp_path / "rpc.cert"),
        clientcertpath=str(tmp_path / "rpc-client.cert"),
        clientkeypath=str(tmp_path / "rpc-client.key"),
    )
    for key in ("servercertpath", "clientcertpath", "clientkeypath"):
        cfg = dataclasses.replace(base, **{key: ""})
        with pytest.raises(ClientrpcConfigError) as info:
            Client.from_config(cfg)
        message = str(info.value)
        assert f"{key} is missing or empty" in message
        assert "is a directory" not in message
    with pytest.raises(ClientrpcConfigError, match="servercertpath is empty"):
        client_ssl_context("", base.clientcertpath, base.clientkeypath)


async def _plain_http(stream: anyio.abc.ByteStream) -> None:
    async with stream:
        try:
            await stream.receive()
            await stream.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            pass


async def test_a_plain_http_port_is_not_called_a_refused_certificate(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot") as (_, (bot,)):
            listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            async with listener, anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, _plain_http)
                url = f"wss://127.0.0.1:{port}/ws"
                client = Client(
                    url,
                    server_cert=bot.certs.server_cert,
                    client_cert=bot.certs.client_cert,
                    client_key=bot.certs.client_key,
                    **FAST,
                )
                text = str(await _first_dial_error(client))
                tg.cancel_scope.cancel()
    assert "does not speak TLS" in text
    assert "plain-HTTP" in text
    assert "refused the client certificate" not in text


def test_a_malformed_spend_log_reads_plainly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    datadir = tmp_path / "bridge"
    datadir.mkdir()
    cases = {
        '{"ts": 1}': "expected a JSON array of spend entries, not object",
        '[{"ts": 1, "atoms": "500"}]': 'entry 0: "atoms" must be a whole number (64-bit), not string',
        "[7]": "entry 0: expected a JSON object of spend entries, not number 7",
    }
    for content, expected in cases.items():
        (datadir / "mcpspend.json").write_text(content)
        assert bridge_main(["--datadir", str(datadir), "spend"]) == 1
        err = capsys.readouterr().err
        assert expected in err
        assert "Go value" not in err
        assert "Go struct" not in err
    (datadir / "mcpclient.json").write_text('{"enabled": "yes"}')
    assert bridge_main(["--datadir", str(datadir), "settings"]) == 1
    err = capsys.readouterr().err
    assert '"enabled" must be true or false, not string' in err


# -- packaging --------------------------------------------------------------------------------


def test_packaging_metadata() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("ISC License")
    assert "Permission to use, copy, modify, and/or distribute this software" in license_text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "ISC"
    assert project["license-files"] == ["LICENSE"]
    assert project["requires-python"] == ">=3.11"
    for minor in (11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in project["classifiers"]
    assert project["urls"]


def _python310() -> str | None:
    """A working Python 3.10 interpreter, if this machine has one."""
    pyenv = Path("~/.pyenv/versions").expanduser()
    candidates = [str(p) for p in sorted(pyenv.glob("3.10.*/bin/python"))] if pyenv.is_dir() else []
    candidates.append(shutil.which("python3.10") or "")
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 10))"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.stdout.strip() == "True":
            return candidate
    return None


def test_the_build_backend_refuses_old_python_in_one_line() -> None:
    backend = ROOT / "build_backend"
    ok = subprocess.run(
        [sys.executable, "-c", "import brmcp_build; print(callable(brmcp_build.build_wheel))"],
        cwd=backend,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (ok.returncode, ok.stdout.strip()) == (0, "True"), ok.stderr
    old = _python310()
    if old is None:
        pytest.skip("no Python 3.10 interpreter here (python3.10 or ~/.pyenv/versions/3.10.*)")
    refused = subprocess.run(
        [old, "-c", "import brmcp_build"], cwd=backend, capture_output=True, text=True, check=False
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("brmcp requires Python >= 3.11; this is Python 3.10.")
    assert "Traceback" not in refused.stderr


# -- demo --keep-running ----------------------------------------------------------------------


def test_demo_keep_running_help_names_node_npx_and_the_bridge_dir(tmp_path: Path) -> None:
    import io

    from brmcp._ops.progress import StepPrinter
    from brmcp.demo import STEPS
    from brmcp.demo.transcript import print_connect_help

    out = io.StringIO()
    mcp_json = {"mcpServers": {"brmcp-11111111": {"type": "http", "url": "http://x", "headers": {}}}}
    print_connect_help(
        StepPrinter(out, STEPS, tty=False),
        "http://127.0.0.1:9/mcp/" + "1" * 64,
        "tok",
        "brmcp-11111111",
        mcp_json,
        tmp_path,
    )
    text = out.getvalue()
    assert "npx -y @modelcontextprotocol/inspector@2.12.0 --cli" in text
    assert "Node.js >= 22" in text
    for command in ("spend", "settings", "approvals", "ui"):
        assert f"brmcp-bridge --datadir {tmp_path} {command}" in text


# -- brmcp-fakebr --write-confs -----------------------------------------------------------------


def test_write_confs_follows_ports_and_keeps_the_users_settings(tmp_path: Path) -> None:
    import dataclasses as dc

    from brmcp.bridge.base import load_settings
    from brmcp.clientrpc import load_bot_config
    from brmcp.testing.fakebr.cli import write_confs

    @dc.dataclass
    class _Fake:
        nick: str
        uid: str
        url: str
        rpcuser: str = ""
        rpcpass: str = ""

        def bot_config(self, datadir: Path, name: str) -> BotConfig:
            cfg = BotConfig.defaults(datadir, name)
            cfg.brrpcurl = self.url
            return cfg

    bot, alice = (
        _Fake("bot", "1" * 64, "wss://127.0.0.1:1001/ws"),
        _Fake("alice", "2" * 64, "wss://127.0.0.1:1002/ws"),
    )
    first = write_confs(tmp_path, [bot, alice])  # type: ignore[list-item]
    serve, bridge = tmp_path / "brmcp-serve", tmp_path / "brmcp-bridge-alice"
    assert first["bridges"] == {"alice": str(bridge)}
    assert json.loads((serve / "brmcp.json").read_text())["allowed_uids"] == [alice.uid]
    settings = load_settings(bridge / "mcpclient.json")
    assert (settings.enabled, settings.mode, settings.allowed_bots) == (True, "approval", (bot.uid,))
    assert (settings.per_call_cap_atoms, settings.per_day_cap_atoms) == (20_000, 100_000)
    assert len(settings.token) == 32
    assert (bridge / "mcpclient.json").stat().st_mode & 0o777 == 0o600
    # The user changes a setting; the next run (new ports) rewrites the .conf files only.
    (bridge / "mcpclient.json").write_text(settings.replace(mode="autopay").to_json())
    alice.url = "wss://127.0.0.1:2002/ws"
    second = write_confs(tmp_path, [bot, alice])  # type: ignore[list-item]
    assert load_bot_config(bridge / "brmcp-bridge.conf").brrpcurl == "wss://127.0.0.1:2002/ws"
    assert load_settings(bridge / "mcpclient.json").mode == "autopay"
    assert load_settings(bridge / "mcpclient.json").token == settings.token
    assert str(bridge / "mcpclient.json") not in second["written"]
    # Only alice's URL moved: her bridge's .conf is the one changed, with the daemon to restart.
    assert first["changed"] == []
    assert second["changed"] == [
        {
            "nick": "alice",
            "path": str(bridge / "brmcp-bridge.conf"),
            "daemon": f"brmcp-bridge --datadir {bridge}",
        }
    ]
    assert write_confs(tmp_path, [bot, alice])["changed"] == []  # type: ignore[list-item]
    assert any(
        f"brmcp-bridge --datadir {bridge} config-snippet {bot.uid}" in line for line in second["next_steps"]
    )


def _readme_curl_block() -> str:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    found = [b for b in blocks if "Mcp-Session-Id" in b and "curl" in b]
    assert len(found) == 1, "README.md has one curl example for the agent endpoint"
    return found[0]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_the_readme_curl_example_lists_and_calls_tools(tmp_path: Path) -> None:
    script = _readme_curl_block()
    script = script.replace("http://127.0.0.1:8891/mcp/<bot uid>", "$BRIDGE_URL").replace(
        "'<token>'", "$BRIDGE_TOKEN"
    )
    script = script.replace('"name":"fortune","arguments":{}', '"name":"free","arguments":{"text":"hi"}')
    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env:
            run = await anyio.to_thread.run_sync(
                lambda: subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", script],
                    capture_output=True,
                    text=True,
                    timeout=50,
                    env={**os.environ, "BRIDGE_URL": env.url, "BRIDGE_TOKEN": TOKEN},
                )
            )
            assert run.returncode == 0, run.stderr
            answers = [
                json.loads(line[len("data: ") :])
                for line in run.stdout.splitlines()
                if line.startswith("data: {")
            ]
            assert [a["id"] for a in answers] == [2, 3]
            assert {t["name"] for t in answers[0]["result"]["tools"]} == {"paid", "free", "dyn"}
            assert answers[1]["result"]["isError"] is False
            assert env.executions == {"free": 1}
