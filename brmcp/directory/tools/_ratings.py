"""The public ``rate`` and ``ratings`` tools (docs/directory.md
§Reputation); the rules and the table are in :mod:`brmcp.directory.db._ratings`.
"""

from __future__ import annotations

from typing import Any

from brmcp.server import CallContext, Harness

from ..db import (
    RATE_SCHEMA,
    RATING_TOOLS,
    RATINGS_SCHEMA,
    RateIn,
    RatingsIn,
    rate,
    ratings_page,
)
from ..model import ShapeError
from ._parts import DirectoryParts

__all__ = ["RATING_TOOLS", "register_rating_tools"]


def register_rating_tools(harness: Harness, directory: DirectoryParts) -> None:
    """Add ``rate`` and ``ratings`` (free, public) to ``harness``."""
    store = directory.store

    async def rate_tool(ctx: CallContext, args: dict[str, Any]) -> Any:
        try:
            request = RateIn.from_json(args)
        except ShapeError as exc:
            raise ValueError(str(exc)) from None
        now = int(directory.clock.now())
        rating = await store.run(lambda conn: rate(conn, ctx.peer, request, now))
        return {"rating": rating.to_json()}

    async def ratings_tool(ctx: CallContext, args: dict[str, Any]) -> Any:
        try:
            request = RatingsIn.from_json(args)
        except ShapeError as exc:
            raise ValueError(str(exc)) from None
        return await store.run(lambda conn: ratings_page(conn, request))

    harness.add_tool(
        "rate",
        rate_tool,
        description="Rate a listed provider 1-5 stars with an optional comment (at most 280 "
        "characters). Send the signed receipt (brmcp/signedReceipt in the result's _meta) of a call "
        "you made to it: one rating per receipt, checked against the provider's listed receipt key.",
        input_schema=RATE_SCHEMA,
        price_atoms=0,
    )
    harness.add_tool(
        "ratings",
        ratings_tool,
        description="A provider's ratings, newest first, each with its signed receipt so anyone can "
        "check it; limit 1-50 (default 20), cursor from nextCursor.",
        input_schema=RATINGS_SCHEMA,
        price_atoms=0,
    )
