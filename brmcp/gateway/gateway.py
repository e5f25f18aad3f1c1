"""The gateway: an existing MCP server sold through a :class:`~brmcp.server.Harness`.

What the upstream declares is mirrored to BR callers:

* tools: listed as the upstream lists them, priced from ``prices.json``
  (hidden ones left out), served through the harness's per-call pipeline
  (allowlist, rate limit, callKey, debit or ``payment_required``, journal),
  so the upstream is called only after the debit, at most once per keyed
  call; an upstream ``isError`` result, a JSON-RPC error, a timeout or an
  upstream that dies during the call refunds the charge once, as a failing
  native handler does; its results and error texts pass the harness's
  guard as a native handler's do, so an upstream can neither pass for a
  payment request nor write a ``brmcp/`` result key (WIRE.md §Payments);
* resources, resource templates, prompts and completions: forwarded live
  (free; ``resources/read`` and ``prompts/get`` take a rate-limit token),
  upstream errors passed on unchanged; subscriptions forwarded;
* notifications: ``tools/list_changed`` re-lists the tools and tells the
  callers; resource and prompt list changes and resource updates are
  relayed to the sessions that used them;
* in-call traffic: progress is relayed to the caller by its own token; the
  upstream's log messages go to the caller whose call is the only one in
  flight (an upstream cannot say which request a log belongs to over
  stdio), otherwise to our own log at debug level; its sampling and
  elicitation requests go to that caller too, and are refused (-32600)
  when no call or several calls are running.

By default the upstream sees a call as a local MCP client would send it:
no BR uid, no callKey. With ``send_caller_uid`` the caller's uid travels
in ``params._meta["brmcp/callerUid"]``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar, cast

import anyio
import anyio.abc
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    CompleteRequest,
    CompleteRequestParams,
    CompleteResult,
    CreateMessageRequest,
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequest,
    ElicitRequestParams,
    ElicitResult,
    EmptyResult,
    ErrorData,
    GetPromptRequest,
    GetPromptRequestParams,
    GetPromptResult,
    InitializeResult,
    ListPromptsRequest,
    ListPromptsResult,
    ListResourcesRequest,
    ListResourcesResult,
    ListResourceTemplatesRequest,
    ListResourceTemplatesResult,
    ListToolsRequest,
    ListToolsResult,
    LoggingMessageNotification,
    LoggingMessageNotificationParams,
    PaginatedRequestParams,
    PromptListChangedNotification,
    ReadResourceRequest,
    ReadResourceRequestParams,
    ReadResourceResult,
    RequestParamsMeta,
    ResourceListChangedNotification,
    ResourceUpdatedNotification,
    ServerNotification,
    SubscribeRequest,
    SubscribeRequestParams,
    Tool,
    ToolListChangedNotification,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel

from brmcp.server import RATE_LIMITED_TEXT
from brmcp.server.catalog import MAX_SUBSCRIBED_URI_BYTES, MAX_SUBSCRIPTIONS, Handler, peer_of

from ..protocol.toolerrors import ToolRefusal, internal_error_text
from ..server import CallContext, Harness
from .config import CALLER_UID_KEY, UpstreamConfig, UpstreamConfigError
from .prices import PriceError, PriceTable, defaulted_text, unlisted_text
from .tools import strip_reserved, tool_specs
from .upstream import (
    CLIENT_INFO,
    Upstream,
    UpstreamStartError,
    UpstreamUnavailable,
    open_transport,
    start_failure,
)

__all__ = ["MAX_TOOL_PAGES", "Gateway", "GatewayError", "list_upstream_tools"]

log = logging.getLogger("brmcp.gateway")

_R = TypeVar("_R", bound=BaseModel)
#: Most tools/list pages followed when listing the upstream's tools.
MAX_TOOL_PAGES = 100
#: Most URIs the gateway keeps subscribed at the upstream (re-subscribed after a restart).
_MAX_UPSTREAM_SUBSCRIPTIONS = 4096
#: Most tool names remembered as listed once (a price for one the upstream dropped is kept).
_MAX_REMEMBERED_TOOLS = 65536


class GatewayError(Exception):
    """The gateway cannot start: the upstream cannot be started or listed,
    or ``prices.json`` prices a tool it does not list."""


class Gateway:
    """Sell the upstream MCP server described by ``config`` through
    ``harness`` at ``prices``. The harness must be built with
    ``HarnessConfig(tools_list_changed=True)`` and hold no tools of its own
    with the upstream's names.

    ``async with anyio.create_task_group() as tg: await tg.start(gateway.run)``
    starts the upstream (raising :class:`GatewayError` when the first start
    fails, or when ``prices`` names a tool the upstream does not list, see
    :meth:`PriceTable.check_listed`) and registers its tools and catalog on
    the harness before it returns; start the harness's router afterwards.
    ``base_dir`` resolves a relative ``headers_file``; ``errlog`` gets a
    stdio upstream's stderr.
    Keyword ``upstream_options`` go to :class:`~.upstream.Upstream`
    (timeouts, backoff).
    """

    def __init__(
        self,
        harness: Harness,
        config: UpstreamConfig,
        prices: PriceTable,
        *,
        base_dir: str | Path | None = None,
        errlog: TextIO | None = None,
        **upstream_options: Any,
    ) -> None:
        if not harness.config.tools_list_changed:
            raise ValueError("the gateway's harness needs HarnessConfig(tools_list_changed=True)")
        self.harness = harness
        self.config = config
        self._prices = prices
        self.upstream = Upstream(
            config,
            base_dir=base_dir,
            errlog=errlog,
            on_connected=self._on_connected,
            on_notification=self._on_notification,
            on_log=self._on_log,
            on_sampling=self._on_sampling,
            on_elicitation=self._on_elicitation,
            **upstream_options,
        )
        self._upstream_tools: list[Tool] = []
        self._served: set[str] = set()
        #: Tool names the upstream has listed since the start (a price for one it drops is kept).
        self._ever_listed: set[str] = set()
        #: Priced names not listed, as last warned about; None until the start's check.
        self._warned: set[str] | None = None
        #: Listed tools not named in prices.json already warned about.
        self._defaulted: set[str] = set()
        self._inflight: dict[int, ServerRequestContext[Any]] = {}
        self._subscribed: set[str] = set()
        self._catalog_kinds: set[str] = set()
        self._tg: anyio.abc.TaskGroup | None = None
        #: Upstream tools/call requests sent (for tests and metrics).
        self.upstream_calls = 0

    # -- lifecycle --------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[Gateway] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the upstream and keep it running until cancelled (see the class)."""
        failure: UpstreamStartError | PriceError | None = None
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                await tg.start(self.upstream.run)
                self._check_start_prices()
            except (UpstreamStartError, PriceError) as exc:
                failure = exc
                tg.cancel_scope.cancel()
            else:
                task_status.started(self)
        self._tg = None
        if failure is not None:
            raise GatewayError(str(failure)) from None

    def _check_start_prices(self) -> None:
        """The start's check of ``prices.json`` against the first listing:
        a name the upstream does not list is refused (PriceError), unless
        ``allow_unlisted``, which warns."""
        self._prices.check_listed(tool.name for tool in self._upstream_tools)
        self._warned = set()
        self._warn_unlisted(self._upstream_tools)
        self._warn_defaulted(self._upstream_tools)

    @property
    def prices(self) -> PriceTable:
        return self._prices

    def set_prices(self, prices: PriceTable) -> bool:
        """Apply a new price table at once (the next tools/list and
        tools/call use it; running calls keep the price they were charged).
        When the tool list changed, open sessions are told in the background
        (``notifications/tools/list_changed``); returns whether it changed.

        Once started, a table that names a tool the upstream does not list
        is refused with :class:`PriceError` and the prices in force stay
        (:meth:`PriceTable.check_listed`), unless it sets ``allow_unlisted``
        or the upstream listed that tool earlier and dropped it while
        running (a warning)."""
        if self._warned is not None:
            prices.check_listed((tool.name for tool in self._upstream_tools), dropped=self._ever_listed)
        self._prices = prices
        return self._apply_tools(self._upstream_tools, notify=True)

    # -- tools --------------------------------------------------------------------------

    async def _on_connected(self, session: ClientSession, result: InitializeResult) -> None:
        """After each (re)start: list the tools, register the catalog the
        upstream declares, re-subscribe to resources."""
        caps = result.capabilities
        if result.instructions and not self.harness.server.instructions:
            self.harness.server.instructions = result.instructions
        tools = await _list_tools(session) if caps.tools is not None else []
        self._register_catalog(result)
        self._apply_tools(tools, notify=self.upstream.generation > 1)
        if self._subscribed and caps.resources is not None and caps.resources.subscribe:
            for uri in sorted(self._subscribed):
                try:
                    await session.send_request(
                        SubscribeRequest(params=SubscribeRequestParams(uri=uri)), EmptyResult
                    )
                except MCPError as exc:
                    log.info("upstream refused the re-subscription to %.200s: %s", uri, exc.error.message)

    def _apply_tools(self, tools: list[Tool], *, notify: bool) -> bool:
        before = [spec.to_tool() for spec in self.harness.tools() if spec.name in self._served]
        specs, _ = tool_specs(tools, self._prices, self._handler_for)
        for tool in tools:
            if len(self._ever_listed) >= _MAX_REMEMBERED_TOOLS:
                break
            self._ever_listed.add(tool.name)
        self._warn_unlisted(tools)
        self._warn_defaulted(tools)
        names = {spec.name for spec in specs}
        for name in self._served - names:
            self.harness.remove_tool(name)
        for spec in specs:
            self.harness.add_tool_spec(spec, replace=True)
        self._served = names
        self._upstream_tools = list(tools)
        after = [spec.to_tool() for spec in specs]
        changed = _dump(before) != _dump(after)
        if changed and notify and self._tg is not None:
            self._tg.start_soon(self._announce_tools)
        return changed

    def _warn_unlisted(self, tools: list[Tool]) -> None:
        """Warn once about the priced names ``tools`` lacks (a tool the
        upstream dropped, or one ``allow_unlisted`` lets through); nothing
        before the start's check, which refuses them instead."""
        if self._warned is None:
            return
        listed = [tool.name for tool in tools]
        unknown = self._prices.unlisted(set(listed))
        new = [name for name in unknown if name not in self._warned]
        self._warned = set(unknown)
        dropped = [name for name in new if name in self._ever_listed]
        never = [name for name in new if name not in self._ever_listed]
        if dropped:
            keys = ", ".join(f'tools["{name}"]' for name in dropped)
            log.warning(
                "%s: %s: the upstream no longer lists %s; the price applies again if it returns",
                self._prices.source,
                keys,
                "this tool" if len(dropped) == 1 else "these tools",
            )
        if never:
            log.warning("%s", unlisted_text(self._prices.source, never, listed, error=False))

    def _warn_defaulted(self, tools: list[Tool]) -> None:
        """Warn once per tool the upstream lists that ``prices.json`` does
        not name: it is sold at ``default`` (an upstream may add tools only
        once it runs, after the first run wrote the file), so the operator
        learns which price it got and how to set its own."""
        if self._warned is None:
            return  # before the start's check, which may refuse the table
        fresh = [
            tool.name
            for tool in tools
            if tool.name not in self._prices.tools and tool.name not in self._defaulted
        ]
        if not fresh or len(self._defaulted) >= _MAX_REMEMBERED_TOOLS:
            return
        self._defaulted.update(fresh)
        log.warning("%s", defaulted_text(self._prices, fresh))

    async def _announce_tools(self) -> None:
        sent = await self.harness.notify_tool_list_changed()
        log.info("the tool list changed; told %d session(s)", sent)

    def _handler_for(self, name: str) -> Handler:
        async def forward(ctx: CallContext, arguments: dict[str, Any]) -> CallToolResult:
            return await self._call_tool(ctx, name, arguments)

        return forward

    def _meta_for(self, peer: str, meta: Any = None) -> RequestParamsMeta | None:
        """The ``_meta`` sent upstream: the caller's own keys minus the
        SDK-managed ones and ours, plus the caller's uid when configured."""
        out = dict(strip_reserved(meta, own=True) or {})
        if self.config.send_caller_uid:
            out[CALLER_UID_KEY] = peer
        return cast("RequestParamsMeta", out) if out else None

    async def _call_tool(self, ctx: CallContext, name: str, arguments: dict[str, Any]) -> CallToolResult:
        request = ctx.request if isinstance(ctx.request, ServerRequestContext) else None
        progress: Callable[[float, float | None, str | None], Awaitable[None]] | None = None
        if request is not None:

            async def relay(value: float, total: float | None, message: str | None) -> None:
                try:
                    await request.session.report_progress(value, total, message)
                except Exception as exc:
                    log.debug("progress not relayed to %s: %s", ctx.peer[:8], exc)

            progress = relay
        params = CallToolRequestParams(name=name, arguments=arguments, _meta=self._meta_for(ctx.peer))
        token = id(ctx)
        if request is not None:
            self._inflight[token] = request
        try:
            self.upstream_calls += 1
            result = await self.upstream.request(
                CallToolRequest(params=params), CallToolResult, progress_callback=progress
            )
        except UpstreamUnavailable as exc:
            raise ToolRefusal(f"{exc}; the charge, if any, is refunded") from None
        except MCPError as exc:
            # The upstream's own words, passed on; any other exception here is
            # ours and becomes the harness's internal-error text.
            raise ToolRefusal(f"upstream error {exc.error.code}: {exc.error.message}") from None
        finally:
            self._inflight.pop(token, None)
        # An upstream cannot forge our keys (receipts, prices) in a result.
        result.meta = strip_reserved(result.meta, own=True)
        return result

    # -- in-call relays -----------------------------------------------------------------

    async def _on_log(self, params: LoggingMessageNotificationParams) -> None:
        targets = list(self._inflight.values())
        if len(targets) != 1:
            log.debug("upstream log (%s) %s: %.500s", params.level, params.logger or "-", params.data)
            return
        request = targets[0]
        await request.session.send_notification(
            LoggingMessageNotification(params=params), related_request_id=request.request_id
        )

    async def _ask_caller(self, request: Any, result_type: Any) -> Any:
        """Relay an upstream sampling or elicitation request to the caller
        whose call is the only one running (the upstream cannot say which
        call it belongs to); refused with -32600 otherwise."""
        targets = list(self._inflight.values())
        if len(targets) != 1:
            return ErrorData(
                code=INVALID_REQUEST,
                message=f"{request.method} is relayed to a caller only while exactly one tool call runs",
            )
        caller = targets[0]
        try:
            return await caller.session.send_request(
                request, result_type, metadata=ServerMessageMetadata(related_request_id=caller.request_id)
            )
        except MCPError as exc:
            return exc.error

    async def _on_sampling(
        self, context: ClientRequestContext, params: CreateMessageRequestParams
    ) -> CreateMessageResult | ErrorData:
        result: CreateMessageResult | ErrorData = await self._ask_caller(
            CreateMessageRequest(params=params), CreateMessageResult
        )
        return result

    async def _on_elicitation(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        result: ElicitResult | ErrorData = await self._ask_caller(ElicitRequest(params=params), ElicitResult)
        return result

    async def _on_notification(self, message: ServerNotification) -> None:
        tg = self._tg
        if tg is None:
            return
        if isinstance(message, ToolListChangedNotification):
            tg.start_soon(self._refresh_tools)
        elif isinstance(message, ResourceUpdatedNotification):
            tg.start_soon(self.harness.notify_resource_updated, message.params.uri)
        elif isinstance(message, ResourceListChangedNotification):
            tg.start_soon(self.harness.notify_resource_list_changed)
        elif isinstance(message, PromptListChangedNotification):
            tg.start_soon(self.harness.notify_prompt_list_changed)

    async def _refresh_tools(self) -> None:
        try:
            session, _ = await self.upstream.ready()
            tools = await _list_tools(session)
        except Exception as exc:
            log.warning("re-listing the upstream's tools failed: %s", exc)
            return
        self._apply_tools(tools, notify=True)

    # -- catalog (resources, prompts, completions) ---------------------------------------

    def _register_catalog(self, result: InitializeResult) -> None:
        """Serve the catalog methods the upstream declares. The set is
        fixed by the first start (a session's capabilities cannot change);
        a restarted upstream that dropped one answers its errors."""
        caps = result.capabilities
        server = self.harness.server
        if caps.resources is not None and "resources" not in self._catalog_kinds:
            self._catalog_kinds.add("resources")
            server.add_request_handler(
                "resources/list",
                PaginatedRequestParams,
                self._forwarder(ListResourcesRequest, ListResourcesResult),
            )
            server.add_request_handler(
                "resources/templates/list",
                PaginatedRequestParams,
                self._forwarder(ListResourceTemplatesRequest, ListResourceTemplatesResult),
            )
            server.add_request_handler(
                "resources/read",
                ReadResourceRequestParams,
                self._forwarder(ReadResourceRequest, ReadResourceResult, rate_limited=True),
            )
            if caps.resources.subscribe:
                server.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
                server.add_request_handler(
                    "resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe
                )
        if caps.prompts is not None and "prompts" not in self._catalog_kinds:
            self._catalog_kinds.add("prompts")
            server.add_request_handler(
                "prompts/list", PaginatedRequestParams, self._forwarder(ListPromptsRequest, ListPromptsResult)
            )
            server.add_request_handler(
                "prompts/get",
                GetPromptRequestParams,
                self._forwarder(GetPromptRequest, GetPromptResult, rate_limited=True),
            )
        if caps.completions is not None and "completions" not in self._catalog_kinds:
            self._catalog_kinds.add("completions")
            server.add_request_handler(
                "completion/complete", CompleteRequestParams, self._forwarder(CompleteRequest, CompleteResult)
            )

    def _forwarder(
        self, request_type: Any, result_type: type[_R], *, rate_limited: bool = False
    ) -> Callable[[ServerRequestContext[Any], Any], Awaitable[_R]]:
        async def handler(ctx: ServerRequestContext[Any], params: Any) -> _R:
            peer = peer_of(ctx)
            self.harness.track_session(ctx)
            if rate_limited and not self.harness.take_call_token(peer):
                raise MCPError(code=INVALID_REQUEST, message=RATE_LIMITED_TEXT)
            clean = params.model_copy(update={"meta": self._meta_for(peer, params.meta)})
            result = await self._forward(request_type(params=clean), result_type)
            meta = getattr(result, "meta", None)
            if meta:
                result.meta = strip_reserved(meta, own=True)  # type: ignore[attr-defined]
            return result

        return handler

    async def _forward(self, request: Any, result_type: type[_R]) -> _R:
        try:
            return await self.upstream.request(request, result_type)
        except MCPError:
            raise  # the upstream's own error, unchanged
        except UpstreamUnavailable as exc:
            raise MCPError(code=INTERNAL_ERROR, message=str(exc)) from None
        except Exception as exc:
            name = str(getattr(request, "method", type(request).__name__))
            raise MCPError(code=INTERNAL_ERROR, message=internal_error_text(name, exc, log)) from None

    async def _subscribe(self, ctx: ServerRequestContext[Any], params: SubscribeRequestParams) -> EmptyResult:
        peer = peer_of(ctx)
        uri = params.uri
        if len(uri.encode("utf-8", "surrogatepass")) > MAX_SUBSCRIBED_URI_BYTES:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"resources/subscribe: URI longer than {MAX_SUBSCRIBED_URI_BYTES} bytes",
            )
        state = self.harness.track_session(ctx)
        if state is None:
            raise MCPError(
                code=INVALID_REQUEST, message="resources/subscribe: this connection cannot be notified"
            )
        if uri not in state.uris and len(state.uris) >= MAX_SUBSCRIPTIONS:
            raise MCPError(
                code=INVALID_REQUEST,
                message=f"too many resource subscriptions on this session ({MAX_SUBSCRIPTIONS})",
            )
        clean = SubscribeRequestParams(uri=uri, _meta=self._meta_for(peer))
        await self._forward(SubscribeRequest(params=clean), EmptyResult)
        state.uris.add(uri)
        if len(self._subscribed) < _MAX_UPSTREAM_SUBSCRIPTIONS:
            self._subscribed.add(uri)
        return EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        """Forget the session's subscription. The upstream stays subscribed
        (other sessions may share it); updates nobody wants are dropped."""
        peer_of(ctx)
        state = self.harness.track_session(ctx)
        if state is not None:
            state.uris.discard(params.uri)
        return EmptyResult()


