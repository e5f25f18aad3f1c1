"""``brmcp demo --network real`` from an installed brmcp: the wheel ships
brnet's Go sources, an installed copy finds and builds them, a first build
reports its progress on stderr, and without Go the demo (and ``python -m
brmcp.testing.brnet``) says what to install in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from brmcp.demo import NO_GO
from brmcp.testing.brnet import BrNetBuildError, brnet_binary, build, go_executable
from brmcp.testing.brnet.build import source_hash
from tests.kit.paths import REPO

BRNET_SRC = REPO / "interop" / "brnet"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


# -- brnet from an installed brmcp ----------------------------------------------------------


def _go_sources() -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in BRNET_SRC.iterdir()
        if p.is_file() and (p.suffix == ".go" or p.name in ("go.mod", "go.sum"))
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel . --no-deps`` of a copy of the project's sources (built
    outside the working tree, which setuptools would write build/ into)."""
    src = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in ("build_backend", "brmcp"):
        shutil.copytree(REPO / folder, src / folder, symlinks=True, ignore=skip)
    (src / "interop" / "brnet").mkdir(parents=True)
    for name, data in _go_sources().items():
        (src / "interop" / "brnet" / name).write_bytes(data)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-w", str(out)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = out.glob("brmcp-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel unpacked as site-packages would hold it."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(site)
    return site


@pytest.mark.slow
def test_the_wheel_ships_brnets_go_sources(wheel: Path) -> None:
    expected = _go_sources()
    assert {"go.mod", "go.sum", "main.go"} <= set(expected)
    with zipfile.ZipFile(wheel) as whl:
        shipped = {
            name.removeprefix("brmcp/testing/brnet/gosrc/"): whl.read(name)
            for name in whl.namelist()
            if name.startswith("brmcp/testing/brnet/gosrc/")
        }
    assert shipped == expected


def _installed_env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in ENV.items() if k not in ("BRMCP_BRNET_SRC", "BRMCP_GO")}
    env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env


