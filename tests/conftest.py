"""Shared pytest configuration: every ``async def`` test runs on anyio's
asyncio backend (the SDK, aiohttp and websockets all need asyncio)."""

from __future__ import annotations

import inspect

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and inspect.iscoroutinefunction(function):
            item.add_marker(pytest.mark.anyio)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
