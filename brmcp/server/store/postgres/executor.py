"""PostgreSQL: the executor running store operations, group-committed,
on a psycopg 3 connection owned by a worker thread (nothing blocks the
event loop; :class:`~..._executor.BatchExecutor` hands batches over).

A batch is one ``SERIALIZABLE`` transaction, each operation inside its own
savepoint (one failing operation rolls back only itself, as on SQLite; a
batch of one operation needs none: its failure rolls the transaction back).
Operations wrapped in :class:`~.connection.RowLocked` (the paid-call path,
:mod:`.paidcalls`) are taken out of the batch and run together in one
``READ COMMITTED`` transaction first. When PostgreSQL aborts a transaction
with a serialization failure or a deadlock (:data:`~.connection.RETRY_SQLSTATES`)
-- from any statement or from ``COMMIT`` -- the whole transaction is rolled
back and every operation of it runs again from the start, up to
:data:`MAX_ATTEMPTS` times with a short random back-off (a transaction of
several operations that conflicts once is split, each operation then
retried in its own transaction; a lock wait past :data:`LOCK_TIMEOUT_MS`
counts as a conflict): nothing of an aborted attempt is durable, and
operations are plain functions of the connection, so a rerun applies each
movement once. Statements the executor itself sends are joined into one
round trip where they follow each other (``BEGIN ...; SAVEPOINT op``,
``RELEASE SAVEPOINT op; SAVEPOINT op``, ``RELEASE SAVEPOINT op; COMMIT``).
A lost connection fails the batch's operations with
:class:`~..records.StoreError` and is reopened for the next batch; when it
was lost during ``COMMIT`` the outcome is unknown: the operations fail with
:class:`~..records.CommitOutcomeUnknown` (the paid-call path then reads the
journal again, :mod:`brmcp.server.calls._doubt`), and the unique movement
refs, tip keys and call ids make any later repeat of those movements fail
instead of applying twice (the journal's start-up recovery settles the
calls).
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import TYPE_CHECKING, Any

from brmcp.server.store._executor import BatchExecutor, Slot

from ..records import CommitOutcomeUnknown, StoreError
from ..url import StoreURL
from .connection import PgConnection, RowLocked, is_retryable
from .driver import psycopg
from .schema import ensure_schema

if TYPE_CHECKING:
    import psycopg as psycopg_types

__all__ = [
    "CONNECT_TIMEOUT",
    "LOCK_TIMEOUT_MS",
    "MAX_ATTEMPTS",
    "READ_COMMITTED",
    "SERIALIZABLE",
    "PostgresExecutor",
]

#: Attempts of one batch before its serialization failures are reported.
MAX_ATTEMPTS = 30
#: Seconds a connection attempt may take.
CONNECT_TIMEOUT = 10
#: Milliseconds a statement waits for a row lock before its transaction is
#: rolled back and run again (``55P03``): two batches locking rows in
#: opposite orders then part in this time, not in the server's
#: ``deadlock_timeout`` (1 s by default).
LOCK_TIMEOUT_MS = 200
#: The isolation of a transaction of :class:`~.connection.RowLocked` operations.
READ_COMMITTED = "READ COMMITTED"
#: The isolation of every other transaction.
SERIALIZABLE = "SERIALIZABLE"


class _Broken(Exception):
    """The connection failed; ``during_commit`` when COMMIT had been sent."""

    def __init__(self, cause: BaseException, *, during_commit: bool) -> None:
        super().__init__(str(cause))
        self.during_commit = during_commit


class PostgresExecutor(BatchExecutor[PgConnection]):
    """Group commit over one PostgreSQL connection to ``url``'s database.

    Construction connects and creates or checks the schema
    (:func:`~.schema.ensure_schema`); raises :class:`~..records.StoreError`
    (password redacted) when the server cannot be reached, refuses the
    login, or holds a database that is not a brmcp one."""

    def __init__(self, url: StoreURL, *, rng: random.Random | None = None) -> None:
        super().__init__()
        self._url = url
        self._rng = rng or random.Random()
        self._driver = psycopg()
        self._raw: psycopg_types.Connection[Any] | None = None
        #: Transactions rolled back and run again (for tests and metrics).
        self.retries = 0
        raw = self._connect()
        try:
            ensure_schema(raw, url.redacted())
        except StoreError:
            raw.close()
            raise
        except self._driver.Error as exc:
            raw.close()
            raise StoreError(
                f"cannot prepare PostgreSQL store {url.redacted()}: {url.scrub(str(exc))}"
            ) from None
        self._raw = raw

    @property
    def url(self) -> StoreURL:
        return self._url

    def _connect(self) -> psycopg_types.Connection[Any]:
        try:
            raw: psycopg_types.Connection[Any] = self._driver.connect(
                self._url.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT
            )
            raw.execute(f"SET lock_timeout = {int(LOCK_TIMEOUT_MS)}")
        except self._driver.Error as exc:
            detail = self._url.scrub(str(exc).strip().replace("\n", " "))
            raise StoreError(f"cannot connect to PostgreSQL store {self._url.redacted()}: {detail}") from None
        return raw

    def _execute(self, batch: list[Slot[Any]]) -> None:
        with self._lock:
            for slot in batch:
                slot.ran = True
            locked = [slot for slot in batch if isinstance(slot.op, RowLocked)]
            rest = [slot for slot in batch if not isinstance(slot.op, RowLocked)]
            for group, isolation in ((locked, READ_COMMITTED), (rest, SERIALIZABLE)):
                if not group or self._run(group, isolation, attempts=1 if len(group) > 1 else MAX_ATTEMPTS):
                    continue
                # The batch conflicted with another process: run each operation in
                # its own transaction, so one hot row does not keep failing the rest.
                for slot in group:
                    self._run([slot], isolation, attempts=MAX_ATTEMPTS)

    def _run(self, batch: list[Slot[Any]], isolation: str, *, attempts: int) -> bool:
        """Run ``batch`` in one transaction of ``isolation``, retried up to
        ``attempts`` times on a conflict. True once done (committed, or
        failed for good with each slot's error set); False when the last
        attempt conflicted and the caller may try again (``attempts`` 1)."""
        error: BaseException | None = None
        for attempt in range(attempts):
            try:
                raw = self._raw if self._raw is not None and not self._raw.closed else self._reconnect()
                if self._attempt(raw, batch, isolation):
                    self.batches += 1
                    self.operations += len(batch)
                    return True
            except StoreError as exc:
                error = exc
                break
            except _Broken as exc:
                self._drop()
                detail = f": {self._url.scrub(str(exc))}"
                if exc.during_commit:
                    # Never rerun: the first run may be durable. The caller
                    # resolves it from the database (CommitOutcomeUnknown).
                    error = CommitOutcomeUnknown(
                        f"PostgreSQL store {self._url.redacted()}: connection lost during COMMIT "
                        f"(outcome unknown){detail}"
                    )
                    break
                error = StoreError(f"PostgreSQL store {self._url.redacted()}: connection lost{detail}")
                continue
            error = None  # a serialization conflict: run the batch again
            self.retries += 1
            if attempt + 1 < attempts:
                time.sleep(self._rng.uniform(0.0, min(0.05, 0.001 * 2**attempt)))
        else:
            if error is None and attempts == 1:
                return False
            error = error or StoreError(
                f"PostgreSQL store {self._url.redacted()}: {attempts} attempts of one transaction "
                "failed with serialization conflicts; nothing of it was written"
            )
        for slot in batch:
            slot.result = None
            slot.error = error
        return True

    def _attempt(self, raw: psycopg_types.Connection[Any], batch: list[Slot[Any]], isolation: str) -> bool:
        """One try of the batch in a transaction of ``isolation``: True once
        committed (or, for a batch of one operation that failed, rolled
        back with the slot's error set), False after a serialization
        failure (rolled back). Raises :class:`_Broken` when the connection
        fails."""
        conn = PgConnection(raw)
        single = len(batch) == 1
        for slot in batch:
            slot.result = None
            slot.error = None
        try:
            raw.execute(f"BEGIN ISOLATION LEVEL {isolation}" + ("" if single else "; SAVEPOINT op"))
            for index, slot in enumerate(batch):
                if index:
                    raw.execute("RELEASE SAVEPOINT op; SAVEPOINT op")
                try:
                    slot.result = slot.op(conn)
                except BaseException as exc:  # recorded for the caller, never lost
                    if is_retryable(exc):
                        self._rollback(raw)
                        return False
                    if raw.closed or raw.broken:
                        raise
                    slot.error = exc
                    if single:
                        self._rollback(raw)
                        return True
                    raw.execute("ROLLBACK TO SAVEPOINT op")
        except self._driver.Error as exc:
            if raw.closed or raw.broken:
                raise _Broken(exc, during_commit=False) from exc
            self._rollback(raw)
            if is_retryable(exc):
                return False
            raise StoreError(f"PostgreSQL store {self._url.redacted()}: {self._url.scrub(str(exc))}") from exc
        try:
            raw.execute("COMMIT" if single else "RELEASE SAVEPOINT op; COMMIT")
        except self._driver.Error as exc:
            if raw.closed or raw.broken:
                raise _Broken(exc, during_commit=True) from exc
            self._rollback(raw)
            if is_retryable(exc):
                return False
            raise StoreError(f"PostgreSQL store {self._url.redacted()}: {self._url.scrub(str(exc))}") from exc
        return True

    def _rollback(self, raw: psycopg_types.Connection[Any]) -> None:
        with contextlib.suppress(self._driver.Error):
            raw.execute("ROLLBACK")

    def _reconnect(self) -> psycopg_types.Connection[Any]:
        self._drop()
        self._raw = self._connect()
        return self._raw

    def _drop(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            with contextlib.suppress(Exception):
                raw.close()

    def _close_connection(self) -> None:
        self._drop()
