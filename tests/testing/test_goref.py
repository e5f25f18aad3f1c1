"""brmcp.testing.goref without Go: where the reference is looked for, the
skip reasons, and the pin in interop/go (nothing committed points outside
the project)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brmcp.testing import goref


def test_pinned_commit_is_the_bundle_head() -> None:
    assert goref.pinned_commit() == "3a3e08ce83f7"


def test_interop_module_points_nowhere_outside_the_project() -> None:
    gomod = (goref.interop_dir() / "go.mod").read_text()
    assert "replace" not in gomod
    assert "github.com/karamble/brmcp v0.1.1-0.20260721235301-3a3e08ce83f7" in gomod
    for path in goref.interop_dir().iterdir():
        text = path.read_text()
        assert "/work/" not in text
        assert "../shared" not in text


def test_missing_bundle_is_a_skip_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.bundle"
    monkeypatch.setenv(goref.BUNDLE_ENV, str(missing))
    assert goref.bundle_path() == missing
    reason = goref.unavailable_reason()
    assert reason is not None
    assert str(missing) in reason
    assert "not found" in reason
    with pytest.raises(goref.GoRefError, match="not found"):
        goref.build()


def test_default_bundle_location_is_beside_the_project(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(goref.BUNDLE_ENV, raising=False)
    expected = goref.project_root().parent / "shared" / "go-reference" / "brmcp.bundle"
    assert goref.bundle_path() == expected


def test_missing_go_is_a_skip_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundle = tmp_path / "brmcp.bundle"
    bundle.write_bytes(b"# v2 git bundle\n")
    monkeypatch.setenv(goref.BUNDLE_ENV, str(bundle))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    reason = goref.unavailable_reason()
    assert reason is not None
    assert "Go toolchain not found" in reason
