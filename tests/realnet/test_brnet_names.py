"""brnet refuses user names that are not brmcp-fakebr's nicks (a nick names
a directory under -root, so ``../escape`` would write outside it), from the
-users flag and from a root's saved state, with one clear line and before it
creates anything. Skipped with the reason when Go is absent."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from brmcp.testing.brnet import BrNet, BrNetError

pytestmark = [pytest.mark.realnet]

BAD = ("../escape", "a/b", "..", ".hidden", "-dash", "sp ace", "x" * 33, "caf\u00e9")


def _brnet(exe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, check=False)


def test_brnet_refuses_user_names_with_path_characters(brnet_exe: Path, tmp_path: Path) -> None:
    root = tmp_path / "net"
    for bad in BAD:
        done = _brnet(brnet_exe, "-root", str(root), "-users", f"alice,{bad}")
        assert done.returncode == 2, (bad, done.stderr)
        assert done.stderr == (
            f"brnet: invalid nick {json.dumps(bad, ensure_ascii=False)}: use 1 to 32 letters, digits,"
            " '_', '.' or '-', not starting with '.' or '-'\n"
        ), bad
        assert done.stdout == ""
    done = _brnet(brnet_exe, "-root", str(root), "-users", "alice", "-nowallet", "../escape")
    assert done.returncode == 2
    assert done.stderr.startswith('brnet: invalid nick "../escape" in -nowallet: ')
    assert not root.exists()  # refused before anything was created
    assert not (tmp_path / "escape").exists()

    # Through the Python wrapper: BrNetError carries brnet's line.
    with pytest.raises(BrNetError, match=r'invalid nick "\.\./escape"'):
        BrNet(tmp_path / "wrapped", binary=brnet_exe, users=("../escape",)).start()
    assert not (tmp_path / "escape").exists()


def test_brnet_refuses_a_bad_name_saved_in_its_root(brnet_exe: Path, tmp_path: Path) -> None:
    root = tmp_path / "net"
    root.mkdir()
    (root / "brnet-state.json").write_text(json.dumps({"users": ["alice", "../escape"]}))
    done = _brnet(brnet_exe, "-root", str(root), "-users", "alice")
    assert done.returncode == 1
    assert done.stderr.startswith(f'brnet: {root / "brnet-state.json"}: invalid nick "../escape": ')
    assert sorted(p.name for p in root.iterdir()) == ["brnet-state.json"]
    assert not (tmp_path / "escape").exists()
