"""brnet's tip restart delay: brclient's TipUser blocks for ``[tipuser]
restartdelay`` (brnet's ``-tiprestartdelay``, 1 minute by default) after a
client connects to the relay. ``python -m brmcp.testing.brnet`` and
:class:`BrNet` run test networks with 1 s unless told otherwise
(brmcp/testing/brnet/__main__.py, network.py). The command-line tests need
no Go; the one on a running network skips without it."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from brmcp.clientrpc import atoms_to_dcr
from brmcp.testing.brnet import BrNet
from brmcp.testing.brnet.__main__ import STANDALONE_DEFAULTS, standalone_args
from brmcp.testing.brnet.fixtures import brnet_exe

__all__ = ["brnet_exe"]


def test_the_command_line_sets_a_short_tip_restart_delay_first() -> None:
    assert STANDALONE_DEFAULTS == (("tiprestartdelay", "1s"),)
    args = standalone_args(["--root", "/tmp/net", "--users", "bot,alice"])
    assert args == ["-tiprestartdelay=1s", "--root", "/tmp/net", "--users", "bot,alice"]
    # The caller's own value comes later, and Go's flag package keeps the last one.
    override = standalone_args(["-root", "/tmp/net", "--tiprestartdelay", "1m"])
    assert override[0] == "-tiprestartdelay=1s"
    assert override[-2:] == ["--tiprestartdelay", "1m"]
    assert standalone_args([]) == ["-tiprestartdelay=1s"]


def test_brnet_options_default_to_a_one_second_tip_restart_delay(tmp_path: Path) -> None:
    net = BrNet(tmp_path / "r", binary=tmp_path / "brnet")
    cmd = net.command()
    pairs = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert pairs["-tiprestartdelay"] == "1000ms"
    slow = BrNet(tmp_path / "r", binary=tmp_path / "brnet", tip_restart_delay=60)
    cmd = slow.command()
    assert dict(zip(cmd[1::2], cmd[2::2], strict=False))["-tiprestartdelay"] == "60000ms"


class _Standalone(BrNet):
    """A brnet started as ``python -m brmcp.testing.brnet ARGS`` starts it."""

    def __init__(self, root: Path, exe: Path, *args: str) -> None:
        super().__init__(root, binary=exe)
        self._args = args

    def command(self) -> list[str]:
        base = ["-root", str(self.root), "-users", "alice,bob", "-reconnectdelay", "500ms"]
        return [str(self._binary), *standalone_args([*base, *self._args])]


async def _first_tip_seconds(net: BrNet) -> float:
    """Start ``net`` and time alice's first TipUser to bob (seconds)."""
    await anyio.to_thread.run_sync(net.start)
    try:
        async with net.user("alice").client(ping_interval=None) as client:
            await client.wait_connected()
            began = time.monotonic()
            await client.tip_user(net.user("bob").uid, atoms_to_dcr(1000), 1)
            return time.monotonic() - began
    finally:
        await anyio.to_thread.run_sync(net.stop)


@pytest.mark.realnet
async def test_a_standalone_network_takes_tips_at_once_unless_told(brnet_exe: Path, tmp_path: Path) -> None:
    with anyio.fail_after(120):
        quick = await _first_tip_seconds(_Standalone(tmp_path / "quick", brnet_exe))
        assert quick < 4.0
        slow = await _first_tip_seconds(_Standalone(tmp_path / "slow", brnet_exe, "--tiprestartdelay", "8s"))
        assert slow > 4.0
