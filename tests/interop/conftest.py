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

# Signs that a build failed because the Go module proxy could not be reached
# (an environment without network, not a broken build).
_FETCH_ERRORS = (
    "dial tcp",
    "no such host",
    "i/o timeout",
    "connection refused",
    "proxyconnect",
    "TLS handshake",
)


@pytest.fixture(scope="session")
def goref_binary() -> Path:
    reason = goref.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    try:
        return goref.build()
    except goref.GoRefError as exc:
        if any(sign in str(exc) for sign in _FETCH_ERRORS):
            pytest.skip(f"Go modules for the reference could not be downloaded: {str(exc)[-300:]}")
        raise


@pytest.fixture(scope="session")
def go_wire(goref_binary: Path) -> Iterator[goref.GoWire]:
    with goref.GoWire(goref_binary) as server:
        yield server
