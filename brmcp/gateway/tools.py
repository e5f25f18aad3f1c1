"""Upstream tools as harness tools: the upstream's ``Tool`` advertised
verbatim (name, title, description, schemas, annotations, icons, its own
``_meta``) plus the price in ``_meta`` exactly as for a native tool
(``brmcp/priceAtoms``, WIRE.md §Payments).

The harness validates arguments against the upstream's input schema before
any rate limit, price or debit, and a structured result against its output
schema (a result that violates it is refunded). A schema the validator
cannot compile is still advertised as the upstream wrote it; calls are then
checked only for being an object, and the upstream judges the rest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mcp.types import Tool

from brmcp.server.catalog import Handler, ToolSpec

from .prices import PriceTable

__all__ = ["UpstreamToolSpec", "strip_reserved", "tool_specs"]

log = logging.getLogger("brmcp.gateway")

#: ``_meta`` keys the MCP SDK manages per connection (WIRE.md §Eras; the MCP Python
#: SDK 2.x, ``mcp/server/runner.py``; BRIDGE.md §Resources, prompts and completions).
_SDK_PREFIX = "io.modelcontextprotocol/"
#: Our own namespace: an upstream cannot set prices or keys in it.
_OWN_PREFIX = "brmcp/"


def strip_reserved(meta: dict[str, Any] | None, *, own: bool = False) -> dict[str, Any] | None:
    """``meta`` without the SDK's ``io.modelcontextprotocol/*`` keys and the
    progress token (and, with ``own``, our ``brmcp/*`` keys); None when
    nothing is left."""
    if not meta:
        return None
    out = {
        key: value
        for key, value in meta.items()
        if not key.startswith(_SDK_PREFIX)
        and key not in ("progress_token", "progressToken")
        and not (own and key.startswith(_OWN_PREFIX))
    }
    return out or None


@dataclass(eq=False)
class UpstreamToolSpec(ToolSpec):
    """A harness tool backed by an upstream tool; ``source`` is the tool as
    the upstream listed it."""

    source: Tool | None = None

    def to_tool(self) -> Tool:
        if self.source is None:
            return super().to_tool()
        return self.source.model_copy(update={"meta": self.meta})


def _spec(tool: Tool, price: int, handler: Handler) -> UpstreamToolSpec:
    meta = {k: v for k, v in (tool.meta or {}).items() if not k.startswith(_OWN_PREFIX)}
    schema = dict(tool.input_schema)
    try:
        return UpstreamToolSpec(
            name=tool.name,
            handler=handler,
            description=tool.description,
            input_schema=schema,
            output_schema=tool.output_schema,
            price_atoms=price,
            annotations=tool.annotations,
            title=tool.title,
            meta=meta,
            source=tool,
        )
    except ValueError as exc:
        log.warning(
            "upstream tool %s: its schemas cannot be checked here (%s); only the upstream checks arguments",
            tool.name,
            exc,
        )
    return UpstreamToolSpec(
        name=tool.name,
        handler=handler,
        description=tool.description,
        input_schema={"type": "object"},
        price_atoms=price,
        annotations=tool.annotations,
        title=tool.title,
        meta=meta,
        source=tool,
    )


def tool_specs(
    tools: list[Tool], prices: PriceTable, handler_for: Any
) -> tuple[list[UpstreamToolSpec], list[str]]:
    """The specs to register for the upstream's ``tools`` under ``prices``
    (hidden ones left out), and the names ``prices`` lists that the
    upstream does not have. ``handler_for(name)`` returns the forwarding
    handler of one tool."""
    specs: list[UpstreamToolSpec] = []
    seen: set[str] = set()
    for tool in tools:
        if tool.name in seen:
            log.warning("upstream lists tool %s twice; serving the first", tool.name)
            continue
        seen.add(tool.name)
        price = prices.price(tool.name)
        if price is None:
            continue
        specs.append(_spec(tool, price, handler_for(tool.name)))
    unknown = sorted(name for name in prices.tools if name not in seen)
    return specs, unknown
