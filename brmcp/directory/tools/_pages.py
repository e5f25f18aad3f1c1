"""The snapshot pages' tools (docs/directory.md §Snapshot pages):
``get_snapshot_manifest`` sells a signed manifest, ``get_snapshot_page`` its
pages and ``get_snapshot_changes`` the changes since a generation. The
generations and the removal tombstones they answer from are in
:mod:`brmcp.directory.db._pagetables`; the tools type against
:class:`~brmcp.directory.tools._parts.DirectoryParts` so they need not import the
service that registers them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from brmcp.server import CallContext, Harness

from ..db import (
    CHANGES_MAX_BYTES,
    NOT_ENTITLED,
    PAGE_TOOLS,
    TOO_OLD,
    Listing,
    SnapshotPages,
    adapt,
    all_listings,
    changes_since,
)
from ..model import SnapshotListing, build_changes_payload
from ._parts import DirectoryParts

__all__ = ["PAGE_TOOLS", "register_pages_tools"]


def _whole(args: dict[str, Any], key: str) -> int:
    value = args.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key}: expected a non-negative integer (unix seconds), got {value!r}")
    return value


def register_pages_tools(
    harness: Harness, directory: DirectoryParts, to_listing: Callable[[Listing], SnapshotListing]
) -> SnapshotPages:
    """Add :data:`PAGE_TOOLS` to ``harness``: ``get_snapshot_manifest``
    (``{}``, priced ``snapshot_price_atoms``), ``get_snapshot_page``
    (``{index, generatedAt}``, free to the manifest's buyers) and
    ``get_snapshot_changes`` (``{since}``, free within
    :data:`ENTITLEMENT_SECONDS` of a manifest purchase). Returns the
    generations' holder."""
    clock = harness.config.clock

    async def read() -> tuple[int, list[SnapshotListing]]:
        def op(conn: sqlite3.Connection) -> tuple[int, list[SnapshotListing]]:
            return int(clock()), [to_listing(item) for item in all_listings(conn)]

        with anyio.CancelScope(shield=True):
            result = await harness.transact(adapt(op))
        return result

    pages = SnapshotPages(directory.signer, read, clock)

    async def get_snapshot_manifest(ctx: CallContext, args: dict[str, Any]) -> Any:
        return await pages.sell_manifest(ctx.peer)

    async def get_snapshot_page(ctx: CallContext, args: dict[str, Any]) -> Any:
        return pages.page(ctx.peer, _whole(args, "generatedAt"), _whole(args, "index"))

    async def get_snapshot_changes(ctx: CallContext, args: dict[str, Any]) -> Any:
        since = _whole(args, "since")
        if not pages.entitled(ctx.peer):
            raise ValueError(f"{NOT_ENTITLED}: changes are free for a day after a manifest purchase")

        def op(conn: sqlite3.Connection) -> tuple[int, int, list[Listing], list[str]]:
            return (int(clock()), *changes_since(conn, since))

        with anyio.CancelScope(shield=True):
            now, horizon, upserts, removals = await harness.transact(adapt(op))
        if since < horizon:
            raise ValueError(
                f"{TOO_OLD}: since {since} is before the oldest removal kept ({horizon}); "
                "fetch the full pages (get_snapshot_manifest)"
            )
        if since > now:
            raise ValueError(f"since {since} is after the directory's time {now}")
        payload = build_changes_payload(since, now, [to_listing(item) for item in upserts], removals)
        if len(payload) > CHANGES_MAX_BYTES:
            raise ValueError(
                f"too many changes since {since} ({len(payload)} bytes, more than {CHANGES_MAX_BYTES}): "
                "fetch the full pages (get_snapshot_manifest)"
            )
        return await anyio.to_thread.run_sync(lambda: directory.signer.sign(payload))

    int_schema = {"type": "integer", "minimum": 0}
    tools: list[
        tuple[str, str, Callable[[CallContext, dict[str, Any]], Awaitable[Any]], dict[str, Any], int]
    ] = [
        (
            "get_snapshot_manifest",
            "Buy the signed manifest of the index in pages: {payload, sig, pub}, the payload "
            "{v, generatedAt, pageSize, pages: [{index, count, sha256, firstUid, lastUid}], total, pub}. "
            "Its buyer then fetches the pages, and changes for a day, free.",
            get_snapshot_manifest,
            {"type": "object", "additionalProperties": False},
            directory.policy.snapshot_price_atoms,
        ),
        (
            "get_snapshot_page",
            "Fetch one signed page of a bought manifest's generation: {payload, sig, pub}, the payload "
            "{v, generatedAt, page, listings}. Verify its sha256 against the manifest.",
            get_snapshot_page,
            {
                "type": "object",
                "properties": {"index": int_schema, "generatedAt": int_schema},
                "required": ["index", "generatedAt"],
                "additionalProperties": False,
            },
            0,
        ),
        (
            "get_snapshot_changes",
            "Fetch the signed changes since a generatedAt: {payload, sig, pub}, the payload "
            "{v, since, generatedAt, upserts, removals}. Free for a day after a manifest purchase.",
            get_snapshot_changes,
            {
                "type": "object",
                "properties": {"since": int_schema},
                "required": ["since"],
                "additionalProperties": False,
            },
            0,
        ),
    ]
    for name, description, handler, schema, price in tools:
        harness.add_tool(name, handler, description=description, input_schema=schema, price_atoms=price)
    return pages
