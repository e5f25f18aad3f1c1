"""The directory's public tools, open to every KX'd peer (docs/directory.md
§Tools; karamble/brmcp, ``directory/tools.go``).

Each answer is structured output: ``structuredContent`` plus the same
object as compact JSON text, as the Go tools answer (the harness renders a
returned dict that way). A handler's ValueError becomes a tool error whose
text is its message.

=================== ========================= =====================================
tool                price                     answer
=================== ========================= =====================================
``register``        free                      ``StatusOut`` (the funding invoice)
``my_status``       free                      ``StatusOut``
``search``          ``search_price_atoms``    ``SearchOut``
``get_provider``    free                      ``ProviderOut``
``introduce``       free                      ``IntroduceOut``
``list_categories`` free                      ``CategoriesOut``
``policy``          free                      ``PolicyOut``
``get_snapshot``    ``snapshot_price_atoms``  ``{payload, sig, pub}``
``export_registry`` free                      ``{servers, metadata}`` (registry.py)
=================== ========================= =====================================

``register`` and ``my_status`` answers carry ``_meta["brmcp/statusResource"]``
naming the push-status resource (statuspush.py).

The index in pages (pagetools.py): ``get_snapshot_manifest`` (priced
``snapshot_price_atoms``), then ``get_snapshot_page`` and
``get_snapshot_changes`` (free to the manifest's buyer).

Ratings backed by signed receipts (ratings.py): ``rate`` and ``ratings``
(free); ``get_provider`` and ``search`` hits carry the provider's
``reputation`` (reputation.py) and ``get_provider`` its ``receiptKey`` and,
when it announced one under that key, its bot ``pool`` (poolinfo.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from brmcp.protocol.payment import PRICING_DYNAMIC
from brmcp.protocol.toolerrors import peer_error_text
from brmcp.server import CallContext, Harness

from ..db import (
    EXTENSION_PROPERTIES,
    Listing,
    SearchIndex,
    SearchRequest,
    listed_receipt_key,
    reputation_compact,
    reputation_summary,
    shown_pool,
    tool_price,
)
from ..model import (
    MAX_SEARCH_HITS,
    STATUS_HINT,
    CategoriesOut,
    IntroduceIn,
    IntroduceOut,
    PolicyOut,
    ProviderIn,
    ProviderOut,
    RegisterIn,
    SearchHit,
    SearchIn,
    SearchOut,
    ShapeError,
    SnapshotListing,
    go_lower,
    go_trim_space,
    normalize_tags,
)
from ._pages import PAGE_TOOLS, register_pages_tools
from ._parts import DirectoryParts
from ._ratings import RATING_TOOLS, register_rating_tools
from ._registry import register_export_tool

log = logging.getLogger("brmcp.directory")

__all__ = [
    "EMPTY_SCHEMA",
    "EXTENSION_KEYS",
    "EXTENSION_TOOLS",
    "INTRODUCE_NOTE",
    "PUBLIC_TOOLS",
    "UID_SCHEMA",
    "provider_out",
    "register_public_tools",
    "search_listings",
    "snapshot_listing",
    "tool_price",
]

#: The input schema of a tool without arguments (Go's ``struct{}``).
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": False}
#: ``{"uid": string}`` (Go's ``ProviderIn`` / ``IntroduceIn``).
UID_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"uid": {"type": "string"}},
    "required": ["uid"],
    "additionalProperties": False,
}
_STRINGS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
REGISTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "description": {"type": "string"},
        "tags": _STRINGS,
        "test": {
            "type": "object",
            "properties": {
                "tool": {"type": "string"},
                "args": {"type": "object"},
                "maxAtoms": {"type": "integer"},
            },
            "required": ["tool", "maxAtoms"],
            "additionalProperties": False,
        },
    },
    "required": ["description", "test"],
    "additionalProperties": False,
}
SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "tags": _STRINGS,
        "maxPriceAtoms": {"type": "integer"},
        **EXTENSION_PROPERTIES,
    },
    "additionalProperties": False,
}

#: The public tools, in registration order.
PUBLIC_TOOLS = (
    "register",
    "my_status",
    "search",
    "get_provider",
    "introduce",
    "list_categories",
    "policy",
    "get_snapshot",
    "export_registry",
    *PAGE_TOOLS,
    *RATING_TOOLS,
)

#: Public tools the Go reference's directory does not have.
EXTENSION_TOOLS = ("export_registry", *PAGE_TOOLS, *RATING_TOOLS)

#: Answer keys the Go reference's directory does not write (docs/directory.md
#: §Reputation): ``get_provider``'s ``receiptKey``, ``reputation`` and
#: ``pool`` (poolinfo.py), a search hit's ``reputation``. Go clients ignore them.
EXTENSION_KEYS = ("receiptKey", "reputation", "pool")

#: ``introduce``'s note when the suggestion was sent.
INTRODUCE_NOTE = "accept the KX suggestion in your client to complete the exchange"

Handler = Callable[[CallContext, dict[str, Any]], Awaitable[Any]]


def _catalog(listing: Listing) -> Any:
    try:
        return json.loads(listing.catalog) if listing.catalog else None
    except ValueError:
        return None


def provider_out(listing: Listing) -> ProviderOut:
    """``get_provider``'s answer for a listing."""
    return ProviderOut(
        uid=listing.uid,
        description=listing.description,
        catalog=_catalog(listing),
        tags=listing.tags,
        catalog_checked_at=listing.catalog_checked_at,
        last_verified_execution=listing.last_verified_execution,
        test_latency_ms=listing.test_latency_ms,
        approved_at=listing.approved_at,
        renewed_at=listing.renewed_at,
        expires_at=listing.expires_at,
    )


