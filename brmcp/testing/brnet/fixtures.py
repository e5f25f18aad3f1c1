"""Pytest fixtures for real-network tests (use with
``pytest_plugins = ["brmcp.testing.brnet.fixtures"]``).

* ``brnet_exe`` (session): the built brnet, or the test is skipped with the
  reason (no Go, no sources, module proxy unreachable);
* ``brnet`` (function): a started two-user network (``alice``, ``bob``) on a
  fresh root under ``tmp_path``, stopped afterwards;
* ``brnet_factory`` (function): ``factory(**BrNet options)`` starts more
  networks (each on its own root), all stopped afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .build import BrNetUnavailable, brnet_binary
from .network import BrNet

__all__ = ["brnet", "brnet_exe", "brnet_factory"]


@pytest.fixture(scope="session")
def brnet_exe() -> Path:
    try:
        return brnet_binary()
    except BrNetUnavailable as exc:
        pytest.skip(f"real BR network unavailable: {exc}")


@pytest.fixture
def brnet_factory(brnet_exe: Path, tmp_path: Path) -> Iterator[Callable[..., BrNet]]:
    started: list[BrNet] = []

    def factory(**options: Any) -> BrNet:
        root = options.pop("root", None) or tmp_path / f"brnet{len(started)}"
        net = BrNet(root, binary=brnet_exe, **options)
        started.append(net)
        return net.start()

    yield factory
    for net in started:
        net.stop()


@pytest.fixture
def brnet(brnet_factory: Callable[..., BrNet]) -> BrNet:
    return brnet_factory()
