"""A find request's body, read and checked the same way on the admin API
(``/admin/find``, ``/admin/rate``) and on the agents' ``/mcp/discover``."""

from __future__ import annotations

import json
from typing import Any

from brmcp.bridge.base import MAX_ADMIN_BODY_BYTES, read_body, send_json

from ._answers import MAX_QUERY_CHARS, MAX_TAG_CHARS, MAX_TAGS
from ._discovery import DiscoveryError

__all__ = ["find_args", "read_json_object"]


def find_args(body: dict[str, Any]) -> tuple[str, tuple[str, ...], int]:
    """``(query, tags, maxPriceAtoms)`` of a find request's JSON ``body``;
    raises :class:`DiscoveryError` (400) naming the key that is wrong."""
    allowed = {"query", "tags", "maxPriceAtoms"}
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise DiscoveryError(400, f"find: unknown key {unknown[0]!r}; keys: {', '.join(sorted(allowed))}")
    query = body.get("query", "")
    if not isinstance(query, str) or len(query) > MAX_QUERY_CHARS:
        raise DiscoveryError(400, f"find: query must be a string of at most {MAX_QUERY_CHARS} characters")
    tags = body.get("tags") or []
    if (
        not isinstance(tags, list)
        or len(tags) > MAX_TAGS
        or not all(isinstance(t, str) and 1 <= len(t) <= MAX_TAG_CHARS for t in tags)
    ):
        raise DiscoveryError(
            400, f"find: tags must be at most {MAX_TAGS} strings of 1 to {MAX_TAG_CHARS} characters"
        )
    price = body.get("maxPriceAtoms", 0)
    if price is None:
        price = 0
    if isinstance(price, bool) or not isinstance(price, int) or not 0 <= price < 1 << 63:
        raise DiscoveryError(400, f"find: maxPriceAtoms {json.dumps(price)[:40]} must be an integer >= 0")
    return query, tuple(tags), price


async def read_json_object(receive: Any, send: Any) -> dict[str, Any] | None:
    """The request's JSON object (at most :data:`MAX_ADMIN_BODY_BYTES`), or
    None after answering 413 (or when the client went away). Raises
    :class:`DiscoveryError` (400) for a body that is not a JSON object."""
    body, extra = await read_body(receive, MAX_ADMIN_BODY_BYTES)
    if body is None:
        if not extra:
            await send_json(send, 413, {"error": "request body too large"})
        return None
    try:
        value = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise DiscoveryError(400, "body is not JSON") from None
    if not isinstance(value, dict):
        raise DiscoveryError(400, "body must be a JSON object")
    return value
