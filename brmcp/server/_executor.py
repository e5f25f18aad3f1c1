"""Group commit for SQLite: run store operations off the event loop, many
per transaction.

Operations queued while a transaction is being committed are committed
together in the next one, so concurrent paid calls share fsyncs. Each
operation runs inside its own SAVEPOINT: one failing operation rolls back
only itself. A failed COMMIT fails every operation of that batch and leaves
the database as it was before the batch.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio

T = TypeVar("T")

Op = Callable[[sqlite3.Connection], Any]


class _Slot(Generic[T]):
    __slots__ = ("error", "event", "finished", "op", "result")

    def __init__(self, op: Callable[[sqlite3.Connection], T]) -> None:
        self.op = op
        self.result: T | None = None
        self.error: BaseException | None = None
        self.finished = False
        self.event = anyio.Event()


class GroupCommitExecutor:
    """Serialises all access to one SQLite connection (opened with
    ``check_same_thread=False`` and ``isolation_level=None``)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._queue: list[_Slot[Any]] = []
        self._busy = False
        self.batches = 0  #: transactions committed (for tests and benchmarks)
        self.operations = 0

    def run_now(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run one operation in its own transaction on the calling thread
        (start-up, before an event loop serves traffic)."""
        slot = _Slot(op)
        self._execute([slot])
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    async def run(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Queue ``op`` and return its result once its transaction committed.

        Raises whatever ``op`` raised, or the ``sqlite3.Error`` of a failed
        commit. A caller cancelled while its operation is still queued
        withdraws it; once the transaction is in flight it completes and its
        effects stand, so money paths call this inside a shielded scope.
        """
        slot: _Slot[T] = _Slot(op)
        self._queue.append(slot)
        while not slot.finished:
            if self._busy:
                try:
                    await slot.event.wait()
                except BaseException:
                    # Cancelled before running: withdraw the operation so a
                    # gone caller never gets effects it cannot observe.
                    if slot in self._queue:
                        self._queue.remove(slot)
                        if self._queue and not self._busy:
                            self._queue[0].event.set()
                    raise
                if not slot.finished:
                    slot.event = anyio.Event()
                continue
            self._busy = True
            batch, self._queue = self._queue, []
            try:
                await anyio.to_thread.run_sync(self._execute, batch)
            finally:
                self._busy = False
                for done in batch:
                    done.finished = True
                    done.event.set()
                if self._queue:
                    # Hand leadership to the oldest waiter.
                    self._queue[0].event.set()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _execute(self, batch: list[_Slot[Any]]) -> None:
        conn = self._conn
        with self._lock:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                for slot in batch:
                    slot.error = exc
                return
            for slot in batch:
                conn.execute("SAVEPOINT op")
                try:
                    slot.result = slot.op(conn)
                except BaseException as exc:  # recorded for the caller, never lost
                    slot.error = exc
                    conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                for slot in batch:
                    slot.result = None
                    slot.error = exc
                return
            self.batches += 1
            self.operations += len(batch)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
