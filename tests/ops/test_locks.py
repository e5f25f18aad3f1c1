"""One process per identity (SECURITY.md, README "One process per identity"):
lock files naming their holder, a second brmcp-serve / brmcp-bridge /
brmcp-fakebr on a data directory in use refusing to start, and a second
consumer of one brclient's events (harness or brmcp-bridge) refusing with
the reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from brmcp._ops.lockfile import LockHeldError, acquire, brclient_lock_path, read_holder
from brmcp.bridge import BridgeDaemon, BridgeError
from brmcp.clientrpc import write_bot_config
from brmcp.server import Harness, HarnessConfig, HarnessError, run_bot
from brmcp.testing.fakebr import FakeBRClient
from tests.kit.clientrpc import fake_network
from tests.kit.serve import prepare_serve_dir, serve_network

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def test_lock_names_its_holder_and_is_released(tmp_path: Path) -> None:
    path = tmp_path / "d" / "x.lock"
    with acquire(path, what="brmcp-test", detail="somewhere") as lock:
        assert lock.held
        assert read_holder(path)["pid"] == os.getpid()
        with pytest.raises(LockHeldError) as caught:
            acquire(path, what="other")
        assert caught.value.pid == os.getpid()
        assert str(caught.value) == f"brmcp-test (pid {os.getpid()}) already holds {path} for somewhere"
    assert not lock.held
    acquire(path, what="again").release()
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_killed_holder_leaves_nothing_stale(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    code = (
        "import sys, time\n"
        "from brmcp._ops.lockfile import acquire\n"
        f"lock = acquire({str(path)!r}, what='victim')\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"held\n"
        with pytest.raises(LockHeldError) as caught:
            acquire(path, what="second")
        assert caught.value.pid == proc.pid
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        acquire(path, what="after the kill").release()
    finally:
        proc.kill()
        proc.wait()


async def test_second_fakebr_on_a_data_dir_in_use_refuses(tmp_path: Path) -> None:
    datadir = tmp_path / "br"
    cmd = [
        sys.executable,
        "-m",
        "brmcp.testing.fakebr",
        "--datadir",
        str(datadir),
        "--users",
        "bot",
        "--json",
    ]
    with anyio.fail_after(60):
        async with await anyio.open_process(cmd, env=ENV, stderr=subprocess.PIPE) as first:
            try:
                assert first.stdout is not None
                line = b""
                while b"\n" not in line:
                    line += await first.stdout.receive()
                summary = (datadir / "fakebr.json").read_bytes()
                second = await anyio.run_process(cmd, env=ENV, check=False)
                assert second.returncode == 1
                err = second.stderr.decode()
                assert (
                    f"brmcp-fakebr: another brmcp-fakebr (pid {first.pid}) is already using {datadir}" in err
                )
                assert (datadir / "fakebr.json").read_bytes() == summary  # nothing rewritten
                first.send_signal(signal.SIGTERM)
                assert await first.wait() == 0
            finally:
                if first.returncode is None:
                    first.kill()


async def test_second_brmcp_serve_refuses_a_data_dir_or_brclient_in_use(tmp_path: Path) -> None:
    with anyio.fail_after(90):
        async with serve_network(tmp_path) as env:
            cmd = [sys.executable, "-m", "brmcp.serve", "--datadir", str(env.datadir)]
            same_dir = await anyio.run_process(cmd, env=ENV, check=False)
            assert same_dir.returncode == 1
            err = same_dir.stderr.decode()
            assert (
                f"brmcp-serve: another brmcp-serve (pid {os.getpid()}) is already running on {env.datadir}"
                in err
            )

            # Another data directory, the same brclient: the harness lock refuses it, saying why.
            other = tmp_path / "serve2"
            prepare_serve_dir(other, env.bot, [env.alice.uid])
            same_brclient = await anyio.run_process(
                [sys.executable, "-m", "brmcp.serve", "--datadir", str(other)], env=ENV, check=False
            )
            assert same_brclient.returncode == 1
            err = same_brclient.stderr.decode()
            assert (
                f"another harness (pid {os.getpid()}) is already serving the brclient at {env.bot.url}" in err
            )
            assert "would both consume its tips" in err
            assert brclient_lock_path(env.bot.certs.server_cert).name in err


async def test_second_bridge_daemon_on_a_data_dir_refuses(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with fake_network(tmp_path / "br", "alice") as (_, (alice,)):
            datadir = tmp_path / "bridge"
            datadir.mkdir()
            write_bot_config(datadir / "brmcp-bridge.conf", alice.bot_config(datadir, "brmcp-bridge"))
            first = BridgeDaemon.from_datadir(datadir, listen="127.0.0.1:0")
            async with anyio.create_task_group() as tg:
                await tg.start(first.run)
                second = BridgeDaemon.from_datadir(datadir, listen="127.0.0.1:0")
                with pytest.raises(
                    BridgeError, match=rf"another brmcp-bridge \(pid {os.getpid()}\) is running"
                ):
                    await second.run()
                assert json.loads((datadir / "brmcp-bridge.lock").read_text())["what"] == "brmcp-bridge"
                tg.cancel_scope.cancel()


def _bridge_dir(root: Path, br: FakeBRClient) -> Path:
    """A brmcp-bridge data directory driving the fake brclient ``br``."""
    root.mkdir()
    write_bot_config(root / "brmcp-bridge.conf", br.bot_config(root, "brmcp-bridge"))
    return root


async def test_second_bridge_daemon_on_one_brclient_refuses(tmp_path: Path) -> None:
    """Another data directory, the same brclient: the brclient lock refuses the
    second bridge (in-process and as the brmcp-bridge command), naming the
    first one's pid and why; once the first stopped, another may start."""
    with anyio.fail_after(90):
        async with fake_network(tmp_path / "br", "alice") as (_, (alice,)):
            first = BridgeDaemon.from_datadir(_bridge_dir(tmp_path / "one", alice), listen="127.0.0.1:0")
            async with anyio.create_task_group() as tg:
                await tg.start(first.run)
                other = _bridge_dir(tmp_path / "two", alice)
                second = BridgeDaemon.from_datadir(other, listen="127.0.0.1:0")
                with pytest.raises(BridgeError) as caught:
                    await second.run()
                message = str(caught.value)
                pid = os.getpid()
                assert message.startswith(
                    f"another brmcp-bridge (pid {pid}) is already using the brclient at {alice.url}; "
                )
                assert "would each consume the other's PMs and tips" in message
                assert brclient_lock_path(alice.certs.server_cert).name in message
                assert "\n" not in message
                assert not (other / "brmcp-bridge.runtime.json").exists()  # refused before starting

                cmd = [
                    sys.executable,
                    "-m",
                    "brmcp.bridge",
                    "--datadir",
                    str(other),
                    "--listen",
                    "127.0.0.1:0",
                ]
                refused = await anyio.run_process(cmd, env=ENV, check=False)
                assert refused.returncode == 1
                lines = refused.stderr.decode().strip().splitlines()
                assert lines[-1].startswith(
                    f"brmcp-bridge: another brmcp-bridge (pid {pid}) is already using the brclient at "
                    f"{alice.url}"
                )
                assert "would each consume the other's PMs and tips" in lines[-1]
                tg.cancel_scope.cancel()
            # The first one stopped: the second may now run.
            third = BridgeDaemon.from_datadir(other, listen="127.0.0.1:0")
            async with anyio.create_task_group() as tg:
                await tg.start(third.run)
                tg.cancel_scope.cancel()


