"""The PostgreSQL side of :class:`~.._conn.Connection`: the store's shared
SQL, written with SQLite's ``?`` placeholders, run through a psycopg 3
connection, and the errors that mean "run the transaction again"."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import psycopg

__all__ = ["RETRY_SQLSTATES", "PgConnection", "RowLocked", "is_retryable", "translate"]

T = TypeVar("T")

#: SQLSTATEs after which the whole transaction is rolled back and run again:
#: ``40001`` serialization_failure (a concurrent transaction's writes
#: conflict with what this one read), ``40P01`` deadlock_detected and
#: ``55P03`` lock_not_available (a lock wait past the executor's
#: ``lock_timeout``).
RETRY_SQLSTATES = frozenset({"40001", "40P01", "55P03"})


@functools.lru_cache(maxsize=256)
def translate(sql: str) -> str:
    """``sql`` with each ``?`` placeholder as psycopg's ``%s`` (a literal
    ``%`` doubled). The store's SQL holds no ``?`` inside a string literal;
    one that does raises :class:`ValueError` rather than binding wrongly."""
    if "'" in sql and "?" in "".join(sql.split("'")[1::2]):
        raise ValueError(f"a '?' inside a string literal cannot be translated: {sql}")
    return sql.replace("%", "%%").replace("?", "%s")


class PgConnection:
    """What a store operation sees on PostgreSQL: :meth:`execute` with
    ``?`` parameters, inside the transaction
    :class:`~.executor.PostgresExecutor` opened. ``raw`` is the psycopg
    connection (autocommit; the executor issues BEGIN/COMMIT)."""

    __slots__ = ("raw",)

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[Any]:
        """Run one statement; returns psycopg's cursor (``fetchone``,
        ``fetchall``, iteration, ``rowcount``). Raises ``psycopg.Error``."""
        return self.raw.execute(translate(sql), tuple(parameters))


class RowLocked(Generic[T]):
    """A store operation correct under ``READ COMMITTED``: every decision it
    takes is made by the statement that writes, on rows that statement locks
    (:mod:`.paidcalls` argues it for the paid-call path). Calling it calls
    ``op``; :class:`~.executor.PostgresExecutor` runs it in a ``READ
    COMMITTED`` transaction (with the other such operations of its batch)
    instead of a ``SERIALIZABLE`` one, so it takes no predicate locks and
    conflicts only with transactions writing the same rows."""

    __slots__ = ("op",)

    def __init__(self, op: Callable[[PgConnection], T]) -> None:
        self.op = op

    def __call__(self, conn: PgConnection) -> T:
        return self.op(conn)


def is_retryable(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised from) is a psycopg error
    whose SQLSTATE is in :data:`RETRY_SQLSTATES`."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return False
        state = getattr(seen, "sqlstate", None)
        if isinstance(state, str) and state in RETRY_SQLSTATES:
            return True
        seen = seen.__cause__ or seen.__context__
    return False
