"""The directory's records (docs/directory.md): the tables in the
harness's database (SQLite or PostgreSQL) behind :class:`DirectoryStore`:
registrations, listings, spends, peers and leads, the search index, the
snapshot pages' removal tombstones, ratings, reputation and bot pools, and
the admin log file. Imports only :mod:`brmcp.directory.model` and the
layers below the directory (``brmcp.server``, ``brmcp.protocol``); never the
payer, tools or service rooms."""

from __future__ import annotations

from ._adminlog import (
    ADMIN_LOG_FILENAME,
    AdminLog,
)
from ._index import (
    Fts5Unavailable,
    create_index,
    ensure_index,
    index_listing,
    rebuild_index,
    require_fts5,
    tool_price,
    unindex_listing,
)
from ._pagetables import (
    CHANGES_MAX_BYTES,
    CHANGES_OVERLAP_SECONDS,
    NOT_ENTITLED,
    PAGE_TOOLS,
    TOMBSTONE_DAYS,
    TOO_OLD,
    SnapshotPages,
    changes_since,
    record_removal,
    tombstone_horizon,
)
from ._pagetables import (
    open_tables as open_page_tables,
)
from ._poolinfo import (
    pool_from_meta,
    set_listed_pool,
    set_run_pool,
    shown_pool,
)
from ._ratings import (
    MAX_COMMENT,
    MAX_FUTURE_SECONDS,
    MAX_PER_DAY,
    RATE_SCHEMA,
    RATING_TOOLS,
    RATINGS_SCHEMA,
    RateIn,
    RatingsIn,
    clean_comment,
    rate,
    ratings_page,
)
from ._reputation import (
    compact as reputation_compact,
)
from ._reputation import (
    listed_key as listed_receipt_key,
)
from ._reputation import (
    summary as reputation_summary,
)
from ._rows import (
    SCHEMA as LISTING_SCHEMA,
)
from ._rows import (
    all_listings,
    put_listing,
    put_registration,
)
from ._search import (
    EXTENSION_PROPERTIES,
    RANK_CATALOG,
    RANK_RELEVANCE,
    SearchIndex,
    SearchPage,
    SearchRequest,
    fts_query,
    search,
)
from ._sql import (
    adapt,
    is_postgres,
    to_postgres,
)
from ._store import (
    KIND_FEE,
    KIND_REFUND,
    KIND_TEST,
    LEAD_CONVERTED,
    LEAD_INVITED,
    LEAD_NEW,
    LEAD_PURSUING,
    DirectoryStore,
    Lead,
    Listing,
    Peer,
    Registration,
)

__all__ = [
    "ADMIN_LOG_FILENAME",
    "CHANGES_MAX_BYTES",
    "CHANGES_OVERLAP_SECONDS",
    "EXTENSION_PROPERTIES",
    "KIND_FEE",
    "KIND_REFUND",
    "KIND_TEST",
    "LEAD_CONVERTED",
    "LEAD_INVITED",
    "LEAD_NEW",
    "LEAD_PURSUING",
    "LISTING_SCHEMA",
    "MAX_COMMENT",
    "MAX_FUTURE_SECONDS",
    "MAX_PER_DAY",
    "NOT_ENTITLED",
    "PAGE_TOOLS",
    "RANK_CATALOG",
    "RANK_RELEVANCE",
    "RATE_SCHEMA",
    "RATINGS_SCHEMA",
    "RATING_TOOLS",
    "TOMBSTONE_DAYS",
    "TOO_OLD",
    "AdminLog",
    "DirectoryStore",
    "Fts5Unavailable",
    "Lead",
    "Listing",
    "Peer",
    "RateIn",
    "RatingsIn",
    "Registration",
    "SearchIndex",
    "SearchPage",
    "SearchRequest",
    "SnapshotPages",
    "adapt",
    "all_listings",
    "changes_since",
    "clean_comment",
    "create_index",
    "ensure_index",
    "fts_query",
    "index_listing",
    "is_postgres",
    "listed_receipt_key",
    "open_page_tables",
    "pool_from_meta",
    "put_listing",
    "put_registration",
    "rate",
    "ratings_page",
    "rebuild_index",
    "record_removal",
    "reputation_compact",
    "reputation_summary",
    "require_fts5",
    "search",
    "set_listed_pool",
    "set_run_pool",
    "shown_pool",
    "to_postgres",
    "tombstone_horizon",
    "tool_price",
    "unindex_listing",
]
