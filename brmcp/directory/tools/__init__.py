"""The directory's MCP tools (docs/directory.md): the public tools, the
snapshot pages' and ratings' tools, the registry export and the admin
tools. They type against :class:`DirectoryParts`, so they import the
model, db and payer rooms but never the service that registers them."""

from __future__ import annotations

from ._admin import (
    ADMIN_TOOLS,
    register_admin_tools,
)
from ._public import (
    EXTENSION_KEYS,
    EXTENSION_TOOLS,
    PUBLIC_TOOLS,
    register_public_tools,
    search_listings,
    snapshot_listing,
    tool_price,
)
from ._registry import (
    BR_META_KEY,
    DIRECTORY_META_KEY,
    MAX_DOC_TOOLS,
    MAX_EXPORT_LIMIT,
    PUBLISHER_META_KEY,
    SCHEMA_URL,
    ExportIn,
    export_page,
    load_schema,
    server_json,
    server_name,
)

__all__ = [
    "ADMIN_TOOLS",
    "BR_META_KEY",
    "DIRECTORY_META_KEY",
    "EXTENSION_KEYS",
    "EXTENSION_TOOLS",
    "MAX_DOC_TOOLS",
    "MAX_EXPORT_LIMIT",
    "PUBLIC_TOOLS",
    "PUBLISHER_META_KEY",
    "SCHEMA_URL",
    "ExportIn",
    "export_page",
    "load_schema",
    "register_admin_tools",
    "register_public_tools",
    "search_listings",
    "server_json",
    "server_name",
    "snapshot_listing",
    "tool_price",
]