def snapshot_listing(listing: Listing) -> SnapshotListing:
    return SnapshotListing(
        uid=listing.uid,
        description=listing.description,
        catalog=listing.catalog,
        tags=listing.tags,
        catalog_checked_at=listing.catalog_checked_at,
        last_verified_execution=listing.last_verified_execution,
        expires_at=listing.expires_at,
    )


def search_listings(listings: list[Listing], query: SearchIn) -> SearchOut:
    """Go's ``handleSearch`` as a linear scan (the ``search`` tool answers
    from :mod:`brmcp.directory.db._search`, which gives the same answer; this
    is its reference): listings in uid order, every wanted tag on the
    listing, the query (trimmed and lowercased as Go does) in a tool's name or
    description, a price ceiling dropping dearer and dynamic tools; at most
    :data:`MAX_SEARCH_HITS` hits, ``total`` counting all."""
    text = go_lower(go_trim_space(query.query))
    wanted = set(normalize_tags(query.tags))
    hits: list[SearchHit] = []
    total = 0
    for listing in sorted(listings, key=lambda item: item.uid):
        if not wanted <= set(listing.tags):
            continue
        tools = _catalog(listing)
        if not isinstance(tools, list):
            continue
        for tool in tools:
            if not isinstance(tool, dict):
                continue
            name = tool.get("name") if isinstance(tool.get("name"), str) else ""
            description = tool.get("description") if isinstance(tool.get("description"), str) else ""
            if text and text not in go_lower(str(name)) and text not in go_lower(str(description)):
                continue
            price, dynamic = tool_price(tool.get("_meta"))
            if query.max_price_atoms > 0 and (dynamic or price > query.max_price_atoms):
                continue
            total += 1
            if len(hits) >= MAX_SEARCH_HITS:
                continue
            hits.append(
                SearchHit(
                    provider_uid=listing.uid,
                    tool=str(name),
                    description=str(description),
                    price_atoms=price,
                    pricing=PRICING_DYNAMIC if dynamic else "",
                    tags=listing.tags,
                    catalog_checked_at=listing.catalog_checked_at,
                    last_verified_execution=listing.last_verified_execution,
                )
            )
    return SearchOut(hits=tuple(hits), total=total)


def _decode(parse: Callable[[Any], Any], args: dict[str, Any]) -> Any:
    try:
        return parse(args)
    except ShapeError as exc:
        raise ValueError(str(exc)) from None


