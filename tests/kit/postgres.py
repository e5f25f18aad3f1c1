"""A real PostgreSQL server for the store tests, private to the test run.

:func:`postgres_server` (session scope) starts one with
:func:`brmcp.testing.pgserver.start_server` (``initdb`` and ``pg_ctl`` on a
temporary directory, listening only on a Unix socket in it: no TCP port is
opened); :func:`postgres_url` creates a fresh database per test and yields
its ``store`` URL. Both skip with the reason when psycopg 3 or the binaries
are missing (searched on PATH and under ``/usr/lib/postgresql/*/bin``) or
when running as root with no way to run them as another user (initdb
refuses root; ``runuser`` or ``setpriv`` to the ``postgres`` or ``nobody``
account is used when present).

Import the fixtures into a test module (``from tests.kit.postgres import
postgres_server, postgres_url``) or a conftest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from brmcp.testing.pgserver import PostgresServer, ServerUnavailable, find_binaries, start_server

__all__ = ["PostgresServer", "find_binaries", "postgres_server", "postgres_url"]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """Start a private PostgreSQL server for the test run; stop it at the end."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(start_server())
        except ServerUnavailable as exc:
            pytest.skip(str(exc))
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the private server, as a ``store`` URL;
    dropped after the test."""
    url = postgres_server.create_database()
    try:
        yield url
    finally:
        postgres_server.drop_database(url)