async def list_upstream_tools(
    config: UpstreamConfig,
    *,
    base_dir: str | Path | None = None,
    errlog: TextIO | None = None,
    within: float = 120.0,
) -> list[Tool]:
    """Start the upstream once, ``initialize`` it, list its tools (at most
    :data:`MAX_TOOL_PAGES` pages) and stop it again: what a first
    ``prices.json`` names. ``within`` (seconds) bounds the whole exchange (a
    first ``uvx`` run downloads the server). Raises :class:`GatewayError`
    with the same one line as a failed first start of :meth:`Gateway.run`
    (what, why, and for a stdio command the environment hint), or for a
    ``pass_env`` or header variable that is not set."""
    try:
        with anyio.fail_after(within):
            async with (
                open_transport(config, base_dir=base_dir, errlog=errlog) as (read, write),
                ClientSession(
                    read, write, read_timeout_seconds=config.call_timeout, client_info=CLIENT_INFO
                ) as session,
            ):
                result = await session.initialize()
                return await _list_tools(session) if result.capabilities.tools is not None else []
    except UpstreamConfigError as exc:
        raise GatewayError(str(exc)) from None
    except Exception as exc:
        raise GatewayError(start_failure(config, exc)) from None


async def _list_tools(session: ClientSession) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        params = PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        page = await session.send_request(ListToolsRequest(params=params), ListToolsResult)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools
    log.warning("upstream tools/list: stopped after %d pages", MAX_TOOL_PAGES)
    return tools


def _dump(tools: list[Tool]) -> list[dict[str, Any]]:
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in tools]
