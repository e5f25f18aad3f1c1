"""Where things are: the repository root and the test vectors."""

from __future__ import annotations

from pathlib import Path

#: The repository root (the directory holding README.md and pyproject.toml).
REPO = Path(__file__).resolve().parents[2]
#: Test vectors and recorded observations (tests/vectors).
VECTORS = REPO / "tests" / "vectors"

__all__ = ["REPO", "VECTORS"]