@pytest.mark.slow
def test_an_installed_brmcp_finds_its_packaged_sources_outside_a_clone(
    installed: Path, tmp_path: Path
) -> None:
    code = (
        "import json, brmcp\n"
        "from brmcp.testing.brnet import brnet_source_dir\n"
        "from brmcp.testing.brnet.build import source_hash\n"
        "src = brnet_source_dir()\n"
        "print(json.dumps({'brmcp': brmcp.__file__, 'src': str(src), 'hash': source_hash(src)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_installed_env(installed),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert Path(found["brmcp"]).is_relative_to(installed)
    assert Path(found["src"]) == installed / "brmcp" / "testing" / "brnet" / "gosrc"
    assert found["hash"] == source_hash(BRNET_SRC)


@pytest.mark.slow
@pytest.mark.realnet
@pytest.mark.skipif(go_executable() is None, reason="needs Go to build brnet")
def test_an_installed_brmcp_builds_brnet_into_its_cache(installed: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    code = (
        "import sys\n"
        "from brmcp.testing.brnet import brnet_binary\n"
        "print(brnet_binary(progress=lambda line: print(line, file=sys.stderr, flush=True)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=_installed_env(installed, BRMCP_CACHE_DIR=str(cache)),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    exe = Path(done.stdout.strip())
    assert exe == cache / "brnet" / source_hash(BRNET_SRC) / "brnet"
    assert os.access(exe, os.X_OK)
    progress = done.stderr.splitlines()
    assert progress[0].startswith("brnet: "), progress
    assert f"(sources: {installed / 'brmcp' / 'testing' / 'brnet' / 'gosrc'})" in done.stderr
    assert progress[-1].startswith(f"brnet: built {exe} in "), progress


FAKE_GO = """#!/bin/sh
if [ "$1" = env ]; then echo "$FAKE_GOMODCACHE"; exit 0; fi
out=""
while [ $# -gt 0 ]; do
    if [ "$1" = -o ]; then out="$2"; fi
    shift
done
{body}
printf '#!/bin/sh\\necho fake brnet ran "$@"\\n' > "$out"
chmod +x "$out"
"""

DOWNLOADS = 'for m in a b c; do echo "go: downloading example.com/$m v1.0.0" >&2; done'


def _fake_go(tmp_path: Path, body: str = DOWNLOADS) -> Path:
    go = tmp_path / "fake-go"
    go.write_text(FAKE_GO.replace("{body}", body))
    go.chmod(0o755)
    return go


@pytest.fixture
def fake_go_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """BRMCP_GO is a fake go; the brnet cache and Go's module cache are empty
    directories under ``tmp_path``. Returns the module cache."""
    modcache = tmp_path / "gomodcache"
    modcache.mkdir()
    monkeypatch.setenv("BRMCP_GO", str(_fake_go(tmp_path)))
    monkeypatch.setenv("BRMCP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_GOMODCACHE", str(modcache))
    monkeypatch.delenv("BRMCP_BRNET_SRC", raising=False)
    return modcache


def test_a_first_build_says_what_it_does_and_summarises_the_downloads(fake_go_env: Path) -> None:
    lines: list[str] = []
    exe = brnet_binary(progress=lines.append)
    assert lines[0].startswith("brnet: first build of brnet: Go downloads bisonrelay"), lines
    assert "about 400 MB, a one-time download" in lines[0]
    assert f"into {fake_go_env}," in lines[0]
    assert lines[1] == f"brnet: the binary will be cached in {exe.parent} (sources: {BRNET_SRC})"
    assert "brnet: downloading Go modules: 1 so far (latest example.com/a v1.0.0)" in lines
    assert "brnet: downloading Go modules: 3 so far (latest example.com/c v1.0.0)" in lines
    assert lines[-1].startswith(f"brnet: built {exe} in "), lines
    assert not any("go: downloading" in line for line in lines)
    # Built once: the next call reports nothing.
    again: list[str] = []
    assert brnet_binary(progress=again.append) == exe
    assert again == []


def test_a_build_with_the_modules_cached_only_compiles(fake_go_env: Path) -> None:
    version = re.search(r"github\.com/companyzero/bisonrelay (\S+)", (BRNET_SRC / "go.mod").read_text())
    assert version is not None
    (fake_go_env / "github.com" / "companyzero" / f"bisonrelay@{version.group(1)}").mkdir(parents=True)
    lines: list[str] = []
    brnet_binary(progress=lines.append)
    assert lines[0] == (
        f"brnet: building brnet with Go; its modules are already in {fake_go_env}, "
        "so this only compiles (up to a few minutes, once)"
    )


def test_a_quiet_build_reports_that_it_is_still_running(
    fake_go_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(build, "HEARTBEAT_SECONDS", 0.2)
    monkeypatch.setenv("BRMCP_GO", str(_fake_go(tmp_path, "sleep 2")))
    lines: list[str] = []
    brnet_binary(progress=lines.append)
    still = [line for line in lines if line.startswith("brnet: still building (")]
    assert still, lines
    assert still[0].endswith(" s, compiling)")


def test_gos_output_is_passed_through_and_a_failed_build_leaves_no_file(
    fake_go_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    go = _fake_go(tmp_path, 'echo "./main.go:3:2: undefined: x" >&2; echo partial > "$out"; exit 1')
    monkeypatch.setenv("BRMCP_GO", str(go))
    lines: list[str] = []
    with pytest.raises(BrNetBuildError, match="undefined: x") as raised:
        brnet_binary(progress=lines.append)
    assert raised.value.summary == f"go build of brnet failed in {BRNET_SRC}: ./main.go:3:2: undefined: x"
    assert "brnet: go build: ./main.go:3:2: undefined: x" in lines
    out_dir = tmp_path / "cache" / "brnet" / source_hash(BRNET_SRC)
    assert list(out_dir.iterdir()) == []


def test_python_m_brnet_prints_build_progress_on_stderr(tmp_path: Path) -> None:
    modcache = tmp_path / "gomodcache"
    modcache.mkdir()
    env = {
        **ENV,
        "BRMCP_GO": str(_fake_go(tmp_path)),
        "BRMCP_CACHE_DIR": str(tmp_path / "cache"),
        "FAKE_GOMODCACHE": str(modcache),
    }
    done = subprocess.run(
        [sys.executable, "-m", "brmcp.testing.brnet", "-users", "a,b"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # A test network tips at once unless told otherwise (brclient waits a minute).
    assert done.stdout == "fake brnet ran -tiprestartdelay=1s -users a,b\n"
    progress = done.stderr.splitlines()
    assert progress[0].startswith("brnet: first build of brnet:")
    assert progress[-1].startswith("brnet: built ")


def test_the_demo_prints_brnet_build_progress_on_stderr_not_in_the_transcript(tmp_path: Path) -> None:
    modcache = tmp_path / "gomodcache"
    modcache.mkdir()
    env = {
        **ENV,
        "BRMCP_GO": str(_fake_go(tmp_path)),
        "BRMCP_CACHE_DIR": str(tmp_path / "cache"),
        "FAKE_GOMODCACHE": str(modcache),
    }
    done = subprocess.run(
        [sys.executable, "-m", "brmcp", "demo", "--network", "real", "--datadir", str(tmp_path / "d")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # The fake brnet exits at once, so the network step fails after the build.
    assert done.returncode == 1
    assert "brnet: first build of brnet:" in done.stderr
    assert "brnet: downloading Go modules: 3 so far" in done.stderr
    assert "brnet: built " in done.stderr
    assert "brnet: " not in done.stdout.replace("brnet (the real Bison Relay network): ", "")
    assert "brmcp demo failed: brnet did not start" in done.stderr


def _path_without_go() -> str:
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    return os.pathsep.join(d for d in dirs if not (Path(d) / "go").exists())


def test_the_demo_without_go_is_one_line_naming_what_to_install(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "BRMCP_GO"}
    env["PATH"] = _path_without_go()
    done = subprocess.run(
        [sys.executable, "-m", "brmcp", "demo", "--network", "real"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"brmcp demo: {NO_GO}"]
    assert "Go >= 1.22" in NO_GO
    assert "https://go.dev/dl/" in NO_GO
    assert "plain 'brmcp demo' needs no Go" in NO_GO
    assert list(tmp_path.iterdir()) == []


def test_python_m_brnet_without_go_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "BRMCP_GO"}
    env["PATH"] = _path_without_go()
    done = subprocess.run(
        [sys.executable, "-m", "brmcp.testing.brnet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "brnet: Go toolchain not found (install Go >= 1.22 from https://go.dev/dl/ "
        "to build brnet, the real BR network)"
    ]
