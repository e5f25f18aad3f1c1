"""The payment loop of one logical call (BRIDGE.md §The payment flow; the Go
reference, karamble/brmcp, ``bridge/session.go``): how a ``tools/call`` the
mirror server of a bot (:mod:`.proxy`) took is sent, paid for and reissued.

1. the bridge mints one callKey (16 random bytes as 32 hex) and sends it on
   every reissue and re-sent copy, with this process's ``brmcp/callerEpoch``;
   the agent's own ``_meta`` is not forwarded;
2. every request is sent by :meth:`BotLink.exchange` (:mod:`._sending`): re-sent on an
   RTT-sized backoff until a reply or its deadline (the message TTL); at the
   deadline the agent gets a JSON-RPC error saying what was paid;
3. a refusal is taken only when it is one: refusal-shaped output of a bot
   that marks its genuine refusals (``brmcp/refusal``) is the tool's output;
4. the call's hard bound (:mod:`.budget`) judges the refusal against the
   listing the agent was shown (free tools and other tools' refusals are
   never paid; a fixed price is never exceeded; the per-call cap covers the
   whole call), then :meth:`Settler.settle` applies the caps, the day total
   and approval; a refusal appends ``<name>: payment not made: <reason>``;
   success reissues;
5. ``payment_required`` after paying is polled: up to 6 reissues after the
   payment with 3 s waits between them (5 waits); if the bot still asks, a
   call in autopay mode ends with a note (one payment per logical call), and
   in approval mode the user may approve a further payment, at most
   :data:`MAX_PAYMENTS` in all. The bot's refusal is never returned bare
   after the bridge paid;
6. every result after which atoms moved tells the agent what was paid,
   charged or refunded and the credit left at the bot (a text item and
   ``_meta`` ``brmcp/paidAtoms``).

While a payment of the call waits for the user's approval, an agent that
asked for progress is told so every :data:`APPROVAL_PROGRESS_INTERVAL` s
(:meth:`._decide.Decider.approval_progress`). A payment may go out alongside the
call's first send, or a prepayment be waited for (:mod:`.funding`). In
autopay mode one payment to a bot is in flight at a time: a call that would
pay while another call's payment decides waits for that call's answer, then
pays what the credit then known leaves short, or nothing (:mod:`.funding`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any, cast

import anyio
import jsonschema
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    RequestParamsMeta,
    TextContent,
)

from brmcp._ops.clock import Clock
from brmcp.bridge.base import Settings
from brmcp.bridge.links import (
    ERA_MODERN,
    AgentCall,
    BotLink,
    DeadlineError,
    HostOffline,
    LinkError,
)
from brmcp.protocol.payment import (
    CALL_KEY,
    CALLER_EPOCH_KEY,
    PAY_ALONGSIDE_KEY,
    REFUSAL_KEY,
    PaymentRequired,
    parse_payment_required,
    parse_receipt,
    payment_required_result,
)

from ._approvals import call_arguments
from ._budget import CallBudget, listing_of
from ._decide import APPROVAL_PROGRESS_INTERVAL, APPROVAL_PROGRESS_STEP, MAX_PAYMENTS, Covered, Decider
from ._funding import Funding
from ._money import already, charged, spent, with_money
from ._money import refunded as refunded_of
from ._pools import Pools
from ._sending import (
    Alongside,
    RequestSender,
    Withdrawn,
    asks_to_retry,
    clean_result,
    needs_back_channel,
    with_key,
    with_meta,
)
from ._settle import Settler
from ._shares import Share
from ._spend import arguments_hash

__all__ = [
    "APPROVAL_PROGRESS_INTERVAL",
    "APPROVAL_PROGRESS_STEP",
    "CONFIRM_WAIT",
    "MAX_DUPLICATE_RETRIES",
    "MAX_PAYMENTS",
    "POLL_ATTEMPTS",
    "POLL_INTERVAL",
    "STOPPING",
    "PaymentLoop",
]

log = logging.getLogger("brmcp.bridge")

#: Seconds between reissues while a payment's credit lands at the bot.
POLL_INTERVAL = 3.0
#: Reissues after each payment (with :data:`POLL_INTERVAL` waits between
#: them) before the call goes round the payment loop again.
POLL_ATTEMPTS = 6

#: Seconds a result the bot charged waits for the confirmation of the
#: payment made alongside it, so its money note says "paid".
CONFIRM_WAIT = 5.0
#: Most such answers one call takes before returning one to the agent.
MAX_DUPLICATE_RETRIES = 8


#: Most such reissues of one call before it pays as asked.
_MAX_COVERED = 2

#: The error of a call in flight when the bridge stops (:meth:`PaymentLoop.stop`),
#: followed by what was paid for it.
STOPPING = "the bridge is stopping, so this call ends without the bot's result"


class PaymentLoop(RequestSender):
    """The payment loop of the calls to one bot. Requests go over ``link``;
    payments through ``settler`` (caps, day total, approval, the spend
    log); ``clock`` (the bridge's) paces the credit polls and the approval
    keepalive; ``name`` is the bridge name (the refusal-note prefix);
    ``settings`` reads the policy in force (per-call cap, mode);
    ``funding`` pays alongside and prepays (:mod:`.funding`; None: the
    bridge only pays when the bot asks); ``epoch`` is the bridge process's
    ``brmcp/callerEpoch`` (16 hex; WIRE.md §Pay alongside), sent with
    every call."""

    def __init__(
        self,
        link: BotLink,
        settler: Settler,
        clock: Clock,
        name: str,
        *,
        settings: Callable[[], Settings],
        funding: Funding | None,
        epoch: str,
    ) -> None:
        self.link = link
        self._settler = settler
        self._clock = clock
        self._name = name
        self._settings = settings
        #: Judges and makes each payment a refusal asks for (:mod:`._decide`).
        self._decider = Decider(link, settler, clock, settings=settings)
        #: The known balance, pay alongside and prepay; None: pay when asked only.
        self.funding = funding
        #: This bridge process's caller epoch (16 hex characters).
        self.epoch = epoch
        #: Input-schema validators per tool, with the snapshot entry they were built from.
        self._validators: dict[str, tuple[Any, Any]] = {}
        #: The bridge is stopping (:meth:`stop`); the scopes of the calls running.
        self._stopping = False
        self._calls: set[anyio.CancelScope] = set()
        #: Told ``(tool, arguments, callKey, result _meta, link)`` of each
        #: result handed to the agent, ``link`` the bot's that served it (a
        #: pool member's, or ``link``) (the bridge's receipt book); must not
        #: block nor raise.
        self.on_result: Callable[[str, dict[str, Any] | None, str, Any, BotLink], None] | None = None
        #: The bridge's bot pools (:mod:`.pools`): calls of a pool member
        #: spread and fail over across its siblings; None: ``link`` only.
        self.pools: Pools | None = None

    def _arguments_valid(self, tool: str, arguments: dict[str, Any] | None) -> bool:
        """True when ``arguments`` satisfy the snapshot's input schema of
        ``tool`` (False for an unknown tool or an unusable schema)."""
        spec = self.link.tool(tool)
        if spec is None:
            return False
        cached = self._validators.get(tool)
        if cached is None or cached[0] is not spec:
            try:
                cls = jsonschema.validators.validator_for(spec.input_schema, jsonschema.Draft202012Validator)
                validator: Any = cls(spec.input_schema)
            except Exception:
                validator = None
            cached = self._validators[tool] = (spec, validator)
        validator = cached[1]
        if validator is None:
            return False
        try:
            return bool(validator.is_valid(arguments or {}))
        except Exception:  # a schema that cannot be applied: let the bot decide
            return False

    def stop(self) -> None:
        """The bridge is stopping: every call in this loop ends now, and any
        that starts from now on at once, with :class:`MCPError`
        (:data:`STOPPING`, and what was paid for it). A payment parked for
        approval is withdrawn (nothing is paid); one already in flight
        completes first (it is never interrupted), and the call then says
        it was paid."""
        self._stopping = True
        for scope in list(self._calls):
            scope.cancel()

    async def run(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        tracked: AgentCall | None,
        key: str,
        *,
        reused: bool = False,
        budget: CallBudget | None = None,
    ) -> CallToolResult:
        """The payment loop of one logical call of ``tool`` with
        ``arguments`` under callKey ``key`` (the module docstring): returns
        the bot's result, with the money note when atoms moved and the
        refusal note when the bridge declined to pay. ``tracked`` is the
        agent's call (its progress, whether it went away; None: no agent);
        ``reused``: ``key`` is an earlier copy's; ``budget`` carries what
        earlier copies of this call already paid (an agent's re-send, or a
        payment in doubt after a restart). Raises :class:`MCPError` at the
        deadline, for an unreachable bot, when the bridge's own brclient
        is down (:class:`HostOffline`), or when the bridge stops
        (:meth:`stop`), saying what was paid."""
        if budget is None:
            budget = CallBudget(listing_of(self.link.tool(tool)))
        alongside = Alongside()
        scope = anyio.CancelScope()
        self._calls.add(scope)
        try:
            with scope:
                if self._stopping:
                    scope.cancel()
                return await self._run(tool, arguments, tracked, key, reused, budget, alongside)
        finally:
            self._calls.discard(scope)
            if alongside.funding is not None:
                # Whatever ended the call: what it counted on is free, and a
                # payment made alongside it is credit for the other calls.
                alongside.funding.done(alongside.share)
        # Only a stop of the bridge cancels this scope (and ends up here).
        paid = charged(*spent(budget, alongside.payment))
        log.info("call of %s to bot %s ended: the bridge is stopping; %s", tool, self.link.uid[:8], paid)
        raise MCPError(INTERNAL_ERROR, f"{STOPPING}; {paid}")

    async def _run(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        tracked: AgentCall | None,
        key: str,
        reused: bool,
        budget: CallBudget,
        alongside: Alongside,
    ) -> CallToolResult:
        """:meth:`run`'s loop; ``alongside.payment`` mirrors the payment made
        alongside the call until the budget counts it."""
        wants_progress = tracked is not None and tracked.wants_progress
        progress = tracked.progress if tracked is not None and wants_progress else None
        gone = tracked.gone if tracked is not None else None
        request = CallToolRequest(
            params=CallToolRequestParams(
                name=tool,
                arguments=arguments,
                _meta=cast(RequestParamsMeta, {CALL_KEY: key, CALLER_EPOCH_KEY: self.epoch}),
            )
        )
        bot = self.link.uid
        # An earlier copy of this call already paid (and polled, or its agent
        # gave up): a refusal now is answered at once with what was paid, so
        # even an impatient agent hears it; its credit stays at the bot.
        polls = POLL_ATTEMPTS - 1 if budget.payments and not budget.landing else 0
        era_switched = False
        # A pool's members share one balance (:mod:`.pools`).
        funding = (self.pools.funding(bot) if self.pools is not None else None) or self.funding
        # The logical call's deadline: the message TTL from its start, plus
        # the time spent deciding and making payments.
        deadline = anyio.current_time() + self.link.ttl
        # A re-sent call (an earlier copy's key) may be answered from the bot's
        # record of that copy: never pay alongside it; nor alongside a call
        # already paid for, nor one the bot will refuse anyway (arguments
        # that do not satisfy the tool's input schema).
        share: Share | None = None
        if (
            funding is not None
            and not reused
            and budget.payments == 0
            and budget.listing.kind == "fixed"
            and self._arguments_valid(tool, arguments)
        ):
            alongside.funding = funding
            try:
                # Another call's payment to this bot may decide first (one
                # payment ahead of need at a time): this may wait for its answer.
                share = alongside.share = await funding.alongside(
                    tool, gone, call_key=key, args_hash=arguments_hash(arguments), deadline=deadline
                )
            except TimeoutError:
                waited = f"waited for the answer to another call's payment to bot {bot[:8]}"
                raise MCPError(
                    INTERNAL_ERROR,
                    f"the call's deadline passed while it {waited}; nothing was paid for this call",
                ) from None
        ahead = share.payment if share is not None else None
        alongside.payment = ahead
        plain = request
        retries = 0
        covers = 0
        if ahead is not None:
            # Only the first send is marked; reissues are plain.
            request = with_meta(request, {PAY_ALONGSIDE_KEY: ahead.amount})
        while True:
            try:
                sent = await self._send(request, progress, ahead, gone, deadline, alongside, tracked)
                if isinstance(sent, Withdrawn):
                    # The payment made alongside failed: ask again, unmarked,
                    # under the same key (below, a refusal then ends the call
                    # with the payment's note; nothing is paid twice).
                    request = plain
                    continue
                if sent is None:
                    # The agent went away while the payment made alongside
                    # was under way: the held call was withdrawn (cancelled
                    # at the bot, nothing charged).
                    assert ahead is not None
                    ahead.claimed = False
                    failed = await ahead.wait()
                    if failed is None:
                        amount = ahead.amount
                        raise MCPError(
                            INTERNAL_ERROR,
                            f"the agent went away; the {amount} atoms paid stay at the bot as credit",
                        )
                    known = funding.balance if funding is not None else None
                    refused = payment_required_result(tool, ahead.amount + (known or 0), known or 0)
                    note = TextContent(type="text", text=f"{self._name}: payment not made: {failed}")
                    return refused.model_copy(update={"content": [*refused.content, note]})
                result = sent
                request = plain
            except DeadlineError as exc:
                if tracked is not None and exc.sends:
                    tracked.unknown = True  # the bot may have run it: a re-send reuses the key
                late = budget.payments and not exc.sends  # paying and the credit polls used the deadline
                text = f"the call's deadline passed while paying bot {bot[:8]} and waiting for it to see "
                text += "the credit"
                raise MCPError(
                    INTERNAL_ERROR, f"{text if late else exc}; {charged(*spent(budget, ahead))}"
                ) from None
            except HostOffline as exc:
                # The bridge's own brclient is down: say so, and what was paid;
                # a copy sent before, or a payment made, makes the agent's
                # re-send reuse this callKey (paying nothing twice).
                paid = spent(budget, ahead)
                if tracked is not None and (exc.sends or paid[1]):
                    tracked.unknown = True
                log.warning("call of %s to bot %s failed: %s", tool, bot[:8], exc)
                raise MCPError(INTERNAL_ERROR, f"{exc}; {charged(*paid)}") from None
            except LinkError as exc:
                raise MCPError(
                    INTERNAL_ERROR, f"bot unavailable: {exc}; {charged(*spent(budget, ahead))}"
                ) from None
            except MCPError as exc:
                if exc.error.code == INVALID_PARAMS and exc.error.message == f'unknown tool "{tool}"':
                    # Listed here, unknown there: the bot restarted with
                    # other tools. The next tools/list asks it again.
                    self.link.doubt_tools()
                raise
            member = alongside.member or self.link
            receipt = parse_receipt(result.meta)
            refunded = refunded_of(result.meta)
            refusal = self._refusal_of(result, member)
            result = clean_result(result)
            if asks_to_retry(result) and retries < MAX_DUPLICATE_RETRIES:
                # A re-sent copy waited on an earlier one the bot refused
                # (payment_required): the key is free again, ask again.
                retries += 1
                continue
            if (
                not era_switched
                and result.is_error
                and needs_back_channel(result)
                and self.link.era == ERA_MODERN
            ):
                # A modern session has no channel for the bot's sampling or
                # elicitation requests: the failed (refunded) call runs
                # again, under a new key, on a handshake session.
                era_switched = True
                self.link.require_handshake()
                request = plain = with_key(plain, secrets.token_hex(16))
                continue
            if funding is not None:
                funding.observe(tool, result, ahead, refusal=refusal, listing=budget.listing, share=share)
            stated = (
                receipt.balance_atoms
                if receipt is not None
                else refusal.balance_atoms
                if refusal is not None
                else refunded[1]
                if refunded is not None
                else None
            )
            if stated is not None:
                # A pool's book is shared: the balance is every member's.
                for uid in self.pools.note(member.uid) if self.pools is not None else [member.uid]:
                    self._settler.note_balance(uid, stated)
            if refusal is None:
                if funding is not None and not result.is_error:
                    funding.after_call(tool, result, ahead)
                if ahead is not None and not ahead.done and receipt is not None:
                    # The bot charged, so the payment made alongside reached
                    # it; its confirmation here is usually a moment behind.
                    # Wait briefly so the note says what was paid.
                    with anyio.move_on_after(max(0.0, min(CONFIRM_WAIT, deadline - anyio.current_time()))):
                        await ahead.settled.wait()
                if self.on_result is not None:
                    # The receipt book records on the side (BRIDGE.md §Signed receipts).
                    self.on_result(tool, arguments, key, result.meta, member)
                return with_money(self._name, result, budget, ahead, receipt, refunded)
            if ahead is not None:
                # Refused although a payment is on its way (a bot that does
                # not hold marked calls, or a hold that ran out): wait for
                # that payment, then reissue as after any payment.
                failed = await ahead.wait()
                amount, shared, ahead = ahead.amount, ahead.prepay, None
                alongside.payment = None
                if failed is not None and not shared:
                    note = TextContent(type="text", text=f"{self._name}: payment not made: {failed}")
                    return result.model_copy(update={"content": [*result.content, note]})
                if failed is None:
                    if funding is not None and share is not None:
                        funding.landed(share)
                    budget.add(amount)
                    polls = 0
                    if gone is None or not gone.is_set():
                        continue
                # else: a prepayment this call waited for was not made (denied,
                # failed): the call pays for itself below, as any refused call.
            if budget.payments and polls < POLL_ATTEMPTS - 1 and (gone is None or not gone.is_set()):
                # Paid: the credit may still be on its way to the bot.
                await self._clock.sleep(POLL_INTERVAL)
                polls += 1
                if anyio.current_time() < deadline:
                    continue
                # The deadline passed while polling: no reissue; the agent is
                # told below what was paid (a result, not a deadline error).
                polls = POLL_ATTEMPTS
            if (
                member is not self.link
                and self.pools is not None
                and not self.pools.is_member(bot, member.uid)
            ):
                # The member that refused left the pool, or was de-listed,
                # since the request went to it: it is paid nothing (its
                # credit may not be the pool's); the members are asked
                # again under the same key.
                if retries < MAX_DUPLICATE_RETRIES and anyio.current_time() < deadline:
                    retries += 1
                    continue
                why = f"bot {member.uid[:8]}, which asked, is no longer a member of bot {bot[:8]}'s pool"
                if budget.payments:
                    why += already(budget)
                note = TextContent(type="text", text=f"{self._name}: payment not made: {why}")
                return result.model_copy(update={"content": [*result.content, note]})
            paying = anyio.current_time()
            with call_arguments(arguments):
                reason = await self._decider.decide(
                    tool,
                    refusal,
                    budget,
                    key,
                    gone,
                    payee=member.uid,
                    funding=funding,
                    waiting=tracked if wants_progress else None,
                    share=share,
                    deadline=deadline,
                    covered_ok=covers < _MAX_COVERED,
                    args_hash=arguments_hash(arguments),
                )
            deadline += anyio.current_time() - paying
            if isinstance(reason, Covered):
                # Credit known since covers the call: ask again, paying nothing.
                covers += 1
                continue
            if reason is None:
                polls = 0
                if gone is None or not gone.is_set():
                    continue
                # Nobody is left to receive the result: do not run the
                # tool; the credit stays at the bot for later calls.
                reason = f"the agent went away; the {budget.paid_atoms} atoms paid stay at the bot as credit"
            note = TextContent(type="text", text=f"{self._name}: payment not made: {reason}")
            return result.model_copy(update={"content": [*result.content, note]})

    def _refusal_of(self, result: CallToolResult, member: BotLink) -> PaymentRequired | None:
        """The bot's payment refusal in ``result``, or None when it is none:
        not refusal-shaped (WIRE.md §Payments, "Recognising a refusal"), or
        unmarked from a bot that marks its genuine refusals (``brmcp/refusal``;
        its tool's output can look like anything), or carrying a receipt
        (the output of a call the bot charged). ``member``: the bot that
        answered (a pool member, or :attr:`link`)."""
        refusal = parse_payment_required(result)
        if refusal is None:
            return None
        if parse_receipt(result.meta) is not None:
            # A refusal charges nothing, so it carries no receipt (WIRE.md
            # §Receipts): this is the output of a call the bot charged.
            return None
        if member.marks_refusals:
            meta = result.meta
            if not (isinstance(meta, dict) and meta.get(REFUSAL_KEY) is True):
                return None
        return refusal
