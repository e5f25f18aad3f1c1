"""``brmcp-fakebr`` end to end: start it as a process, connect real clients to
two of its users with the printed paths, exchange a PM, stop it with SIGTERM;
the next runs keep the uids and the ports (a taken port is replaced, with a
notice)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest

from brmcp.clientrpc import BotConfig, Client
from brmcp.testing.fakebr.cli import _Previous, _previous_users, main
from tests.kit.clientrpc import FAST


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


@pytest.mark.slow  # over 10 s of subprocess start-ups
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
    # The next run reuses these uids and ports (so allowlists and configs stay valid).
    assert _previous_users(datadir / "fakebr.json") == {
        "bot": _Previous(bot["uid"], _port(bot)),
        "alice": _Previous(alice["uid"], _port(alice)),
    }

    # Second run, while another program holds alice's port: bot keeps its port,
    # alice gets a free one and a notice says so.
    with socket.socket() as squatter:
        # SO_REUSEADDR: the first run's closed connections may leave the port
        # in TIME_WAIT; a listening squatter still makes the port unusable
        # for the fake (Linux refuses a second listener without SO_REUSEPORT).
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", _port(alice)))
        squatter.listen(1)
        out, err = await _run_until_ready(datadir, "bot,alice")
    again = _users_in(datadir)
    assert {n: u["uid"] for n, u in again.items()} == {"bot": bot["uid"], "alice": alice["uid"]}
    assert _port(again["bot"]) == _port(bot)
    assert _port(again["alice"]) != _port(alice)
    assert f"alice's previous port {_port(alice)} is not free" in err
    assert f"using {_port(again['alice'])}" in err
    assert "pin ports with --port" in err
    assert out.startswith("brmcp-fakebr: fake relay with 2 users (all mutual contacts)\n")
    assert "--port N pins them" in out

    # Third run, one user: its port is free again and reused; "1 user".
    out, err = await _run_until_ready(datadir, "bot")
    assert _port(_users_in(datadir)["bot"]) == _port(bot)
    assert out.startswith("brmcp-fakebr: fake relay with 1 user\n")
    assert err == ""


def _port(user: dict[str, str]) -> int:
    port = urlsplit(user["url"]).port
    assert port is not None
    return port


def _users_in(datadir: Path) -> dict[str, dict[str, str]]:
    return {u["nick"]: u for u in json.loads((datadir / "fakebr.json").read_text())["users"]}


async def _run_until_ready(datadir: Path, users: str, *options: str) -> tuple[str, str]:
    """Run brmcp-fakebr (text output) until it is serving, stop it with
    SIGTERM; returns (stdout, stderr before the stop)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "brmcp.testing.fakebr", "--datadir", str(datadir), "--users", users]
    cmd += options
    with anyio.fail_after(60):
        async with await anyio.open_process(cmd, env=env) as proc:
            try:
                assert proc.stdout is not None
                assert proc.stderr is not None
                out = b""
                while b"--port N" not in out:
                    out += await proc.stdout.receive()
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0
                err = b""
                async for chunk in proc.stderr:
                    err += chunk
            finally:
                if proc.returncode is None:
                    proc.kill()
    before_stop = err.decode().split("brmcp-fakebr: SIGTERM, stopping")[0]
    return out.decode(), before_stop


def test_fakebr_command_rejects_bad_user_lists(tmp_path: Path) -> None:
    for users, needle in [(",", "at least one"), ("bot,bot", "duplicate"), ("bad nick", "invalid nick")]:
        with pytest.raises(SystemExit) as info:
            main(["--datadir", str(tmp_path), "--users", users])
        assert needle in str(info.value.code)
    assert _previous_users(tmp_path / "missing.json") == {}
    summary = tmp_path / "fakebr.json"
    for text in ("{", "[]", '{"users": 3}'):
        summary.write_text(text)
        assert _previous_users(summary) == {}
    summary.write_text(
        json.dumps(
            {
                "users": [
                    {"nick": "a", "uid": "1" * 64, "url": "wss://127.0.0.1:7001/ws"},
                    {"nick": "b", "uid": "2" * 64, "url": "wss://127.0.0.1:99999/ws"},
                    {"nick": "c", "uid": "3" * 64},
                    {"uid": "4" * 64},
                    "junk",
                ]
            }
        )
    )
    assert _previous_users(summary) == {
        "a": _Previous("1" * 64, 7001),
        "b": _Previous("2" * 64, 0),
        "c": _Previous("3" * 64, 0),
    }


