"""Mirroring a bot's resources, prompts and completions (BRIDGE.md
§Resources, prompts and completions).

Tools are answered from a snapshot and paid for (:mod:`.proxy`); these are
free and change often, so every request is forwarded live over the link's
shared BR session, with no payment loop:

* ``resources/list``, ``resources/templates/list``, ``resources/read``,
  ``prompts/list``, ``prompts/get`` and ``completion/complete`` go to the
  bot as they came, cursors included, minus the SDK-managed
  ``io.modelcontextprotocol/*`` keys and the agent's progress token in
  ``_meta`` (BRIDGE.md §Resources, prompts and completions); results come back unchanged except
  for the same keys in their ``_meta``; the bot's JSON-RPC errors reach the
  agent unchanged;
* ``resources/subscribe`` / ``resources/unsubscribe`` are shared between
  the agents (:mod:`.subscriptions`): the bot is subscribed once per URI.

:class:`MirrorServer` serves a method, and declares its capability, only
while the bot declared it (``resources``, with ``subscribe`` for the
subscription methods; ``prompts``; ``completions``), copying the bot's
``subscribe`` and ``listChanged`` flags. A bot that declares none of them
(a Go bot, a harness with only tools) yields exactly the previous
endpoint: ``{"logging": {}, "tools": {"listChanged": false}}`` and -32601
"Method not found" for these methods.

Bytes (SECURITY.md "The bridge against a hostile bot"): a forwarded result
is one message from the bot, so the transport's bound on one message
(16 MiB, ``AssemblerConfig.max_message_bytes``) bounds it, and the bridge
holds it only until it is written to the agent. The bridge follows no
cursor itself (the agent pages, one request per page) and keeps nothing of
a result, so nothing accumulates across pages or requests: no further
bound is needed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import pydantic
from mcp.server import Server, ServerRequestContext
from mcp.server.lowlevel.server import HandlerEntry, NotificationOptions
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INTERNAL_ERROR,
    CallToolRequestParams,
    CallToolResult,
    ClientRequest,
    CompleteRequest,
    CompleteRequestParams,
    CompleteResult,
    CompletionsCapability,
    EmptyResult,
    GetPromptRequest,
    GetPromptRequestParams,
    GetPromptResult,
    InputResponseRequestParams,
    ListPromptsRequest,
    ListPromptsResult,
    ListResourcesRequest,
    ListResourcesResult,
    ListResourceTemplatesRequest,
    ListResourceTemplatesResult,
    ListToolsResult,
    PaginatedRequestParams,
    PromptsCapability,
    ReadResourceRequest,
    ReadResourceRequestParams,
    ReadResourceResult,
    RequestParams,
    RequestParamsMeta,
    ResourcesCapability,
    ServerCapabilities,
    SubscribeRequest,
    SubscribeRequestParams,
    ToolsCapability,
    UnsubscribeRequest,
    UnsubscribeRequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from brmcp.bridge.links import TRANSPORT_ERROR_CODES, BotLink, LinkError, strip_reserved_meta

__all__ = ["MIRRORED_METHODS", "Mirror", "MirrorServer", "bot_serves"]

log = logging.getLogger("brmcp.bridge")

_ResultT = TypeVar("_ResultT", bound=BaseModel)
_ParamsT = TypeVar("_ParamsT", bound=RequestParams)

_RESOURCE_METHODS = frozenset({"resources/list", "resources/templates/list", "resources/read"})
_SUBSCRIBE_METHODS = frozenset({"resources/subscribe", "resources/unsubscribe"})
_PROMPT_METHODS = frozenset({"prompts/list", "prompts/get"})
#: Methods a modern-era session cannot carry (2026-07-28 removed them).
_HANDSHAKE_ONLY_METHODS = _SUBSCRIBE_METHODS
#: The methods a bridge endpoint serves only when its bot declared them.
MIRRORED_METHODS = _RESOURCE_METHODS | _SUBSCRIBE_METHODS | _PROMPT_METHODS | {"completion/complete"}


def bot_serves(capabilities: ServerCapabilities | None, method: str) -> bool:
    """True when a bot that declared ``capabilities`` serves ``method`` (one
    of :data:`MIRRORED_METHODS`); False for anything else."""
    if capabilities is None:
        return False
    if method in _RESOURCE_METHODS:
        return capabilities.resources is not None
    if method in _SUBSCRIBE_METHODS:
        return capabilities.resources is not None and bool(capabilities.resources.subscribe)
    if method in _PROMPT_METHODS:
        return capabilities.prompts is not None
    if method == "completion/complete":
        return capabilities.completions is not None
    return False


class MirrorServer(Server[Any]):
    """The low-level SDK server of one bot endpoint: dispatch and declared
    capabilities of :data:`MIRRORED_METHODS` follow ``link.capabilities``
    (read at each request and each ``initialize``)."""

    def __init__(
        self,
        name: str,
        link: BotLink,
        *,
        version: str,
        on_list_tools: Callable[
            [ServerRequestContext[Any], PaginatedRequestParams | None], Awaitable[ListToolsResult]
        ],
        on_call_tool: Callable[[ServerRequestContext[Any], CallToolRequestParams], Awaitable[CallToolResult]],
    ) -> None:
        super().__init__(name, version=version, on_list_tools=on_list_tools, on_call_tool=on_call_tool)
        self._link = link

    def get_request_handler(self, method: str) -> HandlerEntry[Any] | None:
        if method in MIRRORED_METHODS and not bot_serves(self._link.capabilities, method):
            return None  # the SDK answers -32601 "Method not found", as without a handler
        return super().get_request_handler(method)

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> ServerCapabilities:
        own = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        bot = self._link.capabilities
        resources = prompts = completions = None
        if bot is not None:
            modern = protocol_version in MODERN_PROTOCOL_VERSIONS
            if bot.resources is not None:
                # 2026-07-28 delivers changes on subscriptions/listen, which
                # the bridge does not serve: the SDK's own (false) flags apply.
                resources = (
                    own.resources
                    if modern
                    else ResourcesCapability(
                        subscribe=bot.resources.subscribe, list_changed=bot.resources.list_changed
                    )
                )
            if bot.prompts is not None:
                prompts = own.prompts if modern else PromptsCapability(list_changed=bot.prompts.list_changed)
            if bot.completions is not None:
                completions = CompletionsCapability()
        # The bridge relays the bot's notifications/tools/list_changed.
        tools = ToolsCapability(list_changed=True)
        return own.model_copy(
            update={"resources": resources, "prompts": prompts, "completions": completions, "tools": tools}
        )


class Mirror:
    """The forwarding handlers of one endpoint (see the module docstring)."""

    def __init__(self, link: BotLink) -> None:
        self.link = link

    def register(self, server: Server[Any]) -> None:
        """Add the handlers of :data:`MIRRORED_METHODS` to ``server`` (a
        :class:`MirrorServer` hides them while the bot does not declare them)."""
        server.add_request_handler("resources/list", PaginatedRequestParams, self._list_resources)
        server.add_request_handler("resources/templates/list", PaginatedRequestParams, self._list_templates)
        server.add_request_handler("resources/read", ReadResourceRequestParams, self._read)
        server.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
        server.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe)
        server.add_request_handler("prompts/list", PaginatedRequestParams, self._list_prompts)
        server.add_request_handler("prompts/get", GetPromptRequestParams, self._get_prompt)
        server.add_request_handler("completion/complete", CompleteRequestParams, self._complete)

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams
    ) -> ListResourcesResult:
        self.link.subscriptions.watch(ctx)
        return await self.forward(ListResourcesRequest(params=_paginated(params)), ListResourcesResult)

    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams
    ) -> ListResourceTemplatesResult:
        self.link.subscriptions.watch(ctx)
        request = ListResourceTemplatesRequest(params=_paginated(params))
        return await self.forward(request, ListResourceTemplatesResult)

    async def _read(
        self, ctx: ServerRequestContext[Any], params: ReadResourceRequestParams
    ) -> ReadResourceResult:
        self.link.subscriptions.watch(ctx)
        return await self.forward(ReadResourceRequest(params=_clean_params(params)), ReadResourceResult)

    async def _subscribe(self, ctx: ServerRequestContext[Any], params: SubscribeRequestParams) -> EmptyResult:
        request = SubscribeRequest(params=_clean_params(params))
        await self.link.subscriptions.subscribe(ctx, params.uri, lambda: self.forward(request, EmptyResult))
        return EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        request = UnsubscribeRequest(params=_clean_params(params))
        await self.link.subscriptions.unsubscribe(ctx, params.uri, lambda: self.forward(request, EmptyResult))
        return EmptyResult()

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams
    ) -> ListPromptsResult:
        self.link.subscriptions.watch(ctx)
        return await self.forward(ListPromptsRequest(params=_paginated(params)), ListPromptsResult)

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: GetPromptRequestParams
    ) -> GetPromptResult:
        self.link.subscriptions.watch(ctx)
        return await self.forward(GetPromptRequest(params=_clean_params(params)), GetPromptResult)

    async def _complete(
        self, ctx: ServerRequestContext[Any], params: CompleteRequestParams
    ) -> CompleteResult:
        return await self.forward(CompleteRequest(params=_clean_params(params)), CompleteResult)

    async def forward(self, request: ClientRequest, result_type: type[_ResultT]) -> _ResultT:
        """Send ``request`` to the bot and return its result (``_meta``
        cleaned). The bot's own MCPError passes through unchanged; a
        transport failure resets the link and the request is sent once more
        on a fresh session (these requests are safe to repeat); a second
        failure, or an unreachable bot, is -32603."""
        method = request.method
        attempt = 0
        while True:
            attempt += 1
            failure: BaseException
            try:
                async with self.link.lease() as (session, gen):
                    try:
                        result = await session.send_request(request, result_type)
                    except MCPError as exc:
                        if self.link.era_refused(exc, gen, probe=method in _HANDSHAKE_ONLY_METHODS):
                            attempt -= 1  # not a failure: sent again on a handshake-era session
                            continue
                        if exc.error.code not in TRANSPORT_ERROR_CODES:
                            raise
                        failure = exc
                    except pydantic.ValidationError as exc:
                        log.info("bot %s sent an invalid %s result: %s", self.link.uid[:8], method, exc)
                        raise MCPError(INTERNAL_ERROR, f"{method}: the bot sent an invalid result") from None
                    except Exception as exc:
                        failure = exc
                    else:
                        return _clean_result(result)
                    self.link.reset(gen)
            except LinkError as exc:
                raise MCPError(INTERNAL_ERROR, f"bot unavailable: {exc}") from None
            if attempt == 1:
                log.info("%s to bot %s failed (%s); retrying once", method, self.link.uid[:8], failure)
                continue
            if isinstance(failure, MCPError):
                raise failure
            raise MCPError(INTERNAL_ERROR, f"{method} to bot failed: {failure}") from None


def _paginated(params: PaginatedRequestParams) -> PaginatedRequestParams | None:
    """The list request's params for the bot: the cursor and the agent's
    own ``_meta`` keys; None when neither is left."""
    meta = strip_reserved_meta(params.meta)
    if params.cursor is None and meta is None:
        return None
    return PaginatedRequestParams(cursor=params.cursor, _meta=cast("RequestParamsMeta | None", meta))


def _clean_params(params: _ParamsT) -> _ParamsT:
    """``params`` without the reserved ``_meta`` keys, and without the
    2026-07-28 input-response fields, which a handshake-era bot cannot take."""
    update: dict[str, Any] = {"meta": strip_reserved_meta(params.meta)}
    if isinstance(params, InputResponseRequestParams):
        update.update(input_responses=None, request_state=None)
    return params.model_copy(update=update)


def _clean_result(result: _ResultT) -> _ResultT:
    meta = getattr(result, "meta", None)
    if not meta:
        return result
    return result.model_copy(update={"meta": strip_reserved_meta(meta)})
