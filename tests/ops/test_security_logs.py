"""No secret reaches a log at any level (SECURITY.md "Secrets"): a full
debug-level run of brmcp-fakebr (Basic auth on), brmcp-serve and
brmcp-bridge as processes, an agent paying for a tool through the bridge, a
refused agent, and the admin CLI; then every stderr and log file is searched
for rpcpass, the Basic-auth header value, the agent token, a wrong token
an attacker tried, and the admin token."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from brmcp._ops.redact import REDACTED, RedactingLogger, redact_headers
from brmcp.bridge import ADMIN_TOKEN_FILE, Settings
from brmcp.bridge.daemon import resolve_listen
from brmcp.clientrpc import BotConfig, write_bot_config
from brmcp.serve import init_datadir

RPCUSER = "rpcuser-7f3a9c"
RPCPASS = "rpcpass-S3cr3t-91d2e8b4"
AGENT_TOKEN = "agent-token-Zq8Xv2Lr5Tn0Wm4K"
WRONG_TOKEN = "attacker-token-Yy7Hh3Gg1Ff9"


def _bot_config(user: dict[str, str], datadir: Path, name: str) -> BotConfig:
    return BotConfig(
        datadir=str(datadir),
        brrpcurl=user["url"],
        servercertpath=user["servercertpath"],
        clientcertpath=user["clientcertpath"],
        clientkeypath=user["clientkeypath"],
        rpcuser=user["rpcuser"],
        rpcpass=user["rpcpass"],
        debug="trace",
        logfile=str(datadir / "logs" / f"{name}.log"),
    )


class _Proc:
    def __init__(self, proc: anyio.abc.Process) -> None:
        self.proc = proc
        self.err = bytearray()

    async def pump(self) -> None:
        assert self.proc.stderr is not None
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for chunk in self.proc.stderr:
                self.err.extend(chunk)

    async def wait_for(self, needle: bytes) -> None:
        while needle not in self.err:
            if self.proc.returncode is not None:
                raise AssertionError(f"process exited: {self.err.decode(errors='replace')[-2000:]}")
            await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def _running(cmd: list[str], env: dict[str, str], tg: anyio.abc.TaskGroup) -> AsyncIterator[_Proc]:
    proc = await anyio.open_process(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    p = _Proc(proc)
    tg.start_soon(p.pump)
    try:
        yield p
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            with anyio.move_on_after(15):
                await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.aclose()


async def test_debug_run_logs_no_secret(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HOME": str(tmp_path / "home"),
    }
    fakedir, servedir, bridgedir = tmp_path / "br", tmp_path / "serve", tmp_path / "bridge"
    logs: dict[str, bytes] = {}
    with anyio.fail_after(150):
        async with anyio.create_task_group() as tg:
            fake_cmd = [sys.executable, "-m", "brmcp.testing.fakebr", "--datadir", str(fakedir)]
            fake_cmd += ["--users", "bot,alice", "--auth", f"{RPCUSER}:{RPCPASS}", "--json"]
            fake_cmd += ["--log-level", "debug"]
            async with _running(fake_cmd, env, tg) as fake:
                assert fake.proc.stdout is not None
                line = b""
                while b"\n" not in line:
                    line += await fake.proc.stdout.receive()
                users = {u["nick"]: u for u in json.loads(line.split(b"\n", 1)[0])["users"]}
                bot, alice = users["bot"], users["alice"]
                init_datadir(
                    servedir,
                    bot_config=_bot_config(bot, servedir, "brmcp-serve"),
                    allowed_uids=[alice["uid"]],
                )
                bridgedir.mkdir()
                bridge_conf = _bot_config(alice, bridgedir, "brmcp-bridge")
                write_bot_config(bridgedir / "brmcp-bridge.conf", bridge_conf)
                settings = Settings(
                    enabled=True,
                    token=AGENT_TOKEN,
                    mode="autopay",
                    per_call_cap_atoms=20_000,
                    per_day_cap_atoms=100_000,
                    allowed_bots=(bot["uid"],),
                )
                (bridgedir / "mcpclient.json").write_text(settings.to_json())
                serve_cmd = [sys.executable, "-m", "brmcp.serve", "--datadir", str(servedir)]
                listen = resolve_listen("127.0.0.1:0")
                bridge_cmd = [sys.executable, "-m", "brmcp.bridge", "--datadir", str(bridgedir)]
                bridge_cmd += ["--listen", listen, "--log-level", "trace"]
                async with (
                    _running([*serve_cmd, "--log-level", "trace"], env, tg) as serve,
                    _running(bridge_cmd, env, tg) as bridge,
                ):
                    await serve.wait_for(f"serving as bot (uid {bot['uid']})".encode())
                    await bridge.wait_for(b"as alice (uid")
                    await bridge.wait_for(b"endpoint open at")
                    url = f"http://{listen}/mcp/{bot['uid']}"
                    bearer = {"Authorization": f"Bearer {AGENT_TOKEN}"}
                    async with (
                        httpx2.AsyncClient(headers=bearer, timeout=60) as http,
                        streamable_http_client(url, http_client=http) as (read, write),
                        ClientSession(read, write) as session,
                    ):
                        await session.initialize()
                        echoed = await session.call_tool("echo", {"text": "hi"})
                        assert echoed.structured_content == {"echo": "hi"}
                        paid = await session.call_tool("fortune", {})
                        assert not paid.is_error, paid
                    async with httpx2.AsyncClient(timeout=30) as http:
                        wrong = {"Authorization": f"Bearer {WRONG_TOKEN}"}
                        refused = await http.post(url, headers=wrong, json={})
                        assert refused.status_code == 401
                        admin = (bridgedir / ADMIN_TOKEN_FILE).read_text().strip()
                        assert admin
                        spend = await http.get(
                            f"http://{listen}/admin/spend", headers={"Authorization": f"Bearer {admin}"}
                        )
                        assert spend.status_code == 200
                    done = await anyio.run_process(
                        [sys.executable, "-m", "brmcp.bridge", "--datadir", str(bridgedir), "spend"],
                        env=env,
                        check=False,
                    )
                    assert done.returncode == 0, done.stderr
                    logs["bridge-cli"] = done.stderr
                logs["serve"] = bytes(serve.err)
                logs["bridge"] = bytes(bridge.err)
            logs["fakebr"] = bytes(fake.err)
            tg.cancel_scope.cancel()
    for logfile in (*servedir.glob("logs/*"), *bridgedir.glob("logs/*")):
        logs[str(logfile)] = logfile.read_bytes()
    # The run really logged at debug level, handshake headers included.
    assert b"DEBUG websockets.client: > Authorization: [redacted]" in logs["serve"]
    assert b"DEBUG websockets.client: > Authorization: [redacted]" in logs["bridge"]
    basic = base64.b64encode(f"{RPCUSER}:{RPCPASS}".encode())
    secrets = {
        "rpcpass": RPCPASS.encode(),
        "basic auth": basic,
        "agent token": AGENT_TOKEN.encode(),
        "wrong token": WRONG_TOKEN.encode(),
        "admin token": admin.encode(),
    }
    for source, text in logs.items():
        for what, secret in secrets.items():
            assert secret not in text, f"{what} logged in {source}"


def test_redacting_logger_hides_header_values(caplog: pytest.LogCaptureFixture) -> None:
    logger = RedactingLogger(logging.getLogger("brmcp.test.redact"))
    with caplog.at_level(logging.DEBUG, logger="brmcp.test.redact"):
        logger.debug("> %s: %s", "Authorization", "Basic c2VjcmV0")
        logger.debug("< %s: %s", "cookie", "session=abc")
        logger.debug("> Proxy-Authorization: Basic Zm9v")
        logger.debug("> %s: %s", "Host", "127.0.0.1")
    text = caplog.text
    for secret in ("c2VjcmV0", "session=abc", "Zm9v"):
        assert secret not in text
    assert f"> Authorization: {REDACTED}" in text
    assert "> Host: 127.0.0.1" in text
    assert redact_headers({"Authorization": "Bearer x", "Accept": "*/*"}) == {
        "Authorization": REDACTED,
        "Accept": "*/*",
    }
