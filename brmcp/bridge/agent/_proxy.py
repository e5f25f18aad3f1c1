"""The local MCP server that mirrors one bot (BRIDGE.md §The payment flow;
the Go reference, karamble/brmcp, ``bridge/session.go``).

Every local HTTP session for a bot talks to the same low-level
:class:`mcp.server.Server` named ``brmcp-<first 8 hex of the uid>``:

* ``tools/list`` is answered from the link's snapshot (no relay traffic);
  tools are mirrored verbatim: name, title, description, input and output
  schemas, annotations and ``_meta`` with the price keys;
* ``tools/call`` runs the payment loop of one logical call
  (:mod:`.payloop`) and returns the bot's result (content,
  structuredContent, isError) unchanged, except for the refusal note
  appended when the bridge declines to pay; while it runs, the bot's
  progress, log messages, sampling and elicitation requests are relayed to
  the calling agent (:mod:`.relay`), and while a payment of the call waits
  for the user's approval an agent that asked for progress is told so every
  :data:`APPROVAL_PROGRESS_INTERVAL` s;
* ``ping`` and ``logging/setLevel`` are answered locally (the level filters
  the relayed log messages of that agent session);
* resources, resource templates, prompts and completions are forwarded
  live, and declared, only when the bot declared them (:mod:`.mirror`).

This module keeps what a logical call is across copies: its callKey (an
agent's re-send of a call it did not receive reuses the earlier copy's, so
the bot runs and charges it at most once; BRIDGE.md §Resumability), what
earlier copies paid, a payment in doubt it counts as its own, and the
tally of every copy it sent (:class:`._exchange.CallTally`): a call that
ended without a result after any copy left keeps its callKey for the
agent's re-send, whichever request of it sent that copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    EmptyResult,
    ListToolsResult,
    PaginatedRequestParams,
    SetLevelRequestParams,
)

from brmcp._ops.clock import Clock
from brmcp.bridge.base import Settings
from brmcp.bridge.links import AgentCall, BotLink, HostOffline, LinkError, strip_reserved_meta, tally_call
from brmcp.bridge.pay import (
    APPROVAL_PROGRESS_INTERVAL,
    APPROVAL_PROGRESS_STEP,
    BOT_REPLAY_SECONDS,
    DAY_SECONDS,
    MAX_PAYMENTS,
    POLL_ATTEMPTS,
    POLL_INTERVAL,
    STATUS_PAID,
    CallBudget,
    Funding,
    InDoubtSpend,
    Listing,
    PaymentLoop,
    Settler,
    arguments_hash,
    listing_of,
)
from brmcp.protocol.payment import REFUSAL_KEY

from ._mirror import Mirror, MirrorServer

# The payment loop's constants (.payloop) stay importable from here.
__all__ = [
    "APPROVAL_PROGRESS_INTERVAL",
    "APPROVAL_PROGRESS_STEP",
    "MAX_PAYMENTS",
    "MAX_RETAINED",
    "POLL_ATTEMPTS",
    "POLL_INTERVAL",
    "RETAIN_SECONDS",
    "BotProxy",
    "strip_reserved_meta",
]

log = logging.getLogger("brmcp.bridge")

#: Seconds the callKey of a call its agent did not receive is kept for a
#: re-send (the harness replays outcomes for at least 30 minutes).
RETAIN_SECONDS = 1800.0
#: Most such keys kept per bot.
MAX_RETAINED = 1024
#: Seconds a call waits, before its callKey is chosen, for an identical call
#: of the same agent session that is still attached to be let go (its
#: connection closing, its cancellation) or to end. An agent that gives up on
#: a call and re-sends it races its own disconnect: the new request can reach
#: the bridge before the old connection's close does (BRIDGE.md
#: §Resumability, "An agent that re-sends a call").
TWIN_GRACE = 1.0


class BotProxy:
    """The mirror server of one bot. ``name`` is the bridge name (the
    refusal-note prefix); payments go through ``settler``; ``clock`` paces
    the credit polls; ``settings`` reads the policy in force (per-call cap,
    mode); ``funding`` pays ahead of need (None: only when the bot asks);
    ``epoch`` is the bridge process's ``brmcp/callerEpoch`` token (WIRE.md
    §Pay alongside; None: a new one), sent with every call. Each logical
    call runs in the proxy's :class:`~.payloop.PaymentLoop`."""

    def __init__(
        self,
        link: BotLink,
        settler: Settler,
        clock: Clock,
        name: str,
        *,
        settings: Callable[[], Settings],
        funding: Funding | None = None,
        epoch: str | None = None,
    ) -> None:
        self.link = link
        self._settler = settler
        self._clock = clock
        self._name = name
        self._settings = settings
        #: How each logical call is sent, paid for and reissued.
        self._payments = PaymentLoop(
            link,
            settler,
            clock,
            name,
            settings=settings,
            funding=funding,
            epoch=epoch if epoch is not None else secrets.token_hex(8),
        )
        #: callKey → what earlier copies of that logical call paid (for a re-send).
        self._budgets: OrderedDict[str, CallBudget] = OrderedDict()
        #: tool → a payment in doubt a call counted and ended without a result
        #: for; once confirmed, the next call of that tool waits for its credit.
        self._landing: dict[str, InDoubtSpend] = {}
        #: (agent session, call fingerprint) → (callKey, expiry) of calls the
        #: agent did not receive.
        self._retained: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self.server = MirrorServer(
            f"brmcp-{link.uid[:8]}",
            link,
            version="1",
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
        )
        # Registered directly: the constructor argument warns that logging is
        # deprecated in 2026-07-28, but handshake-era agents still use it.
        self.server.add_request_handler("logging/setLevel", SetLevelRequestParams, self._on_set_level)
        #: Forwards resources, prompts and completions (when the bot has them).
        self.mirror = Mirror(link)
        self.mirror.register(self.server)

    @property
    def payments(self) -> PaymentLoop:
        """The payment loop every logical call of this bot runs in."""
        return self._payments

    @property
    def epoch(self) -> str:
        """This bridge process's caller epoch (16 hex characters)."""
        return self._payments.epoch

    def stop(self) -> None:
        """The bridge is stopping: every call to this bot ends with an error
        saying so and what was paid for it (:meth:`.PaymentLoop.stop`)."""
        self._payments.stop()

    @property
    def funding(self) -> Funding | None:
        """The known balance, pay alongside and prepay (:mod:`.funding`);
        None: the bridge only pays when the bot asks. Settable."""
        return self._payments.funding

    @funding.setter
    def funding(self, funding: Funding | None) -> None:
        self._payments.funding = funding

    async def _on_list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        # The agent hears about tools/list_changed from now on.
        self.link.subscriptions.watch(ctx)
        tools = self.link.tools
        if tools is None or self.link.stale:
            try:
                tools = await self.link.refresh()
            except LinkError as exc:
                raise MCPError(INTERNAL_ERROR, f"bot unavailable: {exc}") from None
        return ListToolsResult(tools=list(tools))

    async def _on_set_level(
        self, ctx: ServerRequestContext[Any], params: SetLevelRequestParams
    ) -> EmptyResult:
        self.link.relay.set_level(ctx, params.level)
        return EmptyResult()

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        return await self.call(params.name, params.arguments, agent=ctx)

    async def call(
        self, tool: str, arguments: dict[str, Any] | None, *, agent: ServerRequestContext[Any] | None = None
    ) -> CallToolResult:
        """Run one logical call through the payment loop. ``agent`` is the
        agent's request context: the bot's in-call traffic is relayed to it
        and written before the result.

        A tool the snapshot lacks is looked up at the bot first (a bot
        restarted with other tools tells nobody; at most once per
        ``RECHECK_INTERVAL`` s): when the bot lists it now, a free one is
        called; one with a price is refused, since no agent was shown that
        price (the agents get ``notifications/tools/list_changed``, and a
        call after the next ``tools/list`` pays within it).

        Raises :class:`MCPError`: -32602 ``unknown tool "<name>"``, or
        -32602 naming the new price of a tool the bot lists only now; -32603
        for an unreachable bot (also when the look-up failed), the bridge's
        own brclient not connected, or a second transport failure."""
        if self.link.tools is None:
            # First contact: the snapshot request also settles the bot's era.
            try:
                await self.link.refresh()
            except HostOffline as exc:
                raise MCPError(INTERNAL_ERROR, f"{exc}; nothing was paid for this call") from None
            except LinkError as exc:
                raise MCPError(INTERNAL_ERROR, f"bot unavailable: {exc}") from None
        if self.link.tools is not None and self.link.tool(tool) is None:
            if self.link.doubt_tools() or self.link.stale:
                try:
                    await self.link.refresh()
                except HostOffline as exc:
                    raise MCPError(INTERNAL_ERROR, f"{exc}; nothing was paid for this call") from None
                except LinkError as exc:
                    raise MCPError(
                        INTERNAL_ERROR,
                        f'bot unavailable: {exc}; tool "{tool}" is not among the tools it listed before, '
                        "and its list could not be asked for again",
                    ) from None
                spec = self.link.tool(tool)
                if spec is not None and listing_of(spec).kind != "free":
                    raise MCPError(INVALID_PARAMS, new_priced_tool_text(tool, listing_of(spec)))
            if self.link.tool(tool) is None:
                raise MCPError(INVALID_PARAMS, f'unknown tool "{tool}"')
        metrics = self._settler.metrics
        started = anyio.current_time()
        outcome = "failed"
        try:
            # The tally counts every copy of this logical call, to the bot or
            # any pool member, over every request of it (._exchange.CallTally).
            with self.link.relay.track(agent) as tracked, tally_call() as tally:
                await self._await_twins(tool, arguments, tracked)
                key, earlier, reused = self._call_key(tool, arguments, tracked)
                if earlier is not None:
                    # Let the earlier copy finish what it started (a payment in
                    # flight, an execution at the bot) before this one asks.
                    await earlier.ended.wait()
                budget = self._budgets.get(key) if reused else None
                adopted = (
                    None
                    if reused
                    else self._settler.adopt(
                        self.link.uid,
                        tool,
                        newer_than=self._clock.now() - self._settings().tip_wait_secs,
                        scheduled_newer_than=self._clock.now() - DAY_SECONDS,
                        args_hash=arguments_hash(arguments),
                        paid_newer_than=self._clock.now() - BOT_REPLAY_SECONDS,
                    )
                )
                confirmed = False
                if adopted is not None:
                    # A payment to this bot for this tool whose outcome is not
                    # known yet (made before a restart, or its tip wait ran
                    # out): this call counts it as its own and pays no more
                    # until brclient tells its outcome (it waits for that).
                    confirmed = adopted.status == STATUS_PAID
                    if confirmed:
                        # Confirmed already (an earlier process died between
                        # its payment and the result): its credit went to
                        # the bot, where any call may have used it since.
                        # The call takes over its callKey (below) but counts
                        # nothing: the bot answers from its record, or runs
                        # on credit left, and asks for payment only when
                        # none is (then this call pays as any, once).
                        budget = CallBudget(listing_of(self.link.tool(tool)))
                    else:
                        budget = CallBudget(
                            listing_of(self.link.tool(tool)), in_doubt=adopted.atoms, doubt=adopted
                        )
                        budget.add(adopted.atoms)
                    reused = True
                    if adopted.call_key is not None and adopted.args_hash == arguments_hash(arguments):
                        # The same call (bot, tool, arguments): it takes over
                        # that payment's callKey, so a bot that held the call
                        # paid alongside and ran it when the tip landed
                        # answers this one from its record, charging nothing
                        # more, instead of a new key paying and running again.
                        key = adopted.call_key
                        if tracked is not None:
                            tracked.call_key = key
                    log.info(
                        "call of %s on bot %s takes over a payment of %d atoms %s (made %s)",
                        tool,
                        self.link.uid[:8],
                        adopted.atoms,
                        "confirmed before a restart, counting nothing" if confirmed else "in doubt",
                        adopted.ts,
                    )
                landed = self._landing.pop(tool, None) if adopted is None and not reused else None
                if landed is not None and landed.status == "paid":
                    # The payment an earlier call counted while in doubt was
                    # confirmed since: its credit may still be on its way to
                    # the bot, so this call counts it and polls, paying nothing.
                    budget = CallBudget(listing_of(self.link.tool(tool)), landing=True)
                    budget.add(landed.atoms)
                    reused = True
                if budget is None:
                    budget = CallBudget(listing_of(self.link.tool(tool)))
                abandoned = False
                succeeded = False
                answered = False
                try:
                    result = await self._payments.run(
                        tool, arguments, tracked, key, reused=reused, budget=budget
                    )
                    answered = True
                    succeeded = not result.is_error
                    # The bot's own outcome under this key: a result, or a
                    # tool error it keeps (a refunded failure); not a
                    # payment refusal, after which the key has no outcome.
                    final = succeeded or REFUSAL_KEY not in (result.meta or {})
                    if final and not (tracked is not None and (tracked.detached or tracked.gone.is_set())):
                        # Answered (to an agent still there) under this key:
                        # a later identical call is a new call, never this
                        # one's retry, so no spend entry of this key (nor
                        # the adopted one) is taken over again, even while
                        # its tip is still in doubt; else the bot would
                        # answer that call with this stored outcome (a
                        # result uncharged, or that call's refunded failure
                        # again and again). Written before it leaves.
                        with anyio.CancelScope(shield=True):
                            if adopted is not None:
                                await self._settler.mark_answered(adopted)
                            await self._settler.mark_call_answered(key)
                except anyio.get_cancelled_exc_class():
                    abandoned = True  # the agent cancelled (or its session ended)
                    raise
                except MCPError:
                    if tracked is not None:
                        await tracked.settle()
                    raise
                finally:
                    if adopted is not None and not succeeded:
                        self._settler.release_adopted(adopted)
                        if not confirmed:
                            # Counted while in doubt: once confirmed, its
                            # credit may still be on its way to the bot.
                            self._landing[tool] = adopted
                        while len(self._landing) > MAX_RETAINED:
                            self._landing.pop(next(iter(self._landing)))
                    if budget.payments:
                        self._budgets[key] = budget
                        self._budgets.move_to_end(key)
                        while len(self._budgets) > MAX_RETAINED:
                            self._budgets.popitem(last=False)
                    # No result reached the agent although a copy of the call
                    # left (in any request of it, to any member): the bot may
                    # run it, or still be running it, so the agent's re-send
                    # keeps this callKey and is never run nor charged again.
                    unknown = tracked is not None and (tracked.unknown or (not answered and tally.copies > 0))
                    if tracked is not None and (
                        abandoned or tracked.detached or tracked.gone.is_set() or unknown
                    ):
                        self._retain(tracked, key)
                if tracked is not None:
                    await tracked.settle()
                outcome = "tool_error" if result.is_error else "ok"
                return result
        finally:
            if metrics is not None:
                metrics.calls.labels(tool, outcome).inc()
                metrics.call_seconds.observe(anyio.current_time() - started)
                if outcome == "failed":
                    metrics.errors.labels("call").inc()

    async def _await_twins(
        self, tool: str, arguments: dict[str, Any] | None, tracked: AgentCall | None
    ) -> None:
        """Wait at most :data:`TWIN_GRACE` s (on the bridge's clock) while an
        identical call of the same agent session is still attached and in
        flight: if the agent let it go, this call is its re-send and takes
        its callKey over; if it is still live after the grace, the two are
        independent calls."""
        if tracked is None or not isinstance(tracked.agent, str):
            return
        mark = _fingerprint(tool, arguments)
        twins = [
            call
            for call in self.link.relay.calls_of(tracked.agent)
            if call is not tracked
            and call.fingerprint == mark
            and not (call.detached or call.gone.is_set() or call.ended.is_set())
        ]
        if not twins:
            return
        async with anyio.create_task_group() as tg:

            async def grace() -> None:
                await self._clock.sleep(TWIN_GRACE)
                tg.cancel_scope.cancel()

            async def let_go(call: AgentCall) -> None:
                async with anyio.create_task_group() as inner:

                    async def ended() -> None:
                        await call.ended.wait()
                        inner.cancel_scope.cancel()

                    async def gone() -> None:
                        while not (call.detached or call.gone.is_set()):
                            await call.gone.changed()
                        inner.cancel_scope.cancel()

                    inner.start_soon(ended)
                    inner.start_soon(gone)

            async def all_let_go() -> None:
                async with anyio.create_task_group() as each:
                    for call in twins:
                        each.start_soon(let_go, call)
                tg.cancel_scope.cancel()

            tg.start_soon(grace)
            tg.start_soon(all_let_go)

    def _call_key(
        self, tool: str, arguments: dict[str, Any] | None, tracked: AgentCall | None
    ) -> tuple[str, AgentCall | None, bool]:
        """The callKey of a new logical call: a fresh one, unless the same
        agent session re-sends a call (same tool, same arguments) whose
        earlier copy it did not receive (its connection closed, or it
        cancelled): that copy's key, so the bot runs and charges it at most
        once and replays its outcome (BRIDGE.md §Resumability). Returns the
        key, the earlier copy still in flight, if any, and whether the key
        is an earlier copy's."""
        fresh = secrets.token_hex(16)
        if tracked is None or not isinstance(tracked.agent, str):
            return fresh, None, False
        mark = _fingerprint(tool, arguments)
        tracked.fingerprint = mark
        for earlier in self.link.relay.calls_of(tracked.agent):
            if (
                earlier is not tracked
                and earlier.fingerprint == mark
                and (earlier.detached or earlier.gone.is_set())
            ):
                # The earlier copy stops paying and running; this one takes over.
                earlier.gone.set()
                earlier.fingerprint = None
                tracked.call_key = earlier.call_key
                return earlier.call_key, earlier, True
        now = anyio.current_time()
        while self._retained and next(iter(self._retained.values()))[1] < now:
            self._retained.popitem(last=False)
        kept = self._retained.pop((tracked.agent, mark), None)
        key = kept[0] if kept is not None else fresh
        tracked.call_key = key
        return key, None, kept is not None

    def _retain(self, tracked: AgentCall, key: str) -> None:
        """Remember the key of a call its agent did not receive, for a re-send."""
        if not isinstance(tracked.agent, str) or tracked.fingerprint is None:
            return
        self._retained[(tracked.agent, tracked.fingerprint)] = (key, anyio.current_time() + RETAIN_SECONDS)
        self._retained.move_to_end((tracked.agent, tracked.fingerprint))
        while len(self._retained) > MAX_RETAINED:
            self._retained.popitem(last=False)


def new_priced_tool_text(tool: str, listing: Listing) -> str:
    """The refusal of a call to a tool with a price that the bot lists only
    since the call looked it up (BRIDGE.md §Eras and snapshots): the agent
    was shown no price for it, so nothing is paid until it lists again."""
    return (
        f'tool "{tool}" was not in the tool list this bridge served; the bot lists it now '
        f"({listing.describe()} per call). Nothing was sent to the bot or paid: list the tools again "
        "(tools/list) to see it and its price, then call it"
    )


def _fingerprint(tool: str, arguments: dict[str, Any] | None) -> str:
    """What makes two calls "the same call": tool name and arguments."""
    text = json.dumps([tool, arguments or {}], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