@pytest.mark.slow  # over 10 s of subprocess start-ups
async def test_a_moved_port_names_the_changed_configs_and_the_daemons_to_restart(tmp_path: Path) -> None:
    """The configs --write-confs rewrote for a user whose port moved are
    named, with the daemons to restart (SIGHUP does not reload a .conf)."""
    datadir, confs = tmp_path / "br", tmp_path / "confs"
    options = ("--write-confs", str(confs), "--gateway", "true")
    _, err = await _run_until_ready(datadir, "bot,alice,bob", *options)
    assert err == ""
    first = _users_in(datadir)
    bot_port, alice_port = _port(first["bot"]), _port(first["alice"])
    # The second run, while other programs hold the bot's and alice's ports.
    with socket.socket() as squat_bot, socket.socket() as squat_alice:
        for squatter, port in ((squat_bot, bot_port), (squat_alice, alice_port)):
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", port))
            squatter.listen(1)
        out, err = await _run_until_ready(datadir, "bot,alice,bob", *options)
    assert f"brmcp-serve --datadir {confs / 'brmcp-serve'}" in out  # the next steps, as before
    again = _users_in(datadir)
    assert _port(again["bob"]) == _port(first["bob"])
    serve, gateway, alices = confs / "brmcp-serve", confs / "brmcp-gateway", confs / "brmcp-bridge-alice"
    assert err.splitlines() == [
        f"brmcp-fakebr: bot's previous port {bot_port} is not free (Address already in use); "
        f"using {_port(again['bot'])} (pin ports with --port)",
        f"brmcp-fakebr: alice's previous port {alice_port} is not free (Address already in use); "
        f"using {_port(again['alice'])} (pin ports with --port)",
        f"brmcp-fakebr: changed {serve}/brmcp-serve.conf, {gateway}/brmcp-serve.conf and "
        f"{alices}/brmcp-bridge.conf; SIGHUP does not reload a .conf, so restart whichever of these "
        f"runs: brmcp-serve --datadir {serve}; brmcp-serve --datadir {gateway}; "
        f"brmcp-bridge --datadir {alices}",
    ]
    summary = json.loads((datadir / "fakebr.json").read_text())
    assert [entry["path"] for entry in summary["confs"]["changed"]] == [
        f"{serve}/brmcp-serve.conf",
        f"{gateway}/brmcp-serve.conf",
        f"{alices}/brmcp-bridge.conf",
    ]
    # Only alice's port moves: one file, one daemon.
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", _port(again["alice"])))
        squatter.listen(1)
        _, err = await _run_until_ready(datadir, "bot,alice,bob", *options)
    assert err.splitlines()[1] == (
        f"brmcp-fakebr: changed {alices}/brmcp-bridge.conf; SIGHUP does not reload a .conf, so restart "
        f"it: brmcp-bridge --datadir {alices}"
    )
    # Without --write-confs nothing is rewritten: the notice says what to update.
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        moved = _port(_users_in(datadir)["alice"])
        squatter.bind(("127.0.0.1", moved))
        squatter.listen(1)
        _, err = await _run_until_ready(datadir, "bot,alice,bob")
    assert err.splitlines() == [
        f"brmcp-fakebr: alice's previous port {moved} is not free (Address already in use); using "
        f"{_port(_users_in(datadir)['alice'])}: update configs that name wss://127.0.0.1:{moved}/ws and "
        "restart the daemons using them, or pin ports with --port"
    ]
