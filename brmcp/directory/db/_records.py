"""How the directory's tables are reached: every operation is one
transaction of the harness's database, run off the event loop and shielded
from cancellation, so its effects stand once it started. The base of the
store classes (:class:`~._peers.PeerRecords`, :class:`~._store.DirectoryStore`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

import anyio

from brmcp.server import Harness

from ._sql import adapt

__all__ = ["Records"]

T = TypeVar("T")


class Records:
    """Transactions on ``harness``'s database (SQLite or PostgreSQL)."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness

    def _now(self) -> int:
        # Read inside a transaction: a tombstone's stamp then orders with the
        # reads of docs/directory.md §Snapshot pages.
        return int(self._harness.config.clock())

    async def _run(self, op: Callable[[sqlite3.Connection], T]) -> T:
        with anyio.CancelScope(shield=True):
            result = await self._harness.transact(adapt(op))
        return result

    async def run(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` as one transaction of the harness, off the event loop
        and shielded from cancellation (for the ops of
        :mod:`brmcp.directory.db._ratings` and :mod:`brmcp.directory.db._reputation`);
        what ``op`` raises rolls it back and is raised."""
        return await self._run(op)
