"""The store tests' backends: :func:`store_backend` runs each test once on
SQLite and once on a private PostgreSQL server (tests/kit/postgres.py; the
PostgreSQL run skips with the reason when no server can be started)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from brmcp.server import store
from brmcp.server.store._executor import BatchExecutor, GroupCommitExecutor
from brmcp.server.store.url import DEFAULT_STORE

__all__ = ["Backend", "store_backend"]

T = TypeVar("T")


@dataclass
class Backend:
    """One open store: ``name`` ``sqlite`` or ``postgresql``, its
    ``executor``, the ``store`` URL and ``data_dir`` a Harness would take."""

    name: str
    executor: BatchExecutor[Any]
    store_url: str
    data_dir: Path | None

    def run(self, op: Callable[[Any], T]) -> T:
        """``op`` in its own committed transaction."""
        return self.executor.run_now(op)

    def reopen(self) -> BatchExecutor[Any]:
        """A second executor on the same book (another process would have
        one)."""
        return open_executor(self.name, self.store_url, self.data_dir)


def open_executor(name: str, store_url: str, data_dir: Path | None) -> BatchExecutor[Any]:
    if name == "sqlite":
        assert data_dir is not None
        return GroupCommitExecutor(store.open_database(data_dir))
    from brmcp.server.store.postgres import PostgresExecutor
    from brmcp.server.store.url import parse_store_url

    return PostgresExecutor(parse_store_url(store_url))


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A fresh, empty store on each backend."""
    if request.param == "sqlite":
        backend = Backend("sqlite", open_executor("sqlite", DEFAULT_STORE, tmp_path), DEFAULT_STORE, tmp_path)
    else:
        url: str = request.getfixturevalue("postgres_url")
        backend = Backend("postgresql", open_executor("postgresql", url, None), url, None)
    try:
        yield backend
    finally:
        backend.executor.close()
