"""Shared pytest configuration: every ``async def`` test runs on anyio's
asyncio backend (``anyio_mode = "auto"`` in pyproject.toml; the SDK, aiohttp
and websockets all need asyncio)."""

from __future__ import annotations

import pytest

# One private PostgreSQL server per test run, for every module that asks for it.
from tests.kit.postgres import postgres_server, postgres_url

__all__ = ["anyio_backend", "postgres_server", "postgres_url"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
