"""The serving harness: priced MCP tools for allowed BR peers, paid from a
prepaid ledger funded by tips, each keyed call executed and charged at most
once (WIRE.md §Payments, §callKey); plus a free catalog of
resources, prompts and completions (:mod:`.catalog`, not in the Go harness).

This module holds :class:`Harness` itself: admission, the tool registry,
the lifecycle (serving sessions, first contact), the money entry points
(balances, credits, tips) and the MCP handlers. The rest lives beside it:
:mod:`.config` (:class:`HarnessConfig`, :class:`HarnessError`),
:mod:`._pipeline` (each call's claim, charge, hold, execution and
settlement), :mod:`._catalog_api` (the resource, prompt and completion
methods), :mod:`.firstcontact`, :mod:`.catalog` and :mod:`._accounts`.
Every name once defined here is still importable from here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    ToolAnnotations,
)
from mcp_types.version import LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from .. import wire
from ..protocol.eras import CAPABILITIES_META_KEY
from ..protocol.payment import MARKS_REFUSALS_KEY, caller_epoch, pay_alongside_atoms
from ..transport.conn import Conn
from ..transport.router import Router

if TYPE_CHECKING:
    from ..metrics import ServeMetrics
from ..transport.sender import PMSender
from . import store
from ._accounts import Accounts
from ._catalog_api import CatalogMethods
from ._guard import tool_error
from ._pipeline import OUTCOME_CAP, CallPipeline, outcome_json_for_error, response_overhead
from .callkeys import REPLAY_WINDOW, CallKeyRegistry, valid_call_key
from .catalog import Catalog
from .config import HOLD_SECONDS, MAX_HELD_CALLS, HarnessConfig, HarnessError
from .context import peer_of
from .firstcontact import MODERN_VERSIONS_KEY, OFFER_LINGER, TOOLS_KEY, FirstContactTap
from .ratelimit import RATE_LIMITED_TEXT, RateLimiter
from .store import HeldTip, JournalEntry, StatementEntry, StoreError
from .tools import Handler, PriceFunc, ToolArgumentError, ToolSpec, spec_from_function

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
    "valid_call_key",
]

log = logging.getLogger("brmcp.server")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: Refused peers are logged at most this often (seconds), remembering this many.
_DENIED_WARN_INTERVAL = 600.0
_DENIED_WARN_MEMORY = 1024


class Harness(CatalogMethods):
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
        #: Senders with tips held because they were not allowed (WIRE.md
        #: §Payments, "Tips from senders not allowed"); loaded on entry.
        self._held_peers: set[str] = set()

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
        """The ``_meta`` entries of a marked ``initialize`` answer for ``peer``;
        its ``brmcp/tools`` says ``brmcp/marksRefusals`` as ``tools/list``
        does (WIRE.md §Payments, "Genuine refusals")."""
        tools = [spec.to_tool() for spec in self._tools.values() if self._visible(peer, spec.name)]
        listed = ListToolsResult(tools=tools, _meta={MARKS_REFUSALS_KEY: True}).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
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
        self._pipeline.credited(peer)

    async def credit_tip(self, peer: str, amount_matoms: int, sequence_id: int) -> int:
        """Credit a received tip: milliatoms floored to atoms, only for
        allowed peers, once per tip (sequence id, sender and amount recorded
        in the same transaction as the credit, so a redelivered tip never
        credits twice, even across a crash). Returns the atoms credited (0
        for replays, non-allowed senders and amounts under 1000 matoms). A
        tip of at least one atom from a sender not allowed is held, in that
        same transaction, and credited once when the sender is allowed
        (:meth:`release_held_tips`; WIRE.md §Payments, "Tips from senders
        not allowed")."""
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
        new, credited = outcome
        if new and not allowed and amount_matoms >= 1000:
            self._held_peers.add(peer)
            log.info(
                "holding %s atoms of tip %d from %s, a sender not allowed, until it is allowed",
                f"{amount_matoms // 1000:,}",
                sequence_id,
                peer,
            )
        if credited > 0:
            self._pipeline.credited(peer)
        if allowed and peer in self._held_peers:
            try:
                await self.release_held_tips(peer)
            except Exception as exc:  # this tip is recorded; the held ones stay held
                log.error("tips held for %s not credited now: %s", peer, exc)
        return outcome

    async def release_held_tips(self, peer: str | None = None) -> int:
        """Credit the tips held for senders not allowed when they arrived
        (WIRE.md §Payments, "Tips from senders not allowed") to those of
        them allowed now: ``peer`` only, or (None) every sender with held
        tips, read from the ledger. Each tip is credited exactly once, as a
        ``tip`` movement under its own ref in one transaction that also
        drops it from the held tips, however often and concurrently this
        runs. Returns the atoms credited by this call. The harness runs it
        on entry, before a ``tools/call`` of a sender with held tips and
        after a tip from such a sender. Raises what the ledger raises
        (nothing is lost: the tips stay held)."""
        if peer is None:
            peers = await self._accounts.held_peers()
            self._held_peers.update(peers)  # a union: a tip held meanwhile stays known
        else:
            peers = [peer] if peer in self._held_peers else []
        total = 0
        for who in peers:
            if not self.allowed(who):
                continue
            with anyio.CancelScope(shield=True):
                atoms = await self._accounts.release_held(who)
                if not await self._accounts.held_tips(who):
                    self._held_peers.discard(who)
            if atoms > 0:
                log.info("credited %s atoms of tips held for %s, which is allowed now", f"{atoms:,}", who)
                metrics = self.metrics
                if metrics is not None:
                    metrics.tip_atoms.inc(atoms)
                self._pipeline.credited(who)
            total += atoms
        return total

    async def held_tips(self, peer: str | None = None) -> list[HeldTip]:
        """The tips held now for senders not allowed (of ``peer``, or of
        everyone), oldest first (:class:`~.store.HeldTip`: atoms > 0)."""
        return await self._accounts.held_tips(peer)

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
        # Every answer says that this harness marks its genuine refusals
        # (WIRE.md §Payments, "Genuine refusals").
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return ListToolsResult(tools=tools, _meta={MARKS_REFUSALS_KEY: True})
        # A modern caller skipped server/discover: state the capabilities
        # here so it needs no second round trip (WIRE.md §Eras). What
        # initialize would declare: the modern era's own flags drop subscribe
        # and listChanged, which a bridge needs to pick the era.
        declared = self._server.get_capabilities(
            self._notifications(), protocol_version=LATEST_HANDSHAKE_VERSION
        )
        stated = declared.model_dump(by_alias=True, mode="json", exclude_none=True)
        return ListToolsResult(tools=tools, _meta={CAPABILITIES_META_KEY: stated, MARKS_REFUSALS_KEY: True})

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        peer = peer_of(ctx)
        # A new caller process drops the calls its predecessor left held
        # (WIRE.md §Pay alongside), whatever this call turns out to be.
        epoch = caller_epoch(params.meta)
        self._pipeline.observe_epoch(peer, epoch)
        spec = self._tools.get(params.name)
        if spec is None or not self._visible(peer, params.name):
            raise MCPError(code=INVALID_PARAMS, message=f'unknown tool "{params.name}"')
        arguments = params.arguments or {}
        try:
            prepared = spec.validate(arguments)
        except ToolArgumentError as exc:
            return tool_error(str(exc))
        if peer in self._held_peers:
            try:
                await self.release_held_tips(peer)
            except Exception as exc:  # the call goes on; the tips stay held
                log.error("tips held for %s not credited now: %s", peer, exc)
        key = valid_call_key(params.meta)
        alongside = pay_alongside_atoms(params.meta)
        return await self.call(
            peer, spec, arguments, prepared, key, request=ctx, alongside=alongside, epoch=epoch
        )

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
