"""The harness's free catalog: resources, resource templates, prompts and
completions, their MCP handlers, and resource subscriptions (MCP
2025-11-25 "Resources", "Prompts", "Completion").

The SDK server declares a capability for each method that has a handler,
so the catalog registers the handlers of a kind only when the first item of
that kind is registered: a harness that serves only tools answers
``initialize`` exactly as before (``{"tools": {"listChanged": false}}``),
and a Go bridge sees no difference.

Every allowed peer sees the whole catalog (``tool_visible`` applies to
tools only); a handler that must refuse a caller checks ``ctx.peer`` and
raises :class:`mcp.shared.exceptions.MCPError`. ``resources/read`` and
``prompts/get`` take a token from the caller's rate-limit bucket, like a
tool call; list requests and completions do not.

Each BR session is one SDK connection, and the server's lifespan (entered
once per connection) yields a :class:`SessionState`: a connection that
used resources or prompts is remembered there until it closes, so the
operator can notify it (:meth:`Catalog.notify_resource_updated`,
:meth:`Catalog.notify_list_changed`).

A :class:`~.harness.Harness` owns one :class:`Catalog` and exposes its
registration methods (:meth:`Catalog.resource`, :meth:`Catalog.add_resource`,
..., :meth:`Catalog.add_completion`) as its own, each a one-line delegation;
their keyword fields are declared once per kind
(:class:`~.resources.ResourceFields`, :class:`~.resources.ResourceTemplateFields`,
:class:`~.prompts.PromptFields`, :class:`~.completions.CompletionFields`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar, Unpack

import anyio
from mcp.server import Server, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    CompleteRequestParams,
    CompleteResult,
    Completion,
    EmptyResult,
    GetPromptRequestParams,
    GetPromptResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    PaginatedRequestParams,
    PromptArgument,
    PromptListChangedNotification,
    PromptReference,
    ReadResourceRequestParams,
    ReadResourceResult,
    ResourceListChangedNotification,
    ResourceUpdatedNotification,
    ResourceUpdatedNotificationParams,
    ServerNotification,
    SubscribeRequestParams,
    ToolListChangedNotification,
    UnsubscribeRequestParams,
)

from brmcp.server.ratelimit import RATE_LIMITED_TEXT, RateLimiter

from ._completions import Completer, CompletionFields, CompletionSpec, completion_spec, to_completion
from ._context import PeerContext, peer_of
from ._fields import spec_fields
from ._prompts import (
    PromptArgumentError,
    PromptFields,
    PromptHandler,
    PromptSpec,
    prompt_from_function,
    prompt_spec,
    to_prompt_result,
)
from ._resources import (
    ResourceFields,
    ResourceHandler,
    ResourceSpec,
    ResourceTemplateFields,
    ResourceTemplateSpec,
    TemplateHandler,
    TemplateVariables,
    resource_from_function,
    resource_spec,
    template_from_function,
    template_spec,
    to_read_result,
)

__all__ = ["MAX_SUBSCRIBED_URI_BYTES", "MAX_SUBSCRIPTIONS", "NOTIFY_TIMEOUT", "Catalog", "SessionState"]

log = logging.getLogger("brmcp.server")

#: Most resource URIs one session may subscribe to.
MAX_SUBSCRIPTIONS = 256
#: Longest resource URI (UTF-8 bytes) a session may subscribe to, so the
#: subscription table of one peer stays small (256 URIs of at most 2 KiB per session).
MAX_SUBSCRIBED_URI_BYTES = 2048
#: Seconds one notification may take to send before it is given up.
NOTIFY_TIMEOUT = 30.0

_T = TypeVar("_T")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class SessionState:
    """Per-connection state (the SDK lifespan context): the session to
    notify, the caller's BR uid (``peer``, None until a request told it)
    and the URIs it subscribed to."""

    __slots__ = ("peer", "session", "uris")

    def __init__(self) -> None:
        self.session: ServerSession | None = None
        self.peer: str | None = None
        self.uris: set[str] = set()


class Catalog:
    """The registry and its MCP handlers. ``limiter`` is the harness's
    per-caller bucket. Call :meth:`bind` with the server whose ``lifespan``
    is :meth:`connection_scope`."""

    def __init__(self, limiter: RateLimiter) -> None:
        self._limiter = limiter
        self._server: Server[Any] | None = None
        self._resources: dict[str, ResourceSpec] = {}
        self._templates: dict[str, ResourceTemplateSpec] = {}
        self._prompts: dict[str, PromptSpec] = {}
        self._completions: dict[tuple[str, str, str], CompletionSpec] = {}
        self._sessions: set[SessionState] = set()
        self._enabled: set[str] = set()

    def bind(self, server: Server[Any]) -> None:
        self._server = server

    @asynccontextmanager
    async def connection_scope(self, server: Server[Any]) -> AsyncIterator[SessionState]:
        """The server's lifespan: one :class:`SessionState` per connection,
        forgotten when the connection ends."""
        state = SessionState()
        try:
            yield state
        finally:
            self._sessions.discard(state)

    # -- registration ----------------------------------------------------------------
    #
    # Registering the first item of a kind makes new sessions declare its
    # capability (resources: subscribe + listChanged; prompts: listChanged;
    # completions); a harness with tools only declares ``{"tools": ...}`` alone.

    def resource(
        self, uri: str, *, name: str | None = None, **fields: Unpack[ResourceFields]
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext)`` as the
        resource at ``uri``; its value becomes the read result (str → text,
        bytes → blob, dict → JSON text; see :func:`~.resources.to_read_result`).
        The name defaults to the function's name; ``fields`` are
        :class:`~.resources.ResourceFields`. Raises TypeError for a bad
        signature or keyword, ValueError for a duplicate or invalid uri."""
        spec_fields(fields, ResourceFields, "resource")

        def register(fn: F) -> F:
            self.add_resource_spec(resource_from_function(fn, uri, name=name, **fields))
            return fn

        return register

    def add_resource(
        self, uri: str, handler: ResourceHandler, *, name: str, **fields: Unpack[ResourceFields]
    ) -> None:
        """Register the resource at ``uri``: ``handler(ctx)`` returns its
        contents (see :meth:`resource`); ``fields`` are
        :class:`~.resources.ResourceFields`. Raises ValueError for a
        duplicate or invalid uri or an empty name."""
        self.add_resource_spec(resource_spec(uri, handler, name=name, **fields))

    def resource_template(
        self, uri_template: str, *, name: str | None = None, **fields: Unpack[ResourceTemplateFields]
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, **variables)``
        for the URIs matching the RFC 6570 ``uri_template`` (e.g.
        ``"notes://{folder}/{id}"``); the parameters after ``ctx`` must be
        the template's variables; ``fields`` are
        :class:`~.resources.ResourceTemplateFields`. Raises TypeError for a
        bad signature or keyword, ValueError for a duplicate or invalid
        template."""
        spec_fields(fields, ResourceTemplateFields, "resource_template")

        def register(fn: F) -> F:
            self.add_template_spec(template_from_function(fn, uri_template, name=name, **fields))
            return fn

        return register

    def add_resource_template(
        self,
        uri_template: str,
        handler: TemplateHandler,
        *,
        name: str,
        **fields: Unpack[ResourceTemplateFields],
    ) -> None:
        """Register a resource template: ``handler(ctx, variables)`` gets
        the variables matched in the URI read (``ctx.target``); ``fields``
        are :class:`~.resources.ResourceTemplateFields`. Raises ValueError
        for a duplicate or invalid template or an empty name."""
        self.add_template_spec(template_spec(uri_template, handler, name=name, **fields))

    def prompt(self, name: str | None = None, **fields: Unpack[PromptFields]) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, arg: str, ...)``
        as a prompt; the str parameters after ``ctx`` are its arguments
        (required unless defaulted). The value becomes the messages (str →
        one user message; see :func:`~.prompts.to_prompt_result`); ``fields``
        are :class:`~.prompts.PromptFields`. Raises TypeError for a bad
        signature or keyword, ValueError for a duplicate name."""
        spec_fields(fields, PromptFields, "prompt")

        def register(fn: F) -> F:
            self.add_prompt_spec(prompt_from_function(fn, name=name, **fields))
            return fn

        return register

    def add_prompt(
        self,
        name: str,
        handler: PromptHandler,
        *,
        arguments: Iterable[PromptArgument] = (),
        **fields: Unpack[PromptFields],
    ) -> None:
        """Register a prompt: ``handler(ctx, args)`` gets the string
        arguments, checked against ``arguments`` (unknown or missing
        required ones are refused with -32602 first); ``fields`` are
        :class:`~.prompts.PromptFields`. Raises ValueError for a duplicate or
        empty name."""
        self.add_prompt_spec(prompt_spec(name, handler, arguments=arguments, **fields))

    def completion(self, **fields: Unpack[CompletionFields]) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, value: str,
        context: dict[str, str]) -> list[str]`` to complete ``argument`` of
        ``prompt`` (a prompt name) or of ``resource_template`` (a URI
        template, ``ref/resource``): :class:`~.completions.CompletionFields`;
        see :meth:`add_completion`."""
        spec_fields(fields, CompletionFields, "completion")

        def register(fn: F) -> F:
            self.add_completion(fn, **fields)
            return fn

        return register

    def add_completion(self, handler: Completer, **fields: Unpack[CompletionFields]) -> None:
        """Register a completer for ``argument`` of exactly one of
        ``prompt`` or ``resource_template`` (:class:`~.completions.CompletionFields`).
        It returns suggestions for the partial ``value``: a list of strings
        (the first 100 are sent, with ``total`` and ``hasMore``) or a
        ``Completion``. An argument without a completer completes to
        nothing; an unknown prompt or template is refused with -32602.
        Raises ValueError for a duplicate or when not exactly one of
        ``prompt``/``resource_template`` is given."""
        self.add_completion_spec(completion_spec(handler, **fields))

    def add_resource_spec(self, spec: ResourceSpec) -> None:
        """Register a prepared :class:`~.resources.ResourceSpec`; ValueError for a duplicate uri."""
        if spec.uri in self._resources:
            raise ValueError(f'resource "{spec.uri}" is already registered')
        self._resources[spec.uri] = spec
        self._enable("resources")

    def add_template_spec(self, spec: ResourceTemplateSpec) -> None:
        """Register a prepared :class:`~.resources.ResourceTemplateSpec`; ValueError for a
        duplicate template."""
        if spec.uri_template in self._templates:
            raise ValueError(f'resource template "{spec.uri_template}" is already registered')
        self._templates[spec.uri_template] = spec
        self._enable("resources")

    def add_prompt_spec(self, spec: PromptSpec) -> None:
        """Register a prepared :class:`~.prompts.PromptSpec`; ValueError for a duplicate name."""
        if spec.name in self._prompts:
            raise ValueError(f'prompt "{spec.name}" is already registered')
        self._prompts[spec.name] = spec
        self._enable("prompts")

    def add_completion_spec(self, spec: CompletionSpec) -> None:
        """Register a prepared :class:`~.completions.CompletionSpec`; ValueError for a duplicate."""
        if spec.key in self._completions:
            raise ValueError(f'a completion for {spec.kind} "{spec.ref}" argument "{spec.argument}" exists')
        self._completions[spec.key] = spec
        self._enable("completions")

    def resources(self) -> list[ResourceSpec]:
        """The registered resources, in registration order."""
        return list(self._resources.values())

    def templates(self) -> list[ResourceTemplateSpec]:
        """The registered resource templates, in registration order."""
        return list(self._templates.values())

    def prompts(self) -> list[PromptSpec]:
        """The registered prompts, in registration order."""
        return list(self._prompts.values())

    def _enable(self, kind: str) -> None:
        server = self._server
        if server is None:
            raise RuntimeError("Catalog.bind was not called")
        if kind in self._enabled:
            return
        self._enabled.add(kind)
        if kind == "resources":
            server.add_request_handler("resources/list", PaginatedRequestParams, self._list_resources)
            server.add_request_handler(
                "resources/templates/list", PaginatedRequestParams, self._list_templates
            )
            server.add_request_handler("resources/read", ReadResourceRequestParams, self._read)
            server.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
            server.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe)
        elif kind == "prompts":
            server.add_request_handler("prompts/list", PaginatedRequestParams, self._list_prompts)
            server.add_request_handler("prompts/get", GetPromptRequestParams, self._get_prompt)
        else:
            server.add_request_handler("completion/complete", CompleteRequestParams, self._complete)

    # -- notifications -------------------------------------------------------------------

    async def notify_resource_updated(self, uri: str, *, peer: str | None = None) -> int:
        """Send ``notifications/resources/updated`` for ``uri`` to every open
        session subscribed to exactly that URI (only ``peer``'s sessions
        when given: a per-caller resource); returns how many were sent."""
        notification = ResourceUpdatedNotification(params=ResourceUpdatedNotificationParams(uri=uri))
        return await self._send(self._subscribed(uri, peer), notification)

    def subscribers(self, uri: str, *, peer: str | None = None) -> int:
        """How many open sessions (of ``peer`` when given) subscribed to ``uri``."""
        return len(self._subscribed(uri, peer))

    def _subscribed(self, uri: str, peer: str | None) -> list[SessionState]:
        return [s for s in self._sessions if uri in s.uris and (peer is None or s.peer == peer)]

    async def notify_list_changed(self, kind: Literal["resources", "prompts", "tools"]) -> int:
        """Send ``notifications/<kind>/list_changed`` to every open session
        remembered (one that used resources or prompts, or listed tools
        when the harness declares ``tools.listChanged``); returns how many
        were sent."""
        notification: ServerNotification
        if kind == "resources":
            notification = ResourceListChangedNotification()
        elif kind == "prompts":
            notification = PromptListChangedNotification()
        else:
            notification = ToolListChangedNotification()
        return await self._send(list(self._sessions), notification)

    async def _send(self, targets: list[SessionState], notification: ServerNotification) -> int:
        sent = 0

        async def one(state: SessionState) -> None:
            nonlocal sent
            session = state.session
            if session is None:
                return
            with anyio.move_on_after(NOTIFY_TIMEOUT):
                try:
                    await session.send_notification(notification)
                except Exception as exc:
                    log.debug("%s not delivered: %s", notification.method, exc)
                    return
                sent += 1

        async with anyio.create_task_group() as tg:
            for state in targets:
                tg.start_soon(one, state)
        return sent

    # -- MCP handlers ----------------------------------------------------------------------

    def remember(self, ctx: ServerRequestContext[Any]) -> SessionState | None:
        """Remember the request's session for notifications; its state, or
        None when the connection has no :class:`SessionState`."""
        state = ctx.lifespan_context
        if not isinstance(state, SessionState):
            return None
        state.session = ctx.session
        if isinstance(ctx.request, str):
            state.peer = ctx.request
        self._sessions.add(state)
        return state

    def _lookup(self, uri: str) -> tuple[ResourceSpec | ResourceTemplateSpec, TemplateVariables | None]:
        spec = self._resources.get(uri)
        if spec is not None:
            return spec, None
        for template in self._templates.values():
            variables = template.match(uri)
            if variables is not None:
                return template, variables
        # The caller's URI is echoed shortened: it may be megabytes of text
        # that JSON escaping would inflate up to six times on the way back.
        short = _shorten(uri)
        raise MCPError(code=INVALID_PARAMS, message=f'unknown resource "{short}"', data={"uri": short})

    def _take(self, peer: str) -> None:
        if not self._limiter.take(peer):
            raise MCPError(code=INVALID_REQUEST, message=RATE_LIMITED_TEXT)

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams
    ) -> ListResourcesResult:
        peer_of(ctx)
        self.remember(ctx)
        return ListResourcesResult(resources=[spec.to_resource() for spec in self._resources.values()])

    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams
    ) -> ListResourceTemplatesResult:
        peer_of(ctx)
        self.remember(ctx)
        return ListResourceTemplatesResult(
            resource_templates=[spec.to_template() for spec in self._templates.values()]
        )

    async def _read(
        self, ctx: ServerRequestContext[Any], params: ReadResourceRequestParams
    ) -> ReadResourceResult:
        peer = peer_of(ctx)
        self.remember(ctx)
        uri = params.uri
        spec, variables = self._lookup(uri)
        self._take(peer)
        call = PeerContext(peer=peer, target=uri, request=ctx)
        if isinstance(spec, ResourceSpec):
            value = await _run(spec.handler(call), peer, f'resource "{uri}"')
        else:
            assert variables is not None
            value = await _run(spec.handler(call, variables), peer, f'resource "{uri}"')
        return _convert(lambda: to_read_result(uri, spec.mime_type, value), peer, f'resource "{uri}"')

    async def _subscribe(self, ctx: ServerRequestContext[Any], params: SubscribeRequestParams) -> EmptyResult:
        peer_of(ctx)
        state = self.remember(ctx)
        uri = params.uri
        if len(uri.encode("utf-8", "surrogatepass")) > MAX_SUBSCRIBED_URI_BYTES:
            raise MCPError(
                code=INVALID_PARAMS,
                message=f"resources/subscribe: URI longer than {MAX_SUBSCRIBED_URI_BYTES} bytes",
            )
        self._lookup(uri)
        if state is None:
            raise MCPError(
                code=INVALID_REQUEST, message="resources/subscribe: this connection cannot be notified"
            )
        if uri not in state.uris and len(state.uris) >= MAX_SUBSCRIPTIONS:
            raise MCPError(
                code=INVALID_REQUEST,
                message=f"too many resource subscriptions on this session ({MAX_SUBSCRIPTIONS})",
            )
        state.uris.add(uri)
        return EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        peer_of(ctx)
        state = self.remember(ctx)
        if state is not None:
            state.uris.discard(params.uri)
        return EmptyResult()

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams
    ) -> ListPromptsResult:
        peer_of(ctx)
        self.remember(ctx)
        return ListPromptsResult(prompts=[spec.to_prompt() for spec in self._prompts.values()])

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any], params: GetPromptRequestParams
    ) -> GetPromptResult:
        peer = peer_of(ctx)
        self.remember(ctx)
        spec = self._prompts.get(params.name)
        if spec is None:
            raise MCPError(code=INVALID_PARAMS, message=f'unknown prompt "{_shorten(params.name)}"')
        try:
            arguments = spec.check_arguments(params.arguments)
        except PromptArgumentError as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        self._take(peer)
        call = PeerContext(peer=peer, target=spec.name, request=ctx)
        what = f'prompt "{spec.name}"'
        value = await _run(spec.handler(call, arguments), peer, what)
        return _convert(lambda: to_prompt_result(value, spec.description), peer, what)

    async def _complete(
        self, ctx: ServerRequestContext[Any], params: CompleteRequestParams
    ) -> CompleteResult:
        peer = peer_of(ctx)
        ref = params.ref
        if isinstance(ref, PromptReference):
            kind, target = "prompt", ref.name
            if target not in self._prompts:
                raise MCPError(code=INVALID_PARAMS, message=f'unknown prompt "{_shorten(target)}"')
        else:
            kind, target = "resource", ref.uri
            if target not in self._templates and target not in self._resources:
                raise MCPError(code=INVALID_PARAMS, message=f'unknown resource template "{_shorten(target)}"')
        spec = self._completions.get((kind, target, params.argument.name))
        if spec is None:
            return CompleteResult(completion=Completion(values=[]))
        context = dict(params.context.arguments or {}) if params.context is not None else {}
        call = PeerContext(peer=peer, target=target, request=ctx)
        what = f'completion of {kind} "{target}" argument "{spec.argument}"'
        value = await _run(spec.handler(call, params.argument.value, context), peer, what)
        return _convert(lambda: to_completion(value), peer, what)


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def _run(pending: Awaitable[_T], peer: str, what: str) -> _T:
    """Await a handler: an MCPError passes through unchanged, any other
    exception becomes -32603 with its text (as a failed tool's text reaches
    the caller)."""
    try:
        return await pending
    except MCPError:
        raise
    except Exception as exc:
        log.info("%s failed for %s: %s", what, peer, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        raise MCPError(code=INTERNAL_ERROR, message=str(exc) or type(exc).__name__) from None


def _convert(build: Callable[[], _T], peer: str, what: str) -> _T:
    """Build a result from a handler's value; a value of the wrong kind
    (TypeError) becomes -32603."""
    try:
        return build()
    except TypeError as exc:
        log.info("%s failed for %s: %s", what, peer, exc)
        raise MCPError(code=INTERNAL_ERROR, message=str(exc)) from None
