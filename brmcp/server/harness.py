"""The serving harness: priced MCP tools for allowed BR peers, paid from a
prepaid ledger funded by tips, each keyed call executed and charged at most
once (WIRE.md §Payments, §callKey); plus a free catalog of
resources, prompts and completions (:mod:`.catalog`, not in the Go harness).

This module holds :class:`Harness` itself: admission, the tool registry,
the lifecycle (serving sessions, first contact) and the MCP handlers. Its
money entry points (balances, credits, tips) are :mod:`._money`'s and its
catalog methods :class:`~.catalog.CatalogMethods`, both mixed into the
class so they stay methods of :class:`Harness`. The rest lives beside it,
owned by the harness: :mod:`.config` (:class:`HarnessConfig`,
:class:`HarnessError`), :mod:`._pipeline` (each call's claim, charge,
execution and settlement; the pay-alongside hold is :mod:`._holds`),
:mod:`.catalog` (resources, prompts and completions: the harness's
catalog methods delegate to its :class:`~.catalog.Catalog`),
:mod:`._runs` (the harness's own tasks: keyed calls' runs, the lease beat),
:mod:`.firstcontact` and :mod:`._accounts`. Every name once defined here is
still importable from here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import anyio
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
)
from mcp_types.version import LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from ..protocol.eras import CAPABILITIES_META_KEY
from ..protocol.payment import MARKS_REFUSALS_KEY, caller_epoch, pay_alongside_atoms
from ..protocol.receipts import RECEIPT_KEY_META
from ..transport.conn import Conn
from ..transport.router import Router

if TYPE_CHECKING:
    from ..metrics import ServeMetrics
from brmcp.server.calls import (
    CURRENT_SESSION,
    OUTCOME_CAP,
    REPLAY_WINDOW,
    Accounts,
    CallKeyRegistry,
    CallPipeline,
    ReceivedTips,
    SessionWatch,
    call_key_from_meta,
    heartbeat,
    outcome_json_for_error,
    response_overhead,
    tool_error,
)
from brmcp.server.catalog import (
    Catalog,
    CatalogMethods,
    Handler,
    ToolArgumentError,
    ToolFields,
    Toolset,
    ToolSpec,
    peer_of,
)
from brmcp.server.ratelimit import RATE_LIMITED_TEXT, RateLimiter

from ..protocol.toolerrors import internal_error_text
from ..transport.sender import PMSender
from ._money import MoneyMethods
from ._tracing import span_only_when_traced
from .config import HOLD_SECONDS, MAX_HELD_CALLS, HarnessConfig, HarnessError
from .firstcontact import MODERN_VERSIONS_KEY, OFFER_LINGER, TOOLS_KEY, FirstContactTap, close_abandoned_offer
from .pool import pool_meta
from .store import JournalEntry, StoreError
from .store.journal import HEARTBEAT_INTERVAL

__all__ = [
    "HOLD_SECONDS",
    "MAX_HELD_CALLS",
    "OFFER_LINGER",
    "OUTCOME_CAP",
    "RATE_LIMITED_TEXT",
    "Harness",
    "HarnessConfig",
    "HarnessError",
    "response_overhead",
]

log = logging.getLogger("brmcp.server")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
T = TypeVar("T")

#: Refused peers are logged at most this often (seconds), remembering this many.
_DENIED_WARN_INTERVAL = 600.0
_DENIED_WARN_MEMORY = 1024


class Harness(CatalogMethods, MoneyMethods):
    """Serve MCP tools to allowed BR peers and charge per call; optionally
    also free resources, resource templates, prompts and completions
    (:meth:`resource`, :meth:`resource_template`, :meth:`prompt`,
    :meth:`completion` and their ``add_*`` forms, delegated to the harness's
    :class:`~.catalog.Catalog`; brmcp/server/catalog/_catalog.py).

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
        try:
            self._accounts = Accounts(config.data_dir, config.billing, config.clock, config.store)
        except (ValueError, StoreError) as exc:
            raise HarnessError(str(exc)) from None
        if config.pool is not None and (not self._accounts.shared or config.receipt_signer is None):
            self._accounts.close()
            raise HarnessError(
                f"brmcp: pool {config.pool.id!r}: members share one book and one receipt key: set store to a "
                "PostgreSQL URL and give every member the same receiptkey.json"
            )
        try:
            self._limiter = RateLimiter(config.calls_per_minute if config.calls_per_minute > 0 else 30)
        except ValueError as exc:
            raise HarnessError(str(exc)) from None
        self._allowed = frozenset(config.allowed_peers)
        self._allow_fn = config.allow
        self._denied_warned: dict[str, float] = {}
        #: The tools (registration and what each caller sees of them).
        self._tools = Toolset(config)
        self._calls = CallKeyRegistry(window=REPLAY_WINDOW, clock=config.clock)
        self._catalog = Catalog(self._limiter)
        self._result_meta: dict[str, dict[str, Any]] = {}
        self._server: Server[Any] = Server(
            config.name,
            version=config.version,
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
            lifespan=self._catalog.connection_scope,
        )
        span_only_when_traced(self._server)
        self._catalog.bind(self._server)
        self._stack: AsyncExitStack | None = None
        self._router: Router | None = None
        #: Each call's claim, charge (or pay-alongside hold), run and settlement.
        self._pipeline = CallPipeline(config, self._accounts, self._limiter, self._calls, config.clock)
        try:
            loaded = self._accounts.reconcile(REPLAY_WINDOW, outcome_json_for_error)
        except StoreError as exc:
            self._accounts.close()
            raise HarnessError(str(exc)) from None
        except Exception as exc:
            self._accounts.close()
            raise HarnessError(f"cannot reconcile the ledger database: {exc}") from exc
        self._load_journal(loaded)
        #: Received tips, and those held for senders not allowed.
        self._tips = ReceivedTips(
            self._accounts, self.allowed, self._pipeline.credited, lambda: self.metrics, self._tip_member
        )

    def _tip_member(self) -> str | None:
        """``""`` outside a pool; in one, this member's own uid (its receipt
        signer's ``bot``), None while it is not known (WIRE.md §Pools, "Tips")."""
        if self.config.pool is None:
            return ""
        signer = self.config.receipt_signer
        return signer.bot.lower() if signer is not None and signer.bot else None

    def _load_journal(self, entries: Iterable[JournalEntry]) -> None:
        for entry in entries:
            outcome = None
            if entry.outcome is not None:
                try:
                    outcome = CallToolResult.model_validate(entry.outcome)
                except ValueError:
                    outcome = None
            self._calls.load(entry.peer, entry.call_key, outcome, entry.expires, 0)

    @property
    def metrics(self) -> ServeMetrics | None:
        """Prometheus metrics to update (:class:`brmcp.metrics.ServeMetrics`),
        or None (the default); assignable at any time."""
        return self._pipeline.metrics

    @metrics.setter
    def metrics(self, metrics: ServeMetrics | None) -> None:
        self._pipeline.metrics = metrics

    @property
    def executions(self) -> int:
        """Handler invocations so far (for tests and metrics)."""
        return self._pipeline.executions

    @property
    def holds(self) -> int:
        """Calls that were held at least once for a pay-alongside credit
        (observability and tests)."""
        return self._pipeline.holds

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
        """Replace the allowlist at run time (ignored while ``allow`` is set).
        Tips held for a sender allowed now are credited at that sender's
        next ``tools/call`` or tip, at the next start, or at once by
        ``await`` :meth:`release_held_tips` (brmcp-serve's reload does)."""
        self._allowed = frozenset(peers)

    def set_calls_per_minute(self, per_minute: int) -> None:
        """Change the rate limit at run time; ``<= 0`` selects 30."""
        self._limiter.per_minute = per_minute if per_minute > 0 else 30

    @property
    def calls_per_minute(self) -> int:
        return self._limiter.per_minute

    def take_call_token(self, peer: str) -> bool:
        """Take one token from ``peer``'s rate-limit bucket (as each
        tools/call, resources/read and prompts/get does); False when the
        caller is over its limit."""
        return self._limiter.take(peer)

    @property
    def server(self) -> Server[Any]:
        """The MCP SDK server that serves every session."""
        return self._server

    @property
    def database_path(self) -> str | None:
        return None if self._accounts.path is None else str(self._accounts.path)

    # -- tools -----------------------------------------------------------------------

    def tool(
        self, name: str | None = None, *, description: str | None = None, **fields: Unpack[ToolFields]
    ) -> Callable[[F], F]:
        """Decorator registering ``async def f(ctx: CallContext, ...)`` as a
        tool: input schema from the type hints, name and description from
        the function unless given (:meth:`._toolset.Toolset.tool`).
        ``fields`` (:class:`~.tools.ToolFields`): ``price_atoms`` is a fixed
        price in atoms; ``price(ctx, args) -> atoms`` makes it dynamic."""
        return self._tools.tool(name, description=description, **fields)

    def add_tool(
        self,
        name: str,
        handler: Handler,
        *,
        description: str | None,
        input_schema: dict[str, Any],
        **fields: Unpack[ToolFields],
    ) -> None:
        """Register a tool with an explicit JSON Schema; ``handler(ctx,
        args)`` returns a dict (structured result), a str, or a
        CallToolResult; ``fields`` are :class:`~.tools.ToolFields`. Raises
        ValueError for an invalid schema, a negative price or a duplicate
        name."""
        self._tools.add_tool(name, handler, description=description, input_schema=input_schema, **fields)

    def add_tool_spec(self, spec: ToolSpec, *, replace: bool = False) -> None:
        """Register a prepared :class:`~.tools.ToolSpec`; with ``replace``
        an existing tool of that name is replaced (calls already running
        finish with the old spec). Raises ValueError for a duplicate name
        without ``replace``."""
        self._tools.add_spec(spec, replace=replace)

    def set_result_meta(self, tool: str, meta: dict[str, Any]) -> None:
        """Operator-declared ``_meta`` entries added to every successful
        ``tools/call`` result of ``tool`` (empty: none). They come from the
        operator, never from the tool's output (which the pipeline cleans of
        ``brmcp/`` keys), so they may use that namespace; the harness's own
        keys (receipts) win over them."""
        if meta:
            self._result_meta[tool] = dict(meta)
        else:
            self._result_meta.pop(tool, None)

    def remove_tool(self, name: str) -> bool:
        """Unregister ``name`` (absent from the next tools/list, unknown to
        the next tools/call; running calls finish). Returns whether it existed."""
        return self._tools.remove(name)

    def tools(self) -> list[ToolSpec]:
        """The registered tools, in registration order."""
        return self._tools.specs()

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> Harness:
        if self._stack is not None:
            raise RuntimeError("Harness already entered")
        self._stack = AsyncExitStack()
        await self._stack.__aenter__()
        try:
            recovered = await self._accounts.reconcile_external(REPLAY_WINDOW, outcome_json_for_error)
        except BaseException:
            stack, self._stack = self._stack, None
            await stack.aclose()
            raise
        self._load_journal(recovered)
        if self._accounts.shared:
            # A shared book (WIRE.md §Pools): this process's lease beats
            # while it serves; the task ends with the harness. (Only then a
            # task group here: harnesses entered one inside another's life
            # and left in any order must not nest cancel scopes.)
            tasks = await self._stack.enter_async_context(anyio.create_task_group())
            self._stack.callback(tasks.cancel_scope.cancel)
            timer = self.config.timer
            beat = functools.partial(self._accounts.heartbeat, REPLAY_WINDOW, outcome_json_for_error)
            tasks.start_soon(
                heartbeat, beat, anyio.sleep if timer is None else timer.sleep, HEARTBEAT_INTERVAL
            )
        try:
            await self.release_held_tips()
        except Exception as exc:  # they stay held: credited at the sender's next contact or start
            log.error("tips held for senders not allowed not credited at start: %s", exc)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        self._router = None
        self._pipeline.runs.stop()  # the sessions closed from here on are ended, not lost
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
        # Keyed calls' runs go in the router's task group, beside the
        # sessions (not inside one): a lost session does not cancel them,
        # and they end with the router (cancelled, refunded, journaled).
        self._stack.callback(self._pipeline.runs.bind, None)
        await self._stack.enter_async_context(router)
        self._pipeline.runs.bind(router.task_group)
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
        # Its request handlers see the session (CURRENT_SESSION): whether it
        # was lost or the peer cancelled decides a keyed run's fate (._runs).
        watch = SessionWatch(conn)
        token = CURRENT_SESSION.set(watch)
        tap = FirstContactTap(
            watch.watch(conn.read_stream), conn.write_stream, lambda: self._first_contact(conn.peer)
        )
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(close_abandoned_offer, tap, conn, self.config.timer)
                await server.run(tap.read_stream, tap.write_stream, options)
                tg.cancel_scope.cancel()
        finally:
            CURRENT_SESSION.reset(token)

    def _first_contact(self, peer: str) -> dict[str, Any]:
        """The ``_meta`` entries of a marked ``initialize`` answer for ``peer``;
        its ``brmcp/tools`` says ``brmcp/marksRefusals`` as ``tools/list``
        does (WIRE.md §Payments, "Genuine refusals")."""
        tools = self._tools.listed(peer)
        listed = ListToolsResult(tools=tools, _meta=self._list_meta()).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
        return {MODERN_VERSIONS_KEY: list(MODERN_PROTOCOL_VERSIONS), TOOLS_KEY: listed} | self._key_meta()

    def _key_meta(self) -> dict[str, Any]:
        """``{"brmcp/receiptKey": hex}`` with a receipt signer, else ``{}``
        (WIRE.md §Signed receipts); with a ``pool`` also ``brmcp/pool``
        (:func:`.pool.pool_meta`, WIRE.md §Pools)."""
        signer = self.config.receipt_signer
        if signer is None:
            return {}
        meta: dict[str, Any] = {RECEIPT_KEY_META: signer.public_hex}
        pool = self.config.pool
        # A member announces its pool (WIRE.md §Pools) once it knows its own
        # uid and that uid is a member; never for a uid it is not.
        if pool is not None and signer.bot and signer.bot.lower() in pool.members:
            meta |= pool_meta(pool, signer.public_hex)
        return meta

    def _list_meta(self) -> dict[str, Any]:
        """The ``_meta`` of every ``tools/list`` answer: the refusal mark
        (WIRE.md §Payments, "Genuine refusals") and the receipt key."""
        return {MARKS_REFUSALS_KEY: True} | self._key_meta()

    # -- MCP handlers ----------------------------------------------------------------------

    async def _on_list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        peer = peer_of(ctx)
        if self.config.tools_list_changed:
            self._catalog.remember(ctx)
        tools = self._tools.listed(peer)
        # Every answer says that this harness marks its genuine refusals
        # (WIRE.md §Payments, "Genuine refusals").
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return ListToolsResult(tools=tools, _meta=self._list_meta())
        # A modern caller skipped server/discover: state the capabilities
        # here so it needs no second round trip (WIRE.md §Eras). What
        # initialize would declare: the modern era's own flags drop subscribe
        # and listChanged, which a bridge needs to pick the era.
        declared = self._server.get_capabilities(
            self._notifications(), protocol_version=LATEST_HANDSHAKE_VERSION
        )
        stated = declared.model_dump(by_alias=True, mode="json", exclude_none=True)
        return ListToolsResult(tools=tools, _meta={CAPABILITIES_META_KEY: stated} | self._list_meta())

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        # The SDK would answer an escaping exception with str(exc) (a JSON-RPC
        # error); a peer gets the short internal-error text instead (WIRE.md
        # §Errors). Money is settled inside the pipeline either way.
        try:
            return await self._answer_call_tool(ctx, params)
        except MCPError:
            raise
        except Exception as exc:
            raise MCPError(code=INTERNAL_ERROR, message=internal_error_text(params.name, exc, log)) from None

    async def _answer_call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        peer = peer_of(ctx)
        # A new caller process drops the calls its predecessor left held
        # (WIRE.md §Pay alongside), whatever this call turns out to be.
        epoch = caller_epoch(params.meta)
        self._pipeline.observe_epoch(peer, epoch)
        spec = self._tools.lookup(peer, params.name)
        if spec is None:
            raise MCPError(code=INVALID_PARAMS, message=f'unknown tool "{params.name}"')
        arguments = params.arguments or {}
        try:
            prepared = spec.validate(arguments)
        except ToolArgumentError as exc:
            return tool_error(str(exc))
        await self._tips.release_before_call(peer)
        key = call_key_from_meta(params.meta)
        alongside = pay_alongside_atoms(params.meta)
        result = await self.call(
            peer, spec, arguments, prepared, key, request=ctx, alongside=alongside, epoch=epoch
        )
        extra = self._result_meta.get(spec.name)
        if extra and not result.is_error:
            result = result.model_copy(update={"meta": extra | (result.meta or {})})
        return result

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
        epoch: str | None = None,
    ) -> CallToolResult:
        """The per-call pipeline (WIRE.md §Payments, server order): callKey claim → rate
        limit → price → debit or payment_required → handler. ``alongside``
        is the ``brmcp/payAlongside`` mark (atoms being tipped, 0 = none): an
        underfunded call is then held for the credit
        (WIRE.md §Pay alongside). ``epoch`` is the caller's
        ``brmcp/callerEpoch`` (None = none): a new one drops that caller's
        calls held under another, uncharged, before this call claims its key.
        A charged result carries the receipt ``_meta`` keys
        ``brmcp/chargedAtoms`` and ``brmcp/balanceAtoms`` (WIRE.md §Receipts);
        a refunded one ``brmcp/refundedAtoms`` and ``brmcp/balanceAtoms``.
        See :class:`._pipeline.CallPipeline`."""
        return await self._pipeline.call(
            peer, spec, arguments, prepared, call_key, request=request, alongside=alongside, epoch=epoch
        )
