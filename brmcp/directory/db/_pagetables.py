"""The directory's side of snapshot pages (docs/directory.md §Snapshot
pages): the generations held in memory and who may fetch them, and the
removal times (``dir_removed``) that changes answer from. The three extension tools that sell them are in
:mod:`brmcp.directory.tools._pages`. The signed formats and their verification are in
:mod:`brmcp.directory.model._pages`; the Go reference (karamble/brmcp,
``directory/snapshot.go``) has only the one-message ``get_snapshot``.

* **Changes** since ``since`` are the listings stamped at or after it (less
  :data:`CHANGES_OVERLAP_SECONDS`, which only re-sends what a copy already
  holds) that are live now, and the uids removed since then that are not
  live now; a payload larger than :data:`CHANGES_MAX_BYTES` is refused.
  Removals are kept as tombstones for :data:`TOMBSTONE_DAYS` days; a
  ``since`` before the oldest kept is refused with a message starting
  :data:`TOO_OLD` (fetch the pages again).
* A caller who bought no manifest is refused pages and changes with a
  message starting :data:`NOT_ENTITLED`.

Times are unix seconds, sizes bytes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable

import anyio

from ..model import PAGE_MAX_BYTES, Generation, Signer, SnapshotListing, build_generation
from ._rows import LISTING_COLUMNS, Listing, listing_of

__all__ = [
    "CHANGES_MAX_BYTES",
    "CHANGES_OVERLAP_SECONDS",
    "ENTITLEMENT_SECONDS",
    "HELD_GENERATIONS",
    "NOT_ENTITLED",
    "PAGES_SCHEMA",
    "PAGE_TOOLS",
    "REGENERATE_SECONDS",
    "TOMBSTONE_DAYS",
    "TOO_OLD",
    "SnapshotPages",
    "changes_since",
    "open_tables",
    "record_removal",
    "tombstone_horizon",
]

#: The bound of one changes payload; past it the answer is "too many
#: changes" and the consumer fetches the pages.
CHANGES_MAX_BYTES = 3 << 20
#: How long a removal is remembered for changes.
TOMBSTONE_DAYS = 14
#: Changes reach back this far before ``since``: a listing's stamp is taken
#: just before its transaction commits, so a commit that waited is still
#: seen. Applying a listing twice is harmless.
CHANGES_OVERLAP_SECONDS = 300
#: A new generation is built for a manifest sale at most this often; a sold
#: generation is held (its pages served) at least this long after the sale.
REGENERATE_SECONDS = 600
#: Generations held in memory at once (the newest and the one before).
HELD_GENERATIONS = 2
#: A manifest sale lets its buyer fetch changes free for this long.
ENTITLEMENT_SECONDS = 86_400
#: The start of the refusal of a ``since`` older than the tombstones.
TOO_OLD = "too old"
#: The start of the refusal of a caller who bought no manifest.
NOT_ENTITLED = "buy get_snapshot_manifest first"

#: The extension tools, in registration order.
PAGE_TOOLS = ("get_snapshot_manifest", "get_snapshot_page", "get_snapshot_changes")

PAGES_SCHEMA = """
CREATE TABLE IF NOT EXISTS dir_removed (
    uid        TEXT PRIMARY KEY,
    removed_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS dir_removed_at ON dir_removed (removed_at);
CREATE TABLE IF NOT EXISTS dir_removed_horizon (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    horizon INTEGER NOT NULL
);
"""


# -- tombstones (inside the store's transactions) ----------------------------------


def open_tables(conn: sqlite3.Connection, now: int) -> None:
    """Create ``dir_removed`` and its horizon when missing. A new horizon is
    ``now``: removals before the table existed were not recorded."""
    for statement in PAGES_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("INSERT OR IGNORE INTO dir_removed_horizon (id, horizon) VALUES (1, ?)", (now,))


def tombstone_horizon(conn: sqlite3.Connection) -> int:
    """The earliest ``since`` changes can answer (unix seconds)."""
    row = conn.execute("SELECT horizon FROM dir_removed_horizon WHERE id = 1").fetchone()
    return int(row[0]) if row else 0


def record_removal(conn: sqlite3.Connection, uid: str, now: int, *, keep_days: int = TOMBSTONE_DAYS) -> None:
    """Remember that ``uid``'s listing went at ``now``, in the caller's
    transaction (the one deleting the listing). Tombstones older than
    ``keep_days`` days are dropped first and the horizon moves past them."""
    cutoff = now - keep_days * 86_400
    row = conn.execute("SELECT MAX(removed_at) FROM dir_removed WHERE removed_at < ?", (cutoff,)).fetchone()
    if row is not None and row[0] is not None:
        conn.execute("DELETE FROM dir_removed WHERE removed_at < ?", (cutoff,))
        conn.execute(
            "UPDATE dir_removed_horizon SET horizon = MAX(horizon, ?) WHERE id = 1", (int(row[0]) + 1,)
        )
    conn.execute("INSERT OR REPLACE INTO dir_removed (uid, removed_at) VALUES (?, ?)", (uid, now))


def changes_since(conn: sqlite3.Connection, since: int) -> tuple[int, list[Listing], list[str]]:
    """``(horizon, upserts, removals)`` for ``since``: the live listings
    whose latest stamp (crawl, test, approval, renewal) is at or after
    ``since - CHANGES_OVERLAP_SECONDS``, and the uids removed since then that
    are not live, both ordered by uid."""
    start = since - CHANGES_OVERLAP_SECONDS
    upserts = [
        listing_of(row)
        for row in conn.execute(
            f"SELECT {LISTING_COLUMNS} FROM dir_listings WHERE MAX(catalog_checked_at, "
            "last_verified_execution, approved_at, renewed_at) >= ? ORDER BY uid",
            (start,),
        )
    ]
    removals = [
        str(row[0])
        for row in conn.execute(
            "SELECT uid FROM dir_removed WHERE removed_at >= ? "
            "AND uid NOT IN (SELECT uid FROM dir_listings) ORDER BY uid",
            (start,),
        )
    ]
    return tombstone_horizon(conn), upserts, removals


# -- the generations and the tools ---------------------------------------------------


class SnapshotPages:
    """The generations one directory serves and who may fetch them.

    ``read()`` returns ``(generatedAt, listings)`` read in one transaction.
    ``page_bytes`` bounds a page payload (None: :data:`PAGE_MAX_BYTES`).
    A manifest sale reuses the newest generation when it is younger than
    ``regenerate_seconds`` and builds one otherwise; the last
    :data:`HELD_GENERATIONS` are held in memory. A buyer may fetch the pages
    of a generation it bought and, for ``entitlement_seconds`` after a sale,
    changes. Entitlements are in memory: after a restart a consumer buys a
    manifest again."""

    def __init__(
        self,
        signer: Signer,
        read: Callable[[], Awaitable[tuple[int, list[SnapshotListing]]]],
        clock: Callable[[], float],
        *,
        page_bytes: int | None = None,
        regenerate_seconds: int = REGENERATE_SECONDS,
        entitlement_seconds: int = ENTITLEMENT_SECONDS,
    ) -> None:
        self._signer = signer
        self._read = read
        self._clock = clock
        self._page_bytes = PAGE_MAX_BYTES if page_bytes is None else page_bytes
        self._regenerate = regenerate_seconds
        self._entitlement = entitlement_seconds
        self._held: list[Generation] = []
        self._bought: dict[str, int] = {}
        self._lock = anyio.Lock()

    async def sell_manifest(self, buyer: str) -> dict[str, str]:
        """The signed manifest of the current generation, recording
        ``buyer`` as entitled to its pages and to changes."""
        async with self._lock:
            now = int(self._clock())
            newest = self._held[-1] if self._held else None
            if newest is None or now - newest.generated_at >= self._regenerate:
                generated_at, listings = await self._read()
                if newest is not None and generated_at <= newest.generated_at:
                    generated_at = newest.generated_at + 1
                newest = await anyio.to_thread.run_sync(
                    lambda: build_generation(self._signer, listings, generated_at, max_bytes=self._page_bytes)
                )
                self._held = [*self._held, newest][-HELD_GENERATIONS:]
            newest.buyers.add(buyer)
            self._bought = {p: t for p, t in self._bought.items() if now - t < self._entitlement}
            self._bought[buyer] = now
            return newest.manifest

    def page(self, buyer: str, generated_at: int, index: int) -> dict[str, str]:
        """Page ``index`` of the generation ``generated_at``. Raises
        ValueError when that generation is not held, ``buyer`` did not buy
        it, or there is no such page."""
        held = next((g for g in self._held if g.generated_at == generated_at), None)
        if held is None:
            raise ValueError(
                f"generation {generated_at} is not held (held: "
                f"{[g.generated_at for g in self._held]}); buy get_snapshot_manifest again"
            )
        if buyer not in held.buyers:
            raise ValueError(f"{NOT_ENTITLED}: pages are free to the buyers of their generation's manifest")
        if not 0 <= index < len(held.pages):
            raise ValueError(
                f"index {index} out of range: generation {generated_at} has {len(held.pages)} pages"
            )
        return held.pages[index]

    def entitled(self, buyer: str) -> bool:
        """Whether ``buyer`` bought a manifest within the entitlement window."""
        bought = self._bought.get(buyer)
        return bought is not None and int(self._clock()) - bought < self._entitlement
