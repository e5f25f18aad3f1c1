"""Fixtures for the interop tier: the Go reference built from its git bundle.

Every test here needs the ``brmcp-goref`` command (``interop/go``); without
the bundle or a Go toolchain they skip with the reason
(:func:`brmcp.testing.goref.unavailable_reason`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from brmcp.testing import goref


@pytest.fixture(scope="session")
def goref_binary() -> Path:
    reason = goref.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return goref.build()


@pytest.fixture(scope="session")
def go_wire(goref_binary: Path) -> Iterator[goref.GoWire]:
    with goref.GoWire(goref_binary) as server:
        yield server