def register_public_tools(harness: Harness, directory: DirectoryParts) -> None:
    """Add the public tools of ``directory`` to ``harness`` (see the table
    in the module docstring)."""
    policy = directory.policy
    pipeline = directory.pipeline
    store = directory.store

    async def register(ctx: CallContext, args: dict[str, Any]) -> Any:
        application = _decode(RegisterIn.from_json, args)
        return (await pipeline.register(ctx.peer, application)).to_json()

    async def my_status(ctx: CallContext, args: dict[str, Any]) -> Any:
        return (await pipeline.status(ctx.peer)).to_json()

    index = SearchIndex(directory.harness)

    async def search(ctx: CallContext, args: dict[str, Any]) -> Any:
        request = _decode(SearchRequest.from_json, args)
        out = (await index.search(request, int(directory.clock.now()))).to_json()
        uids = [hit["providerUid"] for hit in out["hits"]]
        if uids:
            summaries = await store.run(lambda conn: reputation_compact(conn, uids))
            for hit in out["hits"]:
                hit["reputation"] = summaries[hit["providerUid"]]
        return out

    async def get_provider(ctx: CallContext, args: dict[str, Any]) -> Any:
        wanted = _decode(ProviderIn.from_json, args)
        listing = await store.listing(wanted.uid)
        if listing is None:
            raise ValueError("no listing for that uid")
        out = provider_out(listing).to_json()

        def read(conn: Any) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
            key = listed_receipt_key(conn, wanted.uid)
            return key, reputation_summary(conn, wanted.uid), shown_pool(conn, wanted.uid, key)

        key, summary, pool = await store.run(read)
        if key:
            out["receiptKey"] = key
        out["reputation"] = summary
        if pool is not None:
            out["pool"] = pool
        return out

    async def introduce(ctx: CallContext, args: dict[str, Any]) -> Any:
        wanted = _decode(IntroduceIn.from_json, args)
        suggester = directory.config.suggester
        if suggester is None:
            raise ValueError("this directory does not support introductions")
        if wanted.uid == ctx.peer:
            raise ValueError("cannot introduce a caller to itself")
        # Only live listings: the directory vouches for what it suggests.
        if await store.listing(wanted.uid) is None:
            raise ValueError("no listing for that uid")
        try:
            await suggester.suggest(ctx.peer, wanted.uid)
        except Exception as exc:
            raise ValueError(f"suggest: {peer_error_text('introduce', exc, log)}") from None
        return IntroduceOut(suggested=True, note=INTRODUCE_NOTE).to_json()

    async def list_categories(ctx: CallContext, args: dict[str, Any]) -> Any:
        counts: dict[str, int] = {}
        for listing in await store.listings():
            for tag in listing.tags:
                counts[tag] = counts.get(tag, 0) + 1
        return CategoriesOut(tags=counts).to_json()

    async def policy_tool(ctx: CallContext, args: dict[str, Any]) -> Any:
        return PolicyOut(
            name=policy.name,
            listing_fee_atoms=policy.listing_fee_atoms,
            snapshot_price_atoms=policy.snapshot_price_atoms,
            search_price_atoms=policy.search_price_atoms,
            test_budget_max_atoms=policy.test_budget_max_atoms,
            expiry_days=policy.expiry_days,
            pub_key=directory.public_key,
        ).to_json()

    async def get_snapshot(ctx: CallContext, args: dict[str, Any]) -> Any:
        listings = [snapshot_listing(item) for item in await store.listings()]
        return directory.signer.build_snapshot(listings, int(directory.clock.now()))

    tools: list[tuple[str, str, Handler, dict[str, Any], int]] = [
        (
            "register",
            "Register or renew the calling bot as a listed provider. The result is the funding "
            "invoice: tip this directory the shortfall and verification starts (catalog crawl plus a "
            "paid call of the nominated test tool, spent from your deposit).",
            register,
            REGISTER_SCHEMA,
            0,
        ),
        (
            "my_status",
            "Report the calling bot's registration or listing state.",
            my_status,
            EMPTY_SCHEMA,
            0,
        ),
        (
            "search",
            "Search listed provider tools by text, tags, and price ceiling. Listings are live-verified "
            "at the provider's expense; prices are advisory, the live call quotes authoritatively.",
            search,
            SEARCH_SCHEMA,
            policy.search_price_atoms,
        ),
        (
            "get_provider",
            "Fetch one provider's full listing including the crawled tool catalog.",
            get_provider,
            UID_SCHEMA,
            0,
        ),
        (
            "introduce",
            "Ask the directory to introduce you to a listed provider: it sends your client a Bison "
            "Relay KX suggestion toward the provider. Your side must still accept the suggestion; "
            "accepting completes the key exchange through the directory.",
            introduce,
            UID_SCHEMA,
            0,
        ),
        ("list_categories", "Histogram listed providers by tag.", list_categories, EMPTY_SCHEMA, 0),
        (
            "policy",
            "This directory's terms: fees, budgets, expiry, and the snapshot signing key.",
            policy_tool,
            EMPTY_SCHEMA,
            0,
        ),
        (
            "get_snapshot",
            "Export the full signed index. Anyone may buy, verify, and redistribute it; peers use it "
            "to seed verify-don't-trust leads.",
            get_snapshot,
            EMPTY_SCHEMA,
            policy.snapshot_price_atoms,
        ),
    ]
    for name, description, handler, schema, price in tools:
        harness.add_tool(name, handler, description=description, input_schema=schema, price_atoms=price)
    for name in ("register", "my_status"):
        harness.set_result_meta(name, STATUS_HINT)
    register_export_tool(harness, directory)
    register_pages_tools(harness, directory, snapshot_listing)
    register_rating_tools(harness, directory)
