"""Shared pytest configuration: every ``async def`` test runs on anyio's
asyncio backend (``anyio_mode = "auto"`` in pyproject.toml; the SDK, aiohttp
and websockets all need asyncio).

Two tiers (README.md §Quick start): the default run deselects the ``slow``,
``interop``, ``node``, ``browser`` and ``realnet`` markers; ``-m ""`` runs
everything. Two things differ between them so the default run stays quick:

* Property tests: in a run whose ``-m`` expression deselects ``slow`` (the
  default), every hypothesis test runs at most :data:`FAST_EXAMPLES`
  examples; a run that selects slow tests (``-m ""``) runs each test's own
  ``max_examples``. The examples are the same kind, only fewer.
* PM pacing: a router in this process hands PMs over at once unless the
  test is marked ``paced`` (the tests of pacing itself), asks for a
  non-default ``pm_interval``, or the run passes ``--paced``. A real brclient delivers a peer's PMs about
  100 ms apart (brmcp/transport/outbox.py); in-memory stacks only wait on
  that clock, they do not need it to be correct. Subprocesses (daemons,
  crash workers) keep their own configuration.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import settings

import brmcp.transport.outbox as outbox

# One private PostgreSQL server per test run, for every module that asks for it.
from tests.kit.postgres import postgres_server, postgres_url

__all__ = ["anyio_backend", "postgres_server", "postgres_url", "unpaced"]

#: The most examples a hypothesis test runs in the fast tier.
FAST_EXAMPLES = 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--paced", action="store_true", help="keep the real PM pacing in every test, not only the paced ones"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "paced: keep the real PM pacing (brmcp.transport.outbox.DEFAULT_PM_INTERVAL)"
    )


def _fast_tier(config: pytest.Config) -> bool:
    """Whether this run deselects the slow tests (the default ``-m``)."""
    return "not slow" in str(config.option.markexpr or "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _fast_tier(config):
        return
    for item in items:
        target = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        own = getattr(target, "_hypothesis_internal_use_settings", None)
        if target is None or not isinstance(own, settings) or not hasattr(target, "hypothesis"):
            continue
        if own.max_examples > FAST_EXAMPLES:
            target._hypothesis_internal_use_settings = settings(own, max_examples=FAST_EXAMPLES)


@pytest.fixture(autouse=True)
def unpaced(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Routers built with the default ``pm_interval`` send unpaced, unless
    the test is marked ``paced``."""
    if request.node.get_closest_marker("paced") is None and not request.config.getoption("--paced"):
        original = outbox.Outbox.__init__

        def init(
            self: outbox.Outbox, send: Callable[[str, str], Awaitable[None]], *, interval: float, **kw: Any
        ) -> None:
            if interval == outbox.DEFAULT_PM_INTERVAL:
                interval = 0.0
            original(self, send, interval=interval, **kw)

        monkeypatch.setattr(outbox.Outbox, "__init__", init)
