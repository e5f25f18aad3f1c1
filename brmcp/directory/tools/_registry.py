"""Directory listings as MCP Registry ``server.json`` documents
(docs/directory.md §Registry export).

The official MCP Registry describes a server with a ``server.json``
document (schema vendored in ``brmcp/directory/schemas/``, its source and
commit in the README there) and lists them with ``GET /v0/servers``
(``{servers: [{server, _meta}], metadata: {nextCursor, count}}``). This
module renders one listing as such a document and a page of listings as
such a list, so registry consumers and aggregators can index the tools
sold over Bison Relay.

The schema's remotes are HTTP only (``streamable-http``, ``sse``) and a
brmcp provider has no URL: it is reached by Bison Relay private messages
addressed to its uid (WIRE.md). A document therefore carries no
``remotes`` and no ``packages``; the Bison Relay side is described under
``_meta["io.modelcontextprotocol.registry/publisher-provided"]``, the one
``_meta`` key the schema defines for a publisher, in the namespaced object
:data:`BR_META_KEY`.

Every string taken from a listing is cleaned (lone surrogates, control
and bidirectional-override characters become spaces) and bounded, so a
hostile description, tag or catalog still yields a document that
validates and encodes as UTF-8.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import TYPE_CHECKING, Any

from brmcp.protocol.payment import PRICE_ATOMS_KEY, PRICING_DYNAMIC, PRICING_KEY

from ..model import ShapeError

if TYPE_CHECKING:
    from brmcp.server import CallContext, Harness

    from ..db import Listing
    from ._parts import DirectoryParts

__all__ = [
    "BR_META_KEY",
    "DEFAULT_EXPORT_LIMIT",
    "DIRECTORY_META_KEY",
    "EXPORT_SCHEMA",
    "MAX_DOC_TOOLS",
    "MAX_EXPORT_LIMIT",
    "NAME_NAMESPACE",
    "PUBLISHER_META_KEY",
    "SCHEMA_URL",
    "TRANSPORT",
    "ExportIn",
    "export_page",
    "load_schema",
    "register_export_tool",
    "server_json",
    "server_name",
    "server_response",
]

#: The ``$id`` of the vendored schema, written as each document's ``$schema``.
SCHEMA_URL = "https://static.modelcontextprotocol.io/schemas/2025-09-29/server.schema.json"
#: The ``_meta`` key the schema defines for publisher data.
PUBLISHER_META_KEY = "io.modelcontextprotocol.registry/publisher-provided"
#: Our object inside :data:`PUBLISHER_META_KEY`: the Bison Relay transport
#: (reverse-DNS of the protocol's home, github.com/karamble/brmcp).
BR_META_KEY = "io.github.karamble.brmcp/bisonrelay"
#: Our key in each list entry's registry-managed ``_meta`` (the official
#: registry's own key, ``io.modelcontextprotocol.registry/official``, is
#: left to it).
DIRECTORY_META_KEY = "io.github.karamble.brmcp/directory"
#: The ``transport`` value in :data:`BR_META_KEY`: the brmcp envelope over
#: Bison Relay private messages (WIRE.md).
TRANSPORT = "bisonrelay-pm"
#: First labels of every server name: ``io.bisonrelay.<directory>/<provider>``.
NAME_NAMESPACE = "io.bisonrelay"
#: Most tools named in one document (``toolCount`` counts all).
MAX_DOC_TOOLS = 256
#: ``export_registry``'s page size when ``limit`` is absent, and its largest.
DEFAULT_EXPORT_LIMIT = 30
MAX_EXPORT_LIMIT = 100

#: The schema's bound on ``description`` (``ServerDetail`` in the vendored file).
_MAX_DESCRIPTION = 100
#: Bounds of the strings copied into :data:`BR_META_KEY`, in characters.
_MAX_FULL_DESCRIPTION = 1024
_MAX_TOOL_NAME = 128
_MAX_TAG = 64
_MAX_CURSOR = 256
#: A provider uid used as it is in a name; anything else is hashed.
_NAME_SAFE = re.compile(r"[A-Za-z0-9._-]{1,160}")
_HEX16 = re.compile(r"[0-9a-f]{16}")
#: Bidirectional embeddings, overrides and isolates (U+202A-202E, U+2066-2069).
_BIDI = frozenset(range(0x202A, 0x202F)) | frozenset(range(0x2066, 0x206A))

#: ``export_registry``'s input schema.
EXPORT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "cursor": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_EXPORT_LIMIT},
    },
    "additionalProperties": False,
}


@functools.cache
def load_schema() -> dict[str, Any]:
    """The vendored ``server.schema.json`` (JSON Schema draft-07) as a
    dict, read once from the package data."""
    # The schema is package data of brmcp.directory (pyproject.toml), not of this room.
    schema_file = resources.files("brmcp.directory").joinpath("schemas/server.schema.json")
    text = schema_file.read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def _clean(text: str, limit: int) -> str:
    """``text`` with lone surrogates, control characters and bidi controls
    turned into spaces, whitespace runs collapsed, trimmed, and cut to
    ``limit`` characters (the last one ``…`` when cut)."""
    chars = []
    for ch in text:
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF or code in _BIDI or unicodedata.category(ch) == "Cc":
            chars.append(" ")
        else:
            chars.append(ch)
    out = " ".join("".join(chars).split())
    if len(out) > limit:
        out = out[: limit - 1].rstrip() + "…"
    return out


def _label(uid: str) -> str:
    """A name label for a uid: its first 16 hex digits, lowercased, or the
    first 16 hex digits of its SHA-256 when it does not start with 16."""
    head = uid[:16].lower()
    if _HEX16.fullmatch(head):
        return head
    return hashlib.sha256(uid.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def server_name(directory_uid: str, provider_uid: str) -> str:
    """The document's ``name``: ``io.bisonrelay.<label>/<provider>``, where
    ``<label>`` is the first 16 hex digits of the directory's uid and
    ``<provider>`` the provider's uid (a Bison Relay uid is 64 hex digits);
    a uid outside ``[A-Za-z0-9._-]{1,160}`` is replaced by ``x-`` and 40
    hex digits of its SHA-256. Matches the schema's name pattern
    ``^[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+$`` and its 200-character bound. Stable
    for a provider across recrawls and description changes."""
    if _NAME_SAFE.fullmatch(provider_uid):
        slug = provider_uid
    else:
        slug = "x-" + hashlib.sha256(provider_uid.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    # At most 14 + 16 + 1 + 160 characters: within the schema's 200.
    return f"{NAME_NAMESPACE}.{_label(directory_uid)}/{slug}"


def _tools(catalog: str) -> list[Any]:
    try:
        tools = json.loads(catalog) if catalog else None
    except (ValueError, RecursionError):
        return []
    return tools if isinstance(tools, list) else []


def _version(catalog: str) -> str:
    """``0.0.0+catalog.<16 hex>``: the SHA-256 of the catalog as canonical
    JSON (keys sorted), so an unchanged catalog keeps its version across
    recrawls and a changed one gets a new version."""
    try:
        canonical = json.dumps(json.loads(catalog), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):
        canonical = catalog
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    return f"0.0.0+catalog.{digest[:16]}"


def _price(meta: Any) -> dict[str, Any]:
    """A tool's advertised price as ``{priceAtoms}`` or ``{pricing:
    "dynamic"}`` (the reading of docs/directory.md §Tools: a number under
    ``brmcp/priceAtoms`` truncated to whole atoms, else
    ``brmcp/pricing``), ``{priceAtoms: 0}`` for a free tool, ``{}`` for a
    price that is no whole number (NaN, an infinity)."""
    if isinstance(meta, Mapping):
        value = meta.get(PRICE_ATOMS_KEY)
        if isinstance(value, int | float) and not isinstance(value, bool):
            # NaN and infinities (Python's JSON reads them) claim no price.
            return {"priceAtoms": int(value)} if value == value and abs(value) < 2**63 else {}
        if meta.get(PRICING_KEY) == PRICING_DYNAMIC:
            return {"pricing": PRICING_DYNAMIC}
    return {"priceAtoms": 0}


#: 9999-12-31T23:59:59Z, the last instant RFC 3339 can write.
_MAX_TIME = 253_402_300_799


def _rfc3339(seconds: int) -> str:
    return datetime.fromtimestamp(min(max(0, seconds), _MAX_TIME), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def server_json(listing: Listing, directory_uid: str, *, directory_name: str = "") -> dict[str, Any]:
    """One listing as a ``server.json`` document valid against the vendored
    schema (:func:`load_schema`):

    - ``$schema``: :data:`SCHEMA_URL`; ``name``: :func:`server_name`;
    - ``description``: the provider's description cleaned and cut to the
      schema's 100 characters (``Bison Relay MCP provider <uid>`` when
      nothing is left); ``version``: ``0.0.0+catalog.<16 hex>`` of the
      crawled catalog;
    - ``_meta[PUBLISHER_META_KEY][BR_META_KEY]``: ``{transport:
      "bisonrelay-pm", providerUid, directoryUid, directoryName?,
      description, tags, catalogCheckedAt, lastVerifiedExecution,
      verifiedTool?, approvedAt, renewedAt, expiresAt, toolCount, tools:
      [{name, priceAtoms | pricing}]}``, times in unix seconds, prices in
      atoms and advisory (the provider quotes at call time), at most
      :data:`MAX_DOC_TOOLS` tools (``toolsTruncated: true`` when more).

    No ``remotes``, ``packages`` or URLs: a provider is reached by its uid
    over Bison Relay. Raises nothing for any listing content."""
    description = _clean(listing.description, _MAX_DESCRIPTION)
    if not description:
        description = f"Bison Relay MCP provider {_label(listing.uid)}"
    tools: list[dict[str, Any]] = []
    count = 0
    for tool in _tools(listing.catalog):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
            continue
        name = _clean(tool["name"], _MAX_TOOL_NAME)
        if not name:
            continue
        count += 1
        if len(tools) < MAX_DOC_TOOLS:
            tools.append({"name": name, **_price(tool.get("_meta"))})
    br: dict[str, Any] = {
        "transport": TRANSPORT,
        "providerUid": _clean(listing.uid, _MAX_CURSOR),
        "directoryUid": _clean(directory_uid, _MAX_CURSOR),
    }
    if directory_name:
        br["directoryName"] = _clean(directory_name, _MAX_DESCRIPTION)
    br["description"] = _clean(listing.description, _MAX_FULL_DESCRIPTION)
    br["tags"] = [tag for tag in (_clean(t, _MAX_TAG) for t in listing.tags) if tag]
    br["catalogCheckedAt"] = listing.catalog_checked_at
    br["lastVerifiedExecution"] = listing.last_verified_execution
    verified = _clean(listing.test.tool, _MAX_TOOL_NAME)
    if verified:
        br["verifiedTool"] = verified
    br["approvedAt"] = listing.approved_at
    br["renewedAt"] = listing.renewed_at
    br["expiresAt"] = listing.expires_at
    br["toolCount"] = count
    br["tools"] = tools
    if count > len(tools):
        br["toolsTruncated"] = True
    return {
        "$schema": SCHEMA_URL,
        "name": server_name(directory_uid, listing.uid),
        "description": description,
        "version": _version(listing.catalog),
        "_meta": {PUBLISHER_META_KEY: {BR_META_KEY: br}},
    }


def server_response(listing: Listing, directory_uid: str, *, directory_name: str = "") -> dict[str, Any]:
    """One entry of the registry's list answer (its ``ServerResponse``):
    ``{server: server_json(...), _meta: {DIRECTORY_META_KEY: {status:
    "active", publishedAt, updatedAt, isLatest: true}}}``, times RFC 3339
    UTC: ``publishedAt`` the approval, ``updatedAt`` the latest of
    approval, renewal and catalog check."""
    updated = max(listing.approved_at, listing.renewed_at, listing.catalog_checked_at)
    return {
        "server": server_json(listing, directory_uid, directory_name=directory_name),
        "_meta": {
            DIRECTORY_META_KEY: {
                "status": "active",
                "publishedAt": _rfc3339(listing.approved_at),
                "updatedAt": _rfc3339(updated),
                "isLatest": True,
            }
        },
    }


@dataclass(frozen=True, slots=True)
class ExportIn:
    """``export_registry``'s input: ``cursor`` (the ``nextCursor`` of the
    previous page, ``""`` for the first) and ``limit`` (1 to
    :data:`MAX_EXPORT_LIMIT`, default :data:`DEFAULT_EXPORT_LIMIT`)."""

    cursor: str = ""
    limit: int = DEFAULT_EXPORT_LIMIT

    @classmethod
    def from_json(cls, value: Any) -> ExportIn:
        """Decode the tool's arguments; ``null`` leaves a default. Raises
        :class:`ShapeError` naming the field, the value and what is allowed."""
        if not isinstance(value, Mapping):
            raise ShapeError(f"export_registry: arguments: got {type(value).__name__}, want an object")
        cursor = value.get("cursor")
        if cursor is None:
            cursor = ""
        if not isinstance(cursor, str) or len(cursor) > _MAX_CURSOR:
            shown = f"{len(cursor)} characters" if isinstance(cursor, str) else type(cursor).__name__
            raise ShapeError(
                f"export_registry: cursor: got {shown}, "
                f"want a nextCursor string of at most {_MAX_CURSOR} characters"
            )
        limit = value.get("limit")
        if limit is None:
            limit = DEFAULT_EXPORT_LIMIT
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_EXPORT_LIMIT:
            raise ShapeError(
                f"export_registry: limit: got {str(limit)[:40]!r}, "
                f"want an integer from 1 to {MAX_EXPORT_LIMIT}"
            )
        return cls(cursor=cursor, limit=limit)


def export_page(
    listings: Sequence[Listing],
    directory_uid: str,
    query: ExportIn | None = None,
    *,
    directory_name: str = "",
) -> dict[str, Any]:
    """A page in the shape of the registry's ``GET /v0/servers`` answer:
    ``{servers: [server_response(...)], metadata: {nextCursor?, count}}``.
    Listings go in uid order; the page holds the first ``query.limit``
    whose uid sorts after ``query.cursor``; ``nextCursor`` (the last uid on
    the page) is present only when more follow. A listing published or
    removed between pages neither repeats nor shifts the others."""
    query = query or ExportIn()
    after = query.cursor
    ordered = sorted((item for item in listings if not after or item.uid > after), key=lambda item: item.uid)
    page = ordered[: query.limit]
    metadata: dict[str, Any] = {}
    if len(ordered) > len(page):
        metadata["nextCursor"] = page[-1].uid
    metadata["count"] = len(page)
    return {
        "servers": [server_response(item, directory_uid, directory_name=directory_name) for item in page],
        "metadata": metadata,
    }


def register_export_tool(harness: Harness, directory: DirectoryParts) -> None:
    """Add the free ``export_registry`` tool (``{cursor, limit}`` →
    :func:`export_page` over the live listings) to ``harness``. Before the
    directory knows its own uid the tool answers the error ``the
    directory's uid is not known yet``."""
    store = directory.store

    async def export_registry(ctx: CallContext, args: dict[str, Any]) -> Any:
        try:
            query = ExportIn.from_json(args)
        except ShapeError as exc:
            raise ValueError(str(exc)) from None
        directory_uid = directory.self_uid()
        if not directory_uid:
            raise ValueError("the directory's uid is not known yet")
        return export_page(await store.listings(), directory_uid, query, directory_name=directory.policy.name)

    harness.add_tool(
        "export_registry",
        export_registry,
        description=(
            "Export the live listings as MCP Registry server.json documents, in the shape of the "
            "registry's GET /v0/servers answer ({servers, metadata: {nextCursor, count}}). Providers "
            "are reached over Bison Relay: the transport, uids, verification times and tool prices "
            "are under each document's _meta."
        ),
        input_schema=EXPORT_SCHEMA,
        price_atoms=0,
    )
