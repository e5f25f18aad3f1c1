"""How a bot link tells and speaks a bot's era (WIRE.md §Eras; BRIDGE.md
§Eras and snapshots): the first-contact ``initialize`` and what its answer
offers, the discover result a modern session adopts instead of asking, and
the signs that a bot needs the handshake era (its capabilities push
notifications, or its error names the handshake). An offered tool list is
held to the same bounds as a ``tools/list`` (SECURITY.md "The bridge
against a hostile bot").
"""

from __future__ import annotations

from typing import cast

from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    UNSUPPORTED_PROTOCOL_VERSION,
    DiscoverResult,
    Implementation,
    InitializeRequest,
    InitializeRequestParams,
    InitializeResult,
    ListToolsResult,
    RequestParamsMeta,
    ServerCapabilities,
    Tool,
    ToolsCapability,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, LATEST_MODERN_VERSION

from brmcp.protocol.eras import LIST_TOOLS_KEY, MODERN_VERSIONS_KEY, TOOLS_KEY

from ._linkbase import TRANSPORT_ERROR_CODES, ToolListBudget
from ._snapshots import ListedTools

#: What a bot whose capabilities are unknown is assumed to serve.
TOOLS_ONLY = ServerCapabilities(tools=ToolsCapability(list_changed=False))


async def era_offer(session: ClientSession, client_info: Implementation) -> InitializeResult:
    """Send the first-contact ``initialize``: what ``session.initialize()``
    sends, plus ``params._meta["brmcp/listTools"] = true`` (WIRE.md §Eras).
    Raises RuntimeError for an answer in a version this client lacks."""
    params = InitializeRequestParams(
        protocol_version=LATEST_HANDSHAKE_VERSION,
        capabilities=session._build_capabilities(LATEST_HANDSHAKE_VERSION),
        client_info=client_info,
        _meta=cast(RequestParamsMeta, {LIST_TOOLS_KEY: True}),
    )
    result = await session.send_request(InitializeRequest(params=params), InitializeResult)
    if result.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        raise RuntimeError(f"Unsupported protocol version from the server: {result.protocol_version}")
    return result


def offered_tools(result: InitializeResult) -> ListedTools | None:
    """The tools a first-contact answer brought, when it also names a
    modern version this client speaks; None otherwise (a plain answer).
    The ``brmcp/tools`` object is one tools/list page: counted against the
    tool-list bounds (:class:`ToolListBudget`), and its ``_meta`` tells
    ``marks_refusals``. Raises :class:`ToolListTooLarge` for an offer over a
    bound (the first contact fails; nothing is remembered)."""
    meta = result.meta
    if not isinstance(meta, dict):
        return None
    versions = meta.get(MODERN_VERSIONS_KEY)
    if not isinstance(versions, list) or LATEST_MODERN_VERSION not in versions:
        return None
    try:
        page = ListToolsResult.model_validate(meta.get(TOOLS_KEY))
    except ValueError:
        return None
    budget = ToolListBudget(f"first-contact {TOOLS_KEY}")
    budget.page(page)
    if not all(_servable(tool) for tool in page.tools):
        # Not served (nor remembered) as offered: the handshake's own
        # tools/list decides, as with a bot that made no offer.
        return None
    return budget.result()


def _servable(tool: Tool) -> bool:
    """An input (and output) schema an agent can be given: a JSON Schema
    object of type ``object`` whose ``properties``, if any, is an object
    (MCP's Tool.inputSchema and outputSchema)."""
    schemas = [tool.input_schema] if tool.output_schema is None else [tool.input_schema, tool.output_schema]
    return all(
        isinstance(schema, dict)
        and schema.get("type") == "object"
        and isinstance(schema.get("properties", {}), dict)
        for schema in schemas
    )


def pushes_unasked(capabilities: ServerCapabilities) -> bool:
    """True when a bot serves resources or prompts, or declares that its
    tool list changes: it may send notifications unasked (resource updates,
    list changes), which only a handshake-era session carries over BR. (A
    modern ``server/discover`` reports its subscribe and listChanged flags
    for ``subscriptions/listen`` only, so they cannot tell.)"""
    tools = capabilities.tools
    return (
        capabilities.resources is not None
        or capabilities.prompts is not None
        or (tools is not None and bool(tools.list_changed))
    )


def modern_discover(capabilities: ServerCapabilities | None) -> DiscoverResult:
    """What a modern session adopts instead of asking ``server/discover``."""
    return DiscoverResult(
        supported_versions=[LATEST_MODERN_VERSION],
        capabilities=capabilities or TOOLS_ONLY,
        result_type="complete",
        ttl_ms=0,
        cache_scope="public",
    )


#: Words in a bot's error that mean "this request needs the handshake era".
_HANDSHAKE_HINTS = ("initializ", "handshake", "back-channel")


def handshake_only(exc: BaseException, *, probe: bool) -> bool:
    """See :meth:`BotLink.era_refused`. The MCP SDK's "Unsupported protocol
    version" (-32022) counts too: a bot that no longer serves the modern
    version (replaced by an older one, or one that offered it wrongly)."""
    if not isinstance(exc, MCPError) or exc.error.code in TRANSPORT_ERROR_CODES:
        return False
    if exc.error.code == UNSUPPORTED_PROTOCOL_VERSION:
        return True
    message = exc.error.message.lower()
    if "unsupported protocol version" in message:
        return True
    if any(hint in message for hint in _HANDSHAKE_HINTS):
        return True
    return probe and exc.error.code in (INVALID_REQUEST, INVALID_PARAMS, 0)
