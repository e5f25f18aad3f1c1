"""Shared pytest configuration: every ``async def`` test runs on anyio's
asyncio backend (``anyio_mode = "auto"`` in pyproject.toml; the SDK, aiohttp
and websockets all need asyncio)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