async def test_a_bridge_and_a_harness_cannot_share_a_brclient(tmp_path: Path) -> None:
    """Both consume the brclient's PMs and tip progress (acks are global), so
    whichever starts second is refused, naming the other kind and its pid."""
    pid = os.getpid()
    with anyio.fail_after(90):
        async with serve_network(tmp_path) as env:
            # brmcp-serve's harness holds the bot's brclient: a bridge there is refused.
            daemon = BridgeDaemon.from_datadir(
                _bridge_dir(tmp_path / "bridge", env.bot), listen="127.0.0.1:0"
            )
            with pytest.raises(BridgeError) as refused_bridge:
                await daemon.run()
            assert str(refused_bridge.value).startswith(
                f"another harness (pid {pid}) is already using the brclient at {env.bot.url}; two processes"
                " on one brclient would each consume the other's PMs and tips"
            )

            # A bridge holds alice's brclient: a harness there is refused.
            bridge = BridgeDaemon.from_datadir(
                _bridge_dir(tmp_path / "alice-bridge", env.alice), listen="127.0.0.1:0"
            )
            async with anyio.create_task_group() as tg:
                await tg.start(bridge.run)
                harness = Harness(HarnessConfig(data_dir=tmp_path / "alice-bot", allowed_peers={env.bot.uid}))
                async with env.alice.client() as client:
                    with pytest.raises(HarnessError) as refused_harness:
                        await run_bot(harness, client)
                assert str(refused_harness.value).startswith(
                    f"another brmcp-bridge (pid {pid}) is already using the brclient at {env.alice.url}; two"
                    " processes on one brclient would each consume the other's PMs and tips"
                )
                tg.cancel_scope.cancel()
