"""The serving harness: priced MCP tools for allowed BR peers, paid from a
prepaid ledger funded by tips, each keyed call executed and charged at most
once (go-brmcp.md §3; WIRE.md §Payments, §callKey); plus a free catalog of
resources, prompts and completions (:mod:`.catalog`, not in the Go harness).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    Annotations,
    CallToolRequestParams,
    CallToolResult,
    JSONRPCResponse,
    ListToolsResult,
    PaginatedRequestParams,
    PromptArgument,
    ToolAnnotations,
)
from mcp_types.version import LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from .. import wire
from ..conn import Conn
from ..eras import CAPABILITIES_META_KEY
from ..payment import (
    CALL_KEY,
    Receipt,
    parse_payment_required,
    pay_alongside_atoms,
    payment_required_result,
)
from ..payment import valid_call_key as _is_valid_key
from ..router import Router, RouterOptions

if TYPE_CHECKING:
    from ..metrics import ServeMetrics
from ..sender import PMSender
from . import store
from ._accounts import Accounts
from .billing import Billing
from .callkeys import REPLAY_WINDOW, CallKeyRegistry, Claim, error_result
from .catalog import Catalog, SessionState
from .completions import Completer, CompletionSpec
from .context import CallContext, peer_of
from .firstcontact import MODERN_VERSIONS_KEY, OFFER_LINGER, TOOLS_KEY, FirstContactTap
from .prompts import PromptHandler, PromptSpec, prompt_from_function
from .ratelimit import RATE_LIMITED_TEXT, RateLimiter
from .resources import (
    ResourceHandler,
    ResourceSpec,
    ResourceTemplateSpec,
    TemplateHandler,
    resource_from_function,
    template_from_function,
)
from .store import JournalEntry, StatementEntry, StoreError
from .tools import Handler, PriceFunc, ToolArgumentError, ToolSpec, spec_from_function, to_result

__all__ = ["RATE_LIMITED_TEXT", "Harness", "HarnessConfig", "HarnessError"]

log = logging.getLogger("brmcp.server")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: Outcomes whose JSON is at most this many bytes are kept in the journal
#: and replayed after a restart (go-brmcp.md §3.9).
OUTCOME_CAP = 64 * 1024
#: The JSON-RPC id assumed when the request's own is unknown (a direct
#: :meth:`Harness.call`): the longest an int64 id prints.
_WORST_ID = -(2**63)
#: Default bound on how long a call marked ``brmcp/payAlongside`` is held
#: waiting for its tip's credit (seconds; WIRE.md §Pay alongside).
HOLD_SECONDS = 30.0
#: Default bound on calls held at once per caller.
MAX_HELD_CALLS = 4
#: While holding, the balance is re-read at least this often (seconds), so a
#: credit made outside the harness (an external ``Billing``) is seen too.
_HOLD_RECHECK = 1.0
#: Refused peers are logged at most this often (seconds), remembering this many.
_DENIED_WARN_INTERVAL = 600.0
_DENIED_WARN_MEMORY = 1024


class HarnessError(Exception):
    """The harness cannot start: bad configuration or unusable storage
    (the message names the file)."""


@dataclass(slots=True)
class HarnessConfig:
    """Harness settings (go-brmcp.md §3.1).

    * ``data_dir``: holds the SQLite database (balances, paid-call journal,
      processed tips, audit rows). Required unless ``billing`` is set.
    * ``allowed_peers``: default-deny allowlist of caller uids (exact
      strings; use lowercase hex). ``allow`` replaces it entirely when set.
    * ``calls_per_minute``: token bucket per caller (capacity = burst),
      taken by each tools/call, resources/read and prompts/get.
    * ``tool_visible(peer, tool)``: hide tools per caller (hidden tools are
      absent from tools/list and unknown to tools/call). Resources,
      templates, prompts and completions are visible to every allowed peer;
      their handlers see ``ctx.peer`` and may refuse with an ``MCPError``.
    * ``billing``: an external balance store instead of the built-in ledger.
    * ``router_options``: transport settings (ttl, chunk size, ...).
    * ``name``/``version``: the MCP server implementation info.
    * ``clock``: unix seconds, for journal expiry.
    * ``tools_list_changed``: declare ``tools: {"listChanged": true}``
      (for tool sets that change at run time, e.g. brmcp/gateway).
    * ``hold_seconds`` / ``max_held_calls``: the pay-alongside hold (WIRE.md
      §Pay alongside): an underfunded call marked ``brmcp/payAlongside``
      waits at most ``hold_seconds`` for a credit, with at most
      ``max_held_calls`` such calls per caller (more are refused at once);
      ``hold_seconds <= 0`` or ``max_held_calls <= 0`` turns holding off.
    """

    data_dir: str | os.PathLike[str] | None = None
    allowed_peers: Iterable[str] = ()
    allow: Callable[[str], bool] | None = None
    calls_per_minute: int = 30
    tool_visible: Callable[[str, str], bool] | None = None
    billing: Billing | None = None
    router_options: RouterOptions = field(default_factory=RouterOptions)
    name: str = "brmcp"
    version: str = "0.1.0"
    clock: Callable[[], float] = time.time
    #: Declare ``tools.listChanged`` and remember sessions that list tools,
    #: so :meth:`Harness.notify_tool_list_changed` reaches them (the gateway
    #: sets it; off by default, so a plain harness answers as the Go one).
    tools_list_changed: bool = False
    hold_seconds: float = HOLD_SECONDS
    max_held_calls: int = MAX_HELD_CALLS


def valid_call_key(meta: Any) -> str | None:
    """The ``brmcp/callKey`` of a request's ``_meta`` when it is a string of
    8..128 UTF-8 bytes, else None: the call runs unkeyed (WIRE.md §callKey)."""
    if not isinstance(meta, dict):
        return None
    key = meta.get(CALL_KEY)
    return key if _is_valid_key(key) else None


class _Refused(Exception):
    """A refusal before execution; the claim is released."""

    def __init__(self, result: CallToolResult, reason: str) -> None:
        super().__init__(reason)
        self.result = result
        self.reason = reason


class Harness:
    """Serve MCP tools to allowed BR peers and charge per call; optionally
    also free resources, resource templates, prompts and completions
    (:meth:`resource`, :meth:`resource_template`, :meth:`prompt`,
    :meth:`completion` and their ``add_*`` forms; brmcp/server/catalog.py).

    Construction opens (or creates) the database and reconciles it: every
    paid call interrupted by a crash is refunded exactly once, and completed
    keyed calls inside their 30-minute window are loaded for replay. Raises
    :class:`HarnessError` for a missing data_dir/billing or an unusable
    database (nothing is repaired or reset).

    Use ``async with harness:`` then ``router = await harness.start(sender)``
    (or ``async with harness.serve(sender) as router``) and feed every PM to
    ``router.handle_pm``.
    """

    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        #: Prometheus metrics to update (:class:`brmcp.metrics.ServeMetrics`), or None.
        self.metrics: ServeMetrics | None = None
        self._clock = config.clock
        try:
            self._accounts = Accounts(config.data_dir, config.billing, config.clock)
        except (ValueError, StoreError) as exc:
            raise HarnessError(str(exc)) from None
        try:
            self._limiter = RateLimiter(config.calls_per_minute if config.calls_per_minute > 0 else 30)
        except ValueError as exc:
            raise HarnessError(str(exc)) from None
        self._allowed = frozenset(config.allowed_peers)
        self._allow_fn = config.allow
        self._denied_warned: dict[str, float] = {}
        self._tools: dict[str, ToolSpec] = {}
        self._calls = CallKeyRegistry(window=REPLAY_WINDOW, clock=config.clock)
        self._catalog = Catalog(self._limiter)
        self._server: Server[Any] = Server(
            config.name,
            version=config.version,
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
            lifespan=self._catalog.connection_scope,
        )
        self._catalog.bind(self._server)
        self._stack: AsyncExitStack | None = None
        self._router: Router | None = None
        #: Per caller: an event set (and replaced) on every credit, for held calls.
        self._credit_events: dict[str, anyio.Event] = {}
        #: Per caller: calls held right now waiting for a pay-alongside credit.
        self._held: dict[str, int] = {}
        #: Calls that were held at least once (observability and tests).
        self.holds = 0
        self.executions = 0  #: handler invocations (for tests and metrics)
        try:
            loaded = self._accounts.reconcile(REPLAY_WINDOW, _outcome_json_for_error)
        except StoreError as exc:
            self._accounts.close()
            raise HarnessError(str(exc)) from None
        except Exception as exc:
            self._accounts.close()
            raise HarnessError(f"cannot reconcile the ledger database: {exc}") from exc
        self._load_journal(loaded)

    def _load_journal(self, entries: Iterable[JournalEntry]) -> None:
        for entry in entries:
            outcome = None
            if entry.outcome is not None:
                try:
                    outcome = CallToolResult.model_validate(entry.outcome)
                except ValueError:
                    outcome = None
            self._calls.load(entry.peer, entry.call_key, outcome, entry.expires, 0)

    # -- configuration -----------------------------------------------------------

    def allowed(self, peer: str) -> bool:
        """Admission check: ``allow(peer)`` when configured, else membership
        in the allowlist (default deny)."""
        if self._allow_fn is not None:
            return bool(self._allow_fn(peer))
        return peer in self._allowed

    def _admit(self, peer: str) -> bool:
        """The router's admission check: :meth:`allowed`, plus a warning the
        first time (then at most every 10 minutes) a peer is refused, since
        a refused caller gets no answer at all (WIRE.md §Sessions)."""
        if self.allowed(peer):
            return True
        now = time.monotonic()
        last = self._denied_warned.get(peer)
        if last is None or now - last >= _DENIED_WARN_INTERVAL:
            if last is None and len(self._denied_warned) >= _DENIED_WARN_MEMORY:
                self._denied_warned.pop(next(iter(self._denied_warned)))
            self._denied_warned[peer] = now
            log.warning(
                "ignoring MCP traffic from %s: not an allowed caller (its requests get no answer)", peer
            )
        return False

    def set_allowed_peers(self, peers: Iterable[str]) -> None:
        """Replace the allowlist at run time (ignored while ``allow`` is set)."""
        self._allowed = frozenset(peers)

    def set_calls_per_minute(self, per_minute: int) -> None:
        """Change the rate limit at run time; ``<= 0`` selects 30."""
        self._limiter.per_minute = per_minute if per_minute > 0 else 30

    @property
    def calls_per_minute(self) -> int:
        return self._limiter.per_minute

    @property
    def server(self) -> Server[Any]:
        """The MCP SDK server that serves every session."""
        return self._server

    @property
    def database_path(self) -> str | None:
        return None if self._accounts.path is None else str(self._accounts.path)

    # -- tools -----------------------------------------------------------------------

    def tool(
        self,
        name: str | None = None,
        *,
        description: str | None = None,
        price_atoms: int = 0,
        price: PriceFunc | None = None,
        output_schema: dict[str, Any] | None = None,
        annotations: ToolAnnotations | None = None,
        title: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: CallContext, ...)``; the
        input schema comes from the type hints (see
        :func:`~.tools.spec_from_function`). ``price_atoms`` is a fixed price
        in atoms; ``price(ctx, args) -> atoms`` makes it dynamic."""

        def register(fn: F) -> F:
            self._add(
                spec_from_function(
                    fn,
                    name=name,
                    description=description,
                    price_atoms=price_atoms,
                    price=price,
                    output_schema=output_schema,
                    annotations=annotations,
                    title=title,
                    meta=meta,
                )
            )
            return fn

        return register

    def add_tool(
        self,
        name: str,
        handler: Handler,
        *,
        description: str | None,
        input_schema: dict[str, Any],
        output_schema: dict[str, Any] | None = None,
        price_atoms: int = 0,
        price: PriceFunc | None = None,
        annotations: ToolAnnotations | None = None,
        title: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Register a tool with an explicit JSON Schema; ``handler(ctx,
        args)`` returns a dict (structured result), a str, or a
        CallToolResult. Raises ValueError for an invalid schema, a negative
        price or a duplicate name."""
        self._add(
            ToolSpec(
                name=name,
                handler=handler,
                description=description,
                input_schema=input_schema,
                output_schema=output_schema,
                price_atoms=price_atoms,
                price=price,
                annotations=annotations,
                title=title,
                meta=dict(meta or {}),
            )
        )

    def _add(self, spec: ToolSpec) -> None:
        if spec.name in self._tools:
            raise ValueError(f'tool "{spec.name}" is already registered')
        self._tools[spec.name] = spec

    def add_tool_spec(self, spec: ToolSpec, *, replace: bool = False) -> None:
        """Register a prepared :class:`~.tools.ToolSpec`; with ``replace``
        an existing tool of that name is replaced (calls already running
        finish with the old spec). Raises ValueError for a duplicate name
        without ``replace``."""
        if replace:
            self._tools[spec.name] = spec
        else:
            self._add(spec)

    def remove_tool(self, name: str) -> bool:
        """Unregister ``name`` (absent from the next tools/list, unknown to
        the next tools/call; running calls finish). Returns whether it existed."""
        return self._tools.pop(name, None) is not None

    def tools(self) -> list[ToolSpec]:
        return list(self._tools.values())

    # -- resources, prompts, completions (free) -----------------------------------------
    #
    # Registering the first item of a kind makes new sessions declare its
    # capability (resources: subscribe + listChanged; prompts: listChanged;
    # completions); a harness with tools only declares {"tools": ...} alone.
    # Every allowed peer sees every item (tool_visible is for tools only);
    # see brmcp/server/catalog.py.

    def resource(
        self,
        uri: str,
        *,
        name: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
        title: str | None = None,
        size: int | None = None,
        annotations: Annotations | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext)`` as the
        resource at ``uri``; its value becomes the read result (str → text,
        bytes → blob, dict → JSON text; see :func:`~.resources.to_read_result`).
        The name defaults to the function's name. Raises TypeError for a
        bad signature, ValueError for a duplicate or invalid uri."""

        def register(fn: F) -> F:
            self._catalog.add_resource(
                resource_from_function(
                    fn,
                    uri,
                    name=name,
                    description=description,
                    mime_type=mime_type,
                    title=title,
                    size=size,
                    annotations=annotations,
                    meta=meta,
                )
            )
            return fn

        return register

    def add_resource(
        self,
        uri: str,
        handler: ResourceHandler,
        *,
        name: str,
        description: str | None = None,
        mime_type: str | None = None,
        title: str | None = None,
        size: int | None = None,
        annotations: Annotations | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Register the resource at ``uri``: ``handler(ctx)`` returns its
        contents (see :meth:`resource`). Raises ValueError for a duplicate
        or invalid uri or an empty name."""
        self._catalog.add_resource(
            ResourceSpec(
                uri=uri,
                handler=handler,
                name=name,
                description=description,
                mime_type=mime_type,
                title=title,
                size=size,
                annotations=annotations,
                meta=dict(meta or {}),
            )
        )

    def resource_template(
        self,
        uri_template: str,
        *,
        name: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
        title: str | None = None,
        annotations: Annotations | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, **variables)``
        for the URIs matching the RFC 6570 ``uri_template`` (e.g.
        ``"notes://{folder}/{id}"``); the parameters after ``ctx`` must be
        the template's variables. Raises TypeError for a bad signature,
        ValueError for a duplicate or invalid template."""

        def register(fn: F) -> F:
            self._catalog.add_template(
                template_from_function(
                    fn,
                    uri_template,
                    name=name,
                    description=description,
                    mime_type=mime_type,
                    title=title,
                    annotations=annotations,
                    meta=meta,
                )
            )
            return fn

        return register

    def add_resource_template(
        self,
        uri_template: str,
        handler: TemplateHandler,
        *,
        name: str,
        description: str | None = None,
        mime_type: str | None = None,
        title: str | None = None,
        annotations: Annotations | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Register a resource template: ``handler(ctx, variables)`` gets
        the variables matched in the URI read (``ctx.target``). Raises
        ValueError for a duplicate or invalid template or an empty name."""
        self._catalog.add_template(
            ResourceTemplateSpec(
                uri_template=uri_template,
                handler=handler,
                name=name,
                description=description,
                mime_type=mime_type,
                title=title,
                annotations=annotations,
                meta=dict(meta or {}),
            )
        )

    def prompt(
        self,
        name: str | None = None,
        *,
        description: str | None = None,
        title: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, arg: str, ...)``
        as a prompt; the str parameters after ``ctx`` are its arguments
        (required unless defaulted). The value becomes the messages (str →
        one user message; see :func:`~.prompts.to_prompt_result`). Raises
        TypeError for a bad signature, ValueError for a duplicate name."""

        def register(fn: F) -> F:
            self._catalog.add_prompt(
                prompt_from_function(fn, name=name, description=description, title=title, meta=meta)
            )
            return fn

        return register

    def add_prompt(
        self,
        name: str,
        handler: PromptHandler,
        *,
        description: str | None = None,
        arguments: Iterable[PromptArgument] = (),
        title: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Register a prompt: ``handler(ctx, args)`` gets the string
        arguments, checked against ``arguments`` (unknown or missing
        required ones are refused with -32602 first). Raises ValueError for
        a duplicate or empty name."""
        self._catalog.add_prompt(
            PromptSpec(
                name=name,
                handler=handler,
                description=description,
                arguments=list(arguments),
                title=title,
                meta=dict(meta or {}),
            )
        )

    def completion(
        self, *, argument: str, prompt: str | None = None, resource_template: str | None = None
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: PeerContext, value: str,
        context: dict[str, str]) -> list[str]`` to complete ``argument`` of
        ``prompt`` (a prompt name) or of ``resource_template`` (a URI
        template, ``ref/resource``); see :meth:`add_completion`."""

        def register(fn: F) -> F:
            self.add_completion(fn, argument=argument, prompt=prompt, resource_template=resource_template)
            return fn

        return register

    def add_completion(
        self,
        handler: Completer,
        *,
        argument: str,
        prompt: str | None = None,
        resource_template: str | None = None,
    ) -> None:
        """Register a completer for ``argument`` of exactly one of
        ``prompt`` or ``resource_template``. It returns suggestions for the
        partial ``value``: a list of strings (the first 100 are sent, with
        ``total`` and ``hasMore``) or a ``Completion``. An argument without
        a completer completes to nothing; an unknown prompt or template is
        refused with -32602. Raises ValueError for a duplicate or when not
        exactly one of ``prompt``/``resource_template`` is given."""
        if (prompt is None) == (resource_template is None):
            raise ValueError("add_completion: give exactly one of prompt= or resource_template=")
        if prompt is not None:
            spec = CompletionSpec(kind="prompt", ref=prompt, argument=argument, handler=handler)
        else:
            assert resource_template is not None
            spec = CompletionSpec(kind="resource", ref=resource_template, argument=argument, handler=handler)
        self._catalog.add_completion(spec)

    def resources(self) -> list[ResourceSpec]:
        return self._catalog.resources()

    def resource_templates(self) -> list[ResourceTemplateSpec]:
        return self._catalog.templates()

    def prompts(self) -> list[PromptSpec]:
        return self._catalog.prompts()

    async def notify_resource_updated(self, uri: str) -> int:
        """Tell every open session subscribed to ``uri`` (exact match) that
        it changed (``notifications/resources/updated``, one PM each).
        Returns the number of sessions notified; failures are logged."""
        return await self._catalog.notify_resource_updated(uri)

    async def notify_resource_list_changed(self) -> int:
        """Send ``notifications/resources/list_changed`` to every open
        session that has used resources or prompts; returns how many."""
        return await self._catalog.notify_list_changed("resources")

    async def notify_tool_list_changed(self) -> int:
        """Send ``notifications/tools/list_changed`` to every open session
        that listed tools (needs ``tools_list_changed`` in the config) or
        used resources or prompts; returns how many."""
        return await self._catalog.notify_list_changed("tools")

    def track_session(self, ctx: ServerRequestContext[Any]) -> SessionState | None:
        """Remember the session of a request for later notifications (what
        the built-in catalog handlers do); returns its per-connection state
        (``state.uris`` holds its resource subscriptions), or None when the
        connection has none."""
        return self._catalog.remember(ctx)

    def take_call_token(self, peer: str) -> bool:
        """Take one token from ``peer``'s rate-limit bucket (as each
        tools/call, resources/read and prompts/get does); False when the
        caller is over its limit."""
        return self._limiter.take(peer)

    async def notify_prompt_list_changed(self) -> int:
        """Send ``notifications/prompts/list_changed`` to every open session
        that has used resources or prompts; returns how many."""
        return await self._catalog.notify_list_changed("prompts")

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Harness:
        if self._stack is not None:
            raise RuntimeError("Harness already entered")
        self._stack = AsyncExitStack()
        await self._stack.__aenter__()
        try:
            recovered = await self._accounts.reconcile_external(REPLAY_WINDOW, _outcome_json_for_error)
        except BaseException:
            stack, self._stack = self._stack, None
            await stack.aclose()
            raise
        self._load_journal(recovered)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        self._router = None
        try:
            if stack is not None:
                return await stack.__aexit__(exc_type, exc_val, exc_tb)
            return None
        finally:
            self._accounts.close()

    async def start(self, sender: PMSender) -> Router:
        """Start serving: returns the server-role Router (owned by this
        harness) whose ``handle_pm`` the host must feed with every PM.
        Requires ``async with harness``."""
        if self._stack is None:
            raise RuntimeError("enter the harness first: 'async with harness: await harness.start(sender)'")
        if self._router is not None:
            raise RuntimeError("harness already started")
        router = Router(sender, accept=self._accept, allow=self._admit, options=self.config.router_options)
        await self._stack.enter_async_context(router)
        self._router = router
        return router

    @contextlib.asynccontextmanager
    async def serve(self, sender: PMSender) -> AsyncIterator[Router]:
        """``async with harness.serve(sender) as router:`` enters the harness,
        starts it and closes everything on exit."""
        async with self:
            yield await self.start(sender)

    @property
    def router(self) -> Router | None:
        return self._router

    def _notifications(self) -> NotificationOptions:
        """listChanged is declared for resources and prompts (only present
        once one is registered; the operator may call notify_*_list_changed),
        and for tools with ``tools_list_changed``."""
        return NotificationOptions(
            resources_changed=True, prompts_changed=True, tools_changed=self.config.tools_list_changed
        )

    async def _accept(self, conn: Conn) -> None:
        server = self._server
        # listChanged is declared for resources and prompts (only present
        # once one is registered): the operator may call notify_*_list_changed.
        options = server.create_initialization_options(self._notifications())
        # First contact in one round trip (WIRE.md §Eras): a marked
        # initialize is answered with the modern versions and the tools.
        tap = FirstContactTap(conn.read_stream, conn.write_stream, lambda: self._first_contact(conn.peer))
        async with anyio.create_task_group() as tg:
            tg.start_soon(_close_abandoned_offer, tap, conn)
            await server.run(tap.read_stream, tap.write_stream, options)
            tg.cancel_scope.cancel()

    def _first_contact(self, peer: str) -> dict[str, Any]:
        """The ``_meta`` entries of a marked ``initialize`` answer for ``peer``."""
        tools = [spec.to_tool() for spec in self._tools.values() if self._visible(peer, spec.name)]
        listed = ListToolsResult(tools=tools).model_dump(by_alias=True, mode="json", exclude_none=True)
        return {MODERN_VERSIONS_KEY: list(MODERN_PROTOCOL_VERSIONS), TOOLS_KEY: listed}

    # -- money ---------------------------------------------------------------------------

    async def balance(self, peer: str) -> int:
        """Prepaid balance of ``peer`` in atoms."""
        return await self._accounts.balance(peer)

    async def credit(self, peer: str, atoms: int, *, memo: str | None = None) -> None:
        """Credit ``atoms`` (> 0) to ``peer`` outside the tip path (operator
        top-ups, tests). Audited as kind ``credit``. Raises ValueError for a
        non-positive amount, and ``store.BalanceLimitError`` (a ValueError;
        logged, nothing credited) when the built-in ledger's balance would
        pass ``MAX_BALANCE_ATOMS`` (21 million DCR; SECURITY.md)."""
        if isinstance(atoms, bool) or not isinstance(atoms, int) or atoms <= 0:
            raise ValueError(f"credit amount must be a positive number of atoms, got {atoms!r}")
        if atoms > store.MAX_BALANCE_ATOMS:
            exc = store.BalanceLimitError(peer, await self.balance(peer), atoms)
            log.error("%s", exc)
            raise exc
        ref = f"credit:{wire.new_id()}{wire.new_id()}"
        try:
            with anyio.CancelScope(shield=True):
                await self._accounts.credit(peer, atoms, kind="credit", ref=ref)
        except store.BalanceLimitError as exc:
            log.error("%s", exc)
            raise
        self._credited(peer)

    async def credit_tip(self, peer: str, amount_matoms: int, sequence_id: int) -> int:
        """Credit a received tip: milliatoms floored to atoms, only for
        allowed peers, once per tip (sequence id, sender and amount recorded
        in the same transaction as the credit, so a redelivered tip never
        credits twice, even across a crash). Returns the atoms credited (0
        for replays, non-allowed senders and amounts under 1000 matoms)."""
        _, atoms = await self.record_tip(peer, amount_matoms, sequence_id)
        return atoms

    async def record_tip(self, peer: str, amount_matoms: int, sequence_id: int) -> tuple[bool, int]:
        """Like :meth:`credit_tip` but also says whether the tip was new
        (False: a redelivery, nothing changed). Raises ValueError, changing
        nothing, when the sequence id or the amount is not a signed 64-bit
        integer (the ledger's type; ids must also be >= 0; a negative
        amount is recorded, never credited); a tip that would
        push the built-in ledger's balance past ``MAX_BALANCE_ATOMS`` is
        recorded as seen, not credited, and logged as an error."""
        for name, value, low in (
            ("sequence id", sequence_id, 0),
            ("amount", amount_matoms, -store.MAX_INT63 - 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= store.MAX_INT63:
                raise ValueError(f"tip {name} {value!r} out of range (a signed 64-bit integer, ids >= 0)")
        allowed = self.allowed(peer)
        with anyio.CancelScope(shield=True):
            outcome = await self._accounts.credit_tip(
                peer=peer, amount_matoms=int(amount_matoms), sequence_id=int(sequence_id), allowed=allowed
            )
        if outcome[1] > 0:
            self._credited(peer)
        return outcome

    def _credited(self, peer: str) -> None:
        """Wake the calls of ``peer`` held for a pay-alongside credit."""
        event = self._credit_events.pop(peer, None)
        if event is not None:
            event.set()

    def _credit_event(self, peer: str) -> anyio.Event:
        event = self._credit_events.get(peer)
        if event is None:
            event = self._credit_events[peer] = anyio.Event()
        return event

    async def has_tip_history(self) -> bool:
        """True once this harness's ledger has recorded any received tip
        (False for a new data directory)."""
        return await self._accounts.has_tip_history()

    async def statement(self, peer: str) -> list[StatementEntry]:
        """Every money movement of ``peer``, oldest first (tips, credits,
        charges, refunds), from the append-only audit table."""
        return await self._accounts.statement(peer)

    # -- MCP handlers ----------------------------------------------------------------------

    def _visible(self, peer: str, name: str) -> bool:
        fn = self.config.tool_visible
        return fn is None or bool(fn(peer, name))

    async def _on_list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        peer = peer_of(ctx)
        if self.config.tools_list_changed:
            self._catalog.remember(ctx)
        tools = [spec.to_tool() for spec in self._tools.values() if self._visible(peer, spec.name)]
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return ListToolsResult(tools=tools)
        # A modern caller skipped server/discover: state the capabilities
        # here so it needs no second round trip (WIRE.md §Eras). What
        # initialize would declare: the modern era's own flags drop subscribe
        # and listChanged, which a bridge needs to pick the era.
        declared = self._server.get_capabilities(
            self._notifications(), protocol_version=LATEST_HANDSHAKE_VERSION
        )
        stated = declared.model_dump(by_alias=True, mode="json", exclude_none=True)
        return ListToolsResult(tools=tools, _meta={CAPABILITIES_META_KEY: stated})

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        peer = peer_of(ctx)
        spec = self._tools.get(params.name)
        if spec is None or not self._visible(peer, params.name):
            raise MCPError(code=INVALID_PARAMS, message=f'unknown tool "{params.name}"')
        arguments = params.arguments or {}
        try:
            prepared = spec.validate(arguments)
        except ToolArgumentError as exc:
            return error_result(str(exc))
        key = valid_call_key(params.meta)
        alongside = pay_alongside_atoms(params.meta)
        return await self.call(peer, spec, arguments, prepared, key, request=ctx, alongside=alongside)

    async def call(
        self,
        peer: str,
        spec: ToolSpec,
        arguments: dict[str, Any],
        prepared: dict[str, Any],
        call_key: str | None,
        *,
        request: Any = None,
        alongside: int = 0,
    ) -> CallToolResult:
        """The per-call pipeline (go-brmcp.md §3.6): callKey claim → rate
        limit → price → debit or payment_required → handler. ``alongside``
        is the ``brmcp/payAlongside`` mark (atoms being tipped, 0 = none): an
        underfunded call is then held for the credit
        (WIRE.md §Pay alongside). A charged result carries the receipt ``_meta`` keys
        ``brmcp/chargedAtoms`` and ``brmcp/balanceAtoms`` (WIRE.md §Receipts)."""
        claim: Claim | None = None
        if call_key is not None:
            claim, duplicate = self._calls.claim(peer, call_key)
            if duplicate:
                return await self._calls.wait(claim)
        started = anyio.current_time()
        outcome = "ok"
        try:
            result = await self._execute(peer, spec, arguments, prepared, call_key, claim, request, alongside)
            if result.is_error:
                outcome = "error"
        except _Refused as refusal:
            outcome = _REFUSAL_OUTCOMES.get(refusal.reason, "refused")
            if claim is not None:
                self._calls.release(claim, refusal.reason, refusal.result)
            return refusal.result
        except BaseException:
            outcome = "error"
            if claim is not None and not claim.finished:
                self._calls.release(claim, "the original call was abandoned")
            raise
        finally:
            metrics = self.metrics
            if metrics is not None:
                metrics.calls.labels(spec.name, outcome).inc()
                metrics.call_seconds.labels(spec.name).observe(anyio.current_time() - started)
        return result

    async def _execute(
        self,
        peer: str,
        spec: ToolSpec,
        arguments: dict[str, Any],
        prepared: dict[str, Any],
        call_key: str | None,
        claim: Claim | None,
        request: Any,
        alongside: int = 0,
    ) -> CallToolResult:
        if not self._limiter.take(peer):
            raise _Refused(error_result(RATE_LIMITED_TEXT), "rate limited")
        base = CallContext(peer=peer, tool=spec.name, call_key=call_key, request=request)
        try:
            price = await spec.price_for(base, arguments)
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            raise _Refused(error_result(reason), "price function failed") from None
        call_id = wire.new_id() + wire.new_id()
        charged = 0
        receipt: Receipt | None = None
        if price > 0:
            balance = await self._charge_or_hold(call_id, peer, call_key, spec.name, price, alongside)
            charged = price
            receipt = Receipt(charged_atoms=price, balance_atoms=balance)
        ctx = CallContext(
            peer=peer, tool=spec.name, charged_atoms=charged, call_key=call_key, request=request
        )
        self.executions += 1
        failed = False
        try:
            value = await spec.handler(ctx, prepared)
            result = to_result(value)
            problem = spec.check_output(result)
            if problem is not None:
                failed = True
                result = error_result(problem)
            elif result.is_error:
                failed = True
            elif receipt is not None:
                result = _with_receipt(result, receipt)
            # Serialized here, inside the failure handling: a result that
            # cannot be written must become a refunded failure, not an error
            # escaping after the charge (the key would be released with the
            # debit still open).
            text = _result_json(result) if charged > 0 or claim is not None else None
            if text is not None:
                self._check_deliverable(text, getattr(request, "request_id", None))
        except Exception as exc:
            failed = True
            log.info(
                "tool %s failed for %s: %s", spec.name, peer, exc, exc_info=log.isEnabledFor(logging.DEBUG)
            )
            result = error_result(str(exc) or type(exc).__name__)
            text = None
        except BaseException:
            # Cancelled (the caller gave up): refund and record like a failure.
            with anyio.CancelScope(shield=True):
                await self._settle(
                    call_id, peer, claim, charged, error_result("call cancelled"), True, tool=spec.name
                )
            raise
        with anyio.CancelScope(shield=True):
            await self._settle(call_id, peer, claim, charged, result, failed, text, tool=spec.name)
        return result

    async def _charge_once(self, call_id: str, peer: str, call_key: str | None, tool: str, price: int) -> int:
        """Debit ``price``; returns the balance after the charge, or raises
        :class:`_Refused` (payment_required with the balance, or a ledger
        failure). A negative return value never escapes: an unknown
        balance (external billing) is read again."""
        try:
            with anyio.CancelScope(shield=True):
                ok, balance = await self._accounts.charge(
                    call_id=call_id, peer=peer, call_key=call_key, tool=tool, atoms=price
                )
                if ok and balance < 0:
                    balance = max(0, await self._accounts.balance(peer))
        except Exception as exc:
            log.error("charge of %d atoms to %s failed: %s", price, peer, exc)
            if self.metrics is not None:
                self.metrics.errors.labels("ledger").inc()
            raise _Refused(
                error_result("payment could not be recorded; nothing was charged; retry later"),
                "ledger unavailable",
            ) from None
        if not ok:
            log.info(
                "payment required: %s called %s for %d atoms with a balance of %d", peer, tool, price, balance
            )
            raise _Refused(payment_required_result(tool, price, balance), "payment required")
        if self.metrics is not None:
            self.metrics.charged_atoms.labels(tool).inc(price)
        log.info(
            "charged %d atoms to %s for %s (call %s, balance now %s)",
            price,
            peer,
            tool,
            call_id,
            balance if balance >= 0 else "kept by the billing store",
        )
        return balance

    async def _charge_or_hold(
        self, call_id: str, peer: str, call_key: str | None, tool: str, price: int, alongside: int
    ) -> int:
        """Charge ``price``; with a pay-alongside mark, hold an underfunded
        call until a credit covers it (WIRE.md §Pay alongside): at most
        ``hold_seconds``, at most ``max_held_calls`` per caller, and only
        when the balance plus the announced tip could cover the price.
        Returns the balance after the charge; raises :class:`_Refused` with
        the ordinary ``payment_required`` refusal when it is not held or
        the hold ends unfunded."""
        config = self.config
        holdable = alongside > 0 and config.hold_seconds > 0 and config.max_held_calls > 0
        event = self._credit_event(peer) if holdable else None
        try:
            return await self._charge_once(call_id, peer, call_key, tool, price)
        except _Refused as refusal:
            if event is None or refusal.reason != "payment required":
                raise
            balance = _refusal_balance(refusal)
            if balance + alongside < price or self._held.get(peer, 0) >= config.max_held_calls:
                raise
            first = refusal
        self._held[peer] = self._held.get(peer, 0) + 1
        self.holds += 1
        deadline = anyio.current_time() + config.hold_seconds
        try:
            while True:
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    raise first
                # Only the wait is bounded: a charge never runs under a
                # deadline that could interrupt it after the debit.
                with anyio.move_on_after(min(remaining, _HOLD_RECHECK)):
                    await event.wait()
                event = self._credit_event(peer)
                try:
                    return await self._charge_once(call_id, peer, call_key, tool, price)
                except _Refused as refusal:
                    if refusal.reason != "payment required":
                        raise
                    first = refusal
        finally:
            left = self._held[peer] - 1
            if left:
                self._held[peer] = left
            else:
                del self._held[peer]

    def _check_deliverable(self, text: str, request_id: Any = None) -> None:
        """Raise ValueError when a result's JSON cannot fit in one transport
        message (64 parts of ``chunk_size`` bytes, WIRE.md §Chunking): the
        transport would replace it with an error, so the caller must not be
        charged for it (the failure refunds the price).

        The allowance is the real JSON-RPC response wrapper
        (``{"jsonrpc":"2.0","id":<id>,"result":…}``) for ``request_id`` (the
        longest int64 when unknown), and the part count is what
        :func:`brmcp.wire.encode` would need at this chunk size, so the check
        is exact for every chunk size."""
        chunk_size = self.config.router_options.chunk_size
        limit = wire.MAX_PARTS * chunk_size
        size = len(text.encode()) + response_overhead(request_id if request_id is not None else _WORST_ID)
        if -(-size // chunk_size) > wire.MAX_PARTS:
            raise ValueError(f"result of {size} bytes exceeds the transport limit of {limit} bytes")

    async def _settle(
        self,
        call_id: str,
        peer: str,
        claim: Claim | None,
        charged: int,
        result: CallToolResult,
        failed: bool,
        text: str | None = None,
        *,
        tool: str = "",
    ) -> None:
        """Journal completion (refunding a failed paid call in the same
        transaction) and record the outcome for duplicates. ``text`` is the
        result's JSON when the caller already has it."""
        if charged <= 0 and claim is None:
            return  # a free unkeyed call: nothing to journal or replay
        if text is None:
            text = result.model_dump_json(by_alias=True, exclude_none=True)
        size = len(text.encode())
        if charged > 0:
            try:
                await self._accounts.complete(
                    call_id=call_id,
                    peer=peer,
                    atoms=charged,
                    keyed=claim is not None,
                    expires=self._clock() + REPLAY_WINDOW,
                    outcome_json=text if size <= OUTCOME_CAP else None,
                    refund=failed,
                )
            except Exception as exc:
                # The journal row stays 'charged': the next start refunds it
                # exactly once. The caller still gets its result.
                log.error("could not journal completion of call %s for %s: %s", call_id, peer, exc)
                if self.metrics is not None:
                    self.metrics.errors.labels("ledger").inc()
            else:
                if failed and self.metrics is not None:
                    self.metrics.refunds.labels(tool).inc()
                    self.metrics.refunded_atoms.labels(tool).inc(charged)
                if failed:
                    log.info(
                        "refunded %d atoms to %s (call %s): the call failed: %s",
                        charged,
                        peer,
                        call_id,
                        _first_text(result),
                    )
        if claim is not None:
            self._calls.finish(claim, result, size, text)


def response_overhead(request_id: Any) -> int:
    """Bytes the JSON-RPC response wrapper adds around a result's JSON for a
    request with id ``request_id``, as the transport writes it (compact)."""
    empty = JSONRPCResponse(jsonrpc="2.0", id=request_id, result={})
    return len(empty.model_dump_json(by_alias=True, exclude_unset=True).encode()) - len(b"{}")


def _with_receipt(result: CallToolResult, receipt: Receipt) -> CallToolResult:
    """``result`` with the receipt keys added to its ``_meta`` (WIRE.md §Receipts)."""
    meta = dict(result.meta or {})
    meta.update(receipt.to_meta())
    return result.model_copy(update={"meta": meta})


#: Metric outcomes of the refusal reasons of :class:`_Refused`.
_REFUSAL_OUTCOMES = {"payment required": "payment_required", "rate limited": "rate_limited"}


def _first_text(result: CallToolResult, limit: int = 200) -> str:
    """The first text item of ``result`` (shortened), for a log line."""
    for item in result.content:
        text = getattr(item, "text", None)
        if isinstance(text, str):
            return text if len(text) <= limit else text[:limit] + "…"
    return "no text"


def _refusal_balance(refusal: _Refused) -> int:
    """The ``balanceAtoms`` of a payment_required refusal (0 when unreadable)."""
    found = parse_payment_required(refusal.result)
    return found.balance_atoms if found is not None else 0


def _result_json(result: CallToolResult) -> str:
    """The JSON of a handler's result; TypeError when it cannot be written
    (e.g. bytes that are not UTF-8 in structuredContent)."""
    try:
        return result.model_dump_json(by_alias=True, exclude_none=True)
    except (ValueError, TypeError) as exc:
        raise TypeError(f"tool returned a value that is not JSON: {exc}") from None


def _outcome_json_for_error(text: str) -> str:
    return error_result(text).model_dump_json(by_alias=True, exclude_none=True)


async def _close_abandoned_offer(tap: FirstContactTap, conn: Conn) -> None:
    """Close a session whose marked ``initialize`` was answered when the
    client says nothing more on it within ``OFFER_LINGER`` seconds (it went
    to the modern era on another sid; WIRE.md §Eras)."""
    await tap.offered.wait()
    with anyio.move_on_after(OFFER_LINGER):
        await tap.heard.wait()
        return
    log.debug("session %s: first contact went elsewhere; closing it", conn.session_id)
    conn.close()
