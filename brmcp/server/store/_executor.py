"""Group commit: run store operations off the event loop, many per
transaction (:class:`BatchExecutor`; SQLite: :class:`GroupCommitExecutor`,
PostgreSQL: :class:`~.store.postgres.executor.PostgresExecutor`).

Operations queued while a transaction is being committed are committed
together in the next one, so concurrent paid calls share fsyncs. Each
operation runs inside its own SAVEPOINT: one failing operation rolls back
only itself. A failed COMMIT fails every operation of that batch and leaves
the database as it was before the batch.

On asyncio (the backend the MCP SDK needs) batches run on the executor's
own worker thread, handed over with a bare future: about a quarter of the
CPU cost of a generic ``anyio.to_thread`` hop, which matters because every
paid call makes two. Other anyio backends use ``anyio.to_thread``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio

T = TypeVar("T")
C = TypeVar("C")

Op = Callable[[sqlite3.Connection], Any]

__all__ = ["BatchExecutor", "GroupCommitExecutor", "Slot"]


class Slot(Generic[T]):
    """One queued operation: ``op`` and, once its batch ran, its ``result``
    or ``error`` (``ran`` is set by the worker thread once the batch was
    attempted)."""

    __slots__ = ("error", "event", "finished", "op", "ran", "result")

    def __init__(self, op: Callable[[Any], T]) -> None:
        self.op = op
        self.result: T | None = None
        self.error: BaseException | None = None
        self.finished = False
        self.ran = False  #: set by the worker thread once the batch was attempted
        self.event = anyio.Event()


class BatchExecutor(abc.ABC, Generic[C]):
    """Group commit over one connection of type ``C``: the queueing, the
    leader hand-over and the worker thread. A backend supplies
    :meth:`_execute` (run one batch in one transaction, recording each
    slot's result or error, never raising) and :meth:`_close_connection`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[Slot[Any]] = []
        self._busy = False
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self.batches = 0  #: transactions committed (for tests and benchmarks)
        self.operations = 0

    def run_now(self, op: Callable[[C], T]) -> T:
        """Run one operation in its own transaction on the calling thread
        (start-up, before an event loop serves traffic)."""
        slot: Slot[T] = Slot(op)
        self._execute([slot])
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    async def run(self, op: Callable[[C], T]) -> T:
        """Queue ``op`` and return its result once its transaction committed.

        Raises whatever ``op`` raised, or the ``sqlite3.Error`` of a failed
        commit (the backend driver's error). A caller cancelled while its operation is still queued
        withdraws it; once the transaction is in flight it completes and its
        effects stand, so money paths call this inside a shielded scope.
        """
        slot: Slot[T] = Slot(op)
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
                # Shielded: once other callers' operations are in this batch the
                # leader must see it through, or they would be marked finished
                # without ever running (handing the batch to a thread is a
                # checkpoint). A cancelled leader still raises after the batch.
                with anyio.CancelScope(shield=True):
                    await self._in_thread(batch)
            except BaseException as exc:
                for done in batch:
                    if not done.ran:
                        done.error = exc
                raise
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

    async def _in_thread(self, batch: list[Slot[Any]]) -> None:
        """Run :meth:`_execute` on the worker thread and wait until it is
        done, even through a cancellation (re-raised afterwards)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio
            await anyio.to_thread.run_sync(self._execute, batch)
            return
        done = loop.create_future()

        def job() -> None:
            try:
                self._execute(batch)
            except BaseException as exc:  # never leave a caller with a silent None
                for slot in batch:
                    if slot.error is None:
                        slot.result = None
                        slot.error = exc
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is already closed
                    loop.call_soon_threadsafe(_resolve, done)

        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="brmcp-ledger", daemon=True)
            self._worker.start()
        self._jobs.put(job)
        cancelled: BaseException | None = None
        while not done.done():
            try:
                await asyncio.shield(done)
            except asyncio.CancelledError as exc:
                cancelled = exc
        if cancelled is not None:
            raise cancelled

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    @abc.abstractmethod
    def _execute(self, batch: list[Slot[Any]]) -> None:
        """Run ``batch`` in one transaction on the calling thread, setting
        each slot's ``result`` or ``error``."""

    @abc.abstractmethod
    def _close_connection(self) -> None:
        """Close the backend's connection (called once, under the lock)."""

    def close(self) -> None:
        """Stop the worker thread (after the batches handed to it) and close
        the connection."""
        worker, self._worker = self._worker, None
        if worker is not None:
            self._jobs.put(None)
            worker.join()
        with self._lock:
            self._close_connection()


class GroupCommitExecutor(BatchExecutor[sqlite3.Connection]):
    """Serialises all access to one SQLite connection (opened with
    ``check_same_thread=False`` and ``isolation_level=None``)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__()
        self._conn = conn

    def _execute(self, batch: list[Slot[Any]]) -> None:
        conn = self._conn
        with self._lock:
            for slot in batch:
                slot.ran = True
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                for slot in batch:
                    slot.error = exc
                return
            try:
                for slot in batch:
                    conn.execute("SAVEPOINT op")
                    try:
                        slot.result = slot.op(conn)
                    except BaseException as exc:  # recorded for the caller, never lost
                        slot.error = exc
                        conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                conn.execute("COMMIT")
            except BaseException as exc:
                # A failed COMMIT, or SQLite already rolled the whole transaction
                # back (disk full, I/O error) so the savepoint bookkeeping
                # failed: nothing of this batch is durable. Fail every operation
                # and leave the connection outside any transaction.
                if conn.in_transaction:
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

    def _close_connection(self) -> None:
        self._conn.close()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
