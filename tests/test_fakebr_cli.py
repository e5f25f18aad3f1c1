"""``brmcp-fakebr`` end to end: start it as a process, connect real clients to
two of its users with the printed paths, exchange a PM, stop it with SIGTERM."""

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
from clientrpc_support import FAST

from brmcp.clientrpc import BotConfig, Client
from brmcp.testing.fakebr.cli import _previous_uids, main


def _client(user: dict[str, str]) -> Client:
    cfg = BotConfig(
        brrpcurl=user["url"],
        servercertpath=user["servercertpath"],
        clientcertpath=user["clientcertpath"],
        clientkeypath=user["clientkeypath"],
        rpcuser=user["rpcuser"],
        rpcpass=user["rpcpass"],
    )
    return Client.from_config(cfg, **FAST)


async def test_fakebr_command(tmp_path: Path) -> None:
    datadir = tmp_path / "br"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "brmcp.testing.fakebr",
        "--datadir",
        str(datadir),
        "--users",
        "bot,alice",
        "--json",
    ]
    with anyio.fail_after(60):
        async with await anyio.open_process(cmd, env=env, stderr=subprocess.PIPE) as proc:
            try:
                assert proc.stdout is not None
                buffered = b""
                while b"\n" not in buffered:
                    buffered += await proc.stdout.receive()
                summary = json.loads(buffered.split(b"\n", 1)[0])
                users = {u["nick"]: u for u in summary["users"]}
                assert set(users) == {"bot", "alice"}
                bot, alice = users["bot"], users["alice"]
                conf = await anyio.Path(bot["brclientconf"]).read_text()
                assert "[clientrpc]" in conf
                assert f"jsonrpclisten = {bot['url'].removeprefix('wss://').removesuffix('/ws')}" in conf
                assert f"rpcclientcapath = {datadir / 'bot' / 'rpc-ca.cert'}" in conf
                for name in ("rpc.cert", "rpc.key", "rpc-ca.cert", "rpc-client.cert", "rpc-client.key"):
                    assert (datadir / "bot" / name).is_file()
                assert stat.S_IMODE((datadir / "fakebr.json").stat().st_mode) == 0o600
                async with _client(bot) as cb, _client(alice) as ca:
                    await cb.wait_connected()
                    assert (await cb.user_public_identity()).uid == bot["uid"]
                    pms = cb.pm_stream()
                    await ca.wait_connected()
                    await ca.send_pm(bot["uid"], "hello from alice")  # all users are contacts
                    pm = await pms.__anext__()
                    assert (pm.uid, pm.nick, pm.message) == (alice["uid"], "alice", "hello from alice")
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
    saved = json.loads((datadir / "fakebr.json").read_text())
    # The next run reuses these uids (so allowlists written for them stay valid).
    assert _previous_uids(datadir / "fakebr.json") == {u["nick"]: u["uid"] for u in saved["users"]}
    assert _previous_uids(datadir / "fakebr.json") == {"bot": bot["uid"], "alice": alice["uid"]}


def test_fakebr_command_rejects_bad_user_lists(tmp_path: Path) -> None:
    for users, needle in [(",", "at least one"), ("bot,bot", "duplicate"), ("bad nick", "invalid nick")]:
        with pytest.raises(SystemExit) as info:
            main(["--datadir", str(tmp_path), "--users", users])
        assert needle in str(info.value.code)
    assert _previous_uids(tmp_path / "missing.json") == {}
