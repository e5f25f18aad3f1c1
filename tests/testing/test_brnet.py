"""The brnet helper without Go: where sources are found, the cache key, and
the one-line "unavailable" reasons the real-network tests skip with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from brmcp.testing.brnet import BrNet, BrNetUnavailable, brnet_binary, brnet_cache_dir, brnet_source_dir
from brmcp.testing.brnet.build import source_hash


def _copy_sources(dest: Path) -> Path:
    src = brnet_source_dir()
    dest.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file():
            shutil.copy2(p, dest / p.name)
    return dest


def test_sources_are_found_in_the_clone_and_hash_follows_them(tmp_path: Path) -> None:
    src = brnet_source_dir()
    assert (src / "go.mod").read_text().find("github.com/companyzero/bisonrelay") >= 0
    copy = _copy_sources(tmp_path / "brnet")
    h1 = source_hash(copy)
    assert h1 == source_hash(src)
    (copy / "README.txt").write_text("not a source")
    assert source_hash(copy) == h1
    with open(copy / "main.go", "a") as fh:
        fh.write("\n// changed\n")
    assert source_hash(copy) != h1


def test_missing_go_is_a_clear_unavailable_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BRMCP_GO", str(tmp_path / "no-such-go"))
    monkeypatch.setenv("BRMCP_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(BrNetUnavailable, match="Go toolchain not found"):
        brnet_binary()
    # BrNet.start() goes through the same build and so the same reason.
    with pytest.raises(BrNetUnavailable, match="Go toolchain not found"):
        BrNet(tmp_path / "root").start()


def test_sources_env_and_cache_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BRMCP_CACHE_DIR", str(tmp_path / "c"))
    assert brnet_cache_dir() == tmp_path / "c" / "brnet"
    monkeypatch.delenv("BRMCP_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert brnet_cache_dir() == tmp_path / "x" / "brmcp" / "brnet"
    copy = _copy_sources(tmp_path / "elsewhere")
    monkeypatch.setenv("BRMCP_BRNET_SRC", str(copy))
    assert brnet_source_dir() == copy


def test_a_prebuilt_binary_in_the_cache_is_reused_without_go(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("BRMCP_CACHE_DIR", str(tmp_path / "cache"))
    fake_go = tmp_path / "go"
    fake_go.write_text("#!/bin/sh\nexit 99\n")
    fake_go.chmod(0o755)
    monkeypatch.setenv("BRMCP_GO", str(fake_go))
    exe = brnet_cache_dir() / source_hash(brnet_source_dir()) / "brnet"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    assert brnet_binary() == exe


def test_build_failure_is_reported_with_gos_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from brmcp.testing.brnet import BrNetBuildError

    monkeypatch.setenv("BRMCP_CACHE_DIR", str(tmp_path / "cache"))
    fake_go = tmp_path / "go"
    fake_go.write_text("#!/bin/sh\necho 'main.go:1:1: syntax error' >&2\nexit 1\n")
    fake_go.chmod(0o755)
    monkeypatch.setenv("BRMCP_GO", str(fake_go))
    with pytest.raises(BrNetBuildError, match="syntax error"):
        brnet_binary()
    offline = tmp_path / "go-offline"
    offline.write_text(
        "#!/bin/sh\necho 'go: downloading x: dial tcp: lookup proxy.golang.org: no such host' >&2\nexit 1\n"
    )
    offline.chmod(0o755)
    monkeypatch.setenv("BRMCP_GO", str(offline))
    with pytest.raises(BrNetUnavailable, match="cannot download"):
        brnet_binary()


def test_command_line_maps_options_to_brnet_flags(tmp_path: Path) -> None:
    net = BrNet(
        tmp_path / "r",
        users=("a", "b", "c"),
        latency_ms=250,
        nowallet=("b",),
        tip_restart_delay=60,
        reconnect_delay=5,
        tip_max_lifetime=3600,
        binary=tmp_path / "brnet",
    )
    cmd = net.command()
    assert cmd[0] == str(tmp_path / "brnet")
    pairs = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert pairs["-users"] == "a,b,c"
    assert pairs["-latency"] == "250ms"
    assert pairs["-nowallet"] == "b"
    assert pairs["-tiprestartdelay"] == "60000ms"
    assert pairs["-reconnectdelay"] == "5000ms"
    assert pairs["-tipmaxlifetime"] == "3600000ms"
    assert pairs["-root"] == str((tmp_path / "r").resolve())
