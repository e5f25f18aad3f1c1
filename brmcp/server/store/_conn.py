"""The connection every store operation takes: what :mod:`.ledger`,
:mod:`.journal` and :mod:`.tips` use of a database connection, satisfied by
:class:`sqlite3.Connection` and by the PostgreSQL adapter
(:class:`~.postgres.connection.PgConnection`).

The operations write their SQL once, with ``?`` placeholders and the
dialect SQLite and PostgreSQL share (``INSERT ... ON CONFLICT``, partial
unique indexes, ``LIMIT``); the PostgreSQL adapter rewrites the placeholders
for its driver.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

__all__ = ["Connection", "Cursor"]


class Cursor(Protocol):
    """A statement's result: rows as tuples (``fetchone`` None when none
    is left), ``rowcount`` the rows a DELETE or UPDATE touched."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """Executes one statement with positional ``?`` parameters, inside the
    transaction the backend's executor opened (never commits itself)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...
