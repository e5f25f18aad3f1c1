"""The per-call money pipeline of the harness (WIRE.md §Payments "Server
order per call", §callKey, §Pay alongside, §Receipts): callKey claim, rate limit,
price, debit (or the pay-alongside hold, or ``payment_required``), handler,
the deliverability check, and settlement (journal, refund of a failed paid
call, the outcome kept for duplicates). :class:`CallPipeline` is owned by
:class:`~.harness.Harness`, which delegates :meth:`~.harness.Harness.call`
to it and wakes its held calls on every credit.

Money answers are the harness's alone (WIRE.md §Payments, "Genuine
refusals"): its own ``payment_required`` refusals carry ``brmcp/refusal``,
and everything a handler (or an upstream) produces, including the text of
an exception, goes through :func:`._guard.tool_output` or
:func:`._guard.tool_error` before a receipt or refund key is added, so it
can never decode as a refusal nor carry a ``brmcp/`` key the harness did
not write.

A refusal before execution travels as a typed :class:`~._refusal.Refusal`
(reason, tool, price, balance) and is rendered once, at the edge
(:meth:`CallPipeline.call`); the pay-alongside hold and the caller epochs
live in :mod:`._holds`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from mcp.types import CallToolResult, JSONRPCResponse

import brmcp.wire as wire
from brmcp.protocol.payment import BALANCE_ATOMS_KEY, HELD_KEY, REFUNDED_ATOMS_KEY, Receipt
from brmcp.protocol.receipts import SIGNED_RECEIPT_KEY, args_sha256

if TYPE_CHECKING:
    from brmcp.metrics import ServeMetrics
from brmcp.protocol.toolerrors import peer_error_text
from brmcp.server.catalog import CallContext, ToolSpec, to_result
from brmcp.server.config import HarnessConfig
from brmcp.server.ratelimit import RateLimiter

from ._accounts import Accounts
from ._callkeys import (
    REPLAY_WINDOW,
    CallKeyRegistry,
    Claim,
    KeyClaimedElsewhere,
    await_elsewhere,
    error_result,
)
from ._doubt import ChargeOutcomeUnknown
from ._guard import tool_error, tool_output
from ._holds import CallerEpochs, HeldCalls
from ._refusal import DROPPED_TEXT, Refusal, Refused
from ._runs import Runs
from ._withheld import withhold

__all__ = [
    "DROPPED_TEXT",
    "OUTCOME_CAP",
    "CallPipeline",
    "CallerEpochs",
    "outcome_json_for_error",
    "response_overhead",
]

log = logging.getLogger("brmcp.server")

#: Outcomes whose JSON is at most this many bytes are kept in the journal
#: and replayed after a restart (WIRE.md §callKey).
OUTCOME_CAP = 64 * 1024
#: The JSON-RPC id assumed when the request's own is unknown (a direct
#: :meth:`Harness.call`): the longest an int64 id prints.
_WORST_ID = -(2**63)
#: Bytes a refund's ``_meta`` keys may add to a result's JSON (both values int64).
_REFUND_META_ROOM = 96


class CallPipeline:
    """Runs each tools/call of a :class:`~.harness.Harness` and charges it at
    most once. It shares the harness's ``config`` (read live: hold bounds,
    chunk size), ledger (``accounts``), rate ``limiter`` and callKey
    registry (``calls``); ``clock`` gives unix seconds for journal expiry.
    ``metrics`` (a :class:`brmcp.metrics.ServeMetrics` or None) is set
    through ``Harness.metrics``. The pay-alongside hold is :attr:`held`
    (:class:`._holds.HeldCalls`); keyed calls run in :attr:`runs`
    (:class:`._runs.Runs`, the harness's task group), so the loss of the
    session they came on does not cancel them."""

    def __init__(
        self,
        config: HarnessConfig,
        accounts: Accounts,
        limiter: RateLimiter,
        calls: CallKeyRegistry,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self._accounts = accounts
        self._limiter = limiter
        self._calls = calls
        self._clock = clock
        #: Prometheus metrics to update, or None.
        self.metrics: ServeMetrics | None = None
        #: The calls held for a pay-alongside credit, and the caller epochs.
        self.held = HeldCalls(config, calls)
        #: Where keyed calls run: the harness's task group while it serves.
        self.runs = Runs()
        self.executions = 0  #: handler invocations (for tests and metrics)

    @property
    def epochs(self) -> CallerEpochs:
        """The latest caller epoch per caller (bounded; :class:`._holds.CallerEpochs`)."""
        return self.held.epochs

    @property
    def holds(self) -> int:
        """Calls that were held at least once (observability and tests)."""
        return self.held.holds

    @property
    def dropped(self) -> int:
        """Held calls dropped because their caller's epoch changed."""
        return self.held.dropped

    def observe_epoch(self, peer: str, epoch: str | None) -> int:
        """Drop the calls of ``peer`` held under an epoch other than the new
        ``epoch``: :meth:`._holds.HeldCalls.observe_epoch`. Returns how many."""
        return self.held.observe_epoch(peer, epoch)

    def credited(self, peer: str) -> None:
        """Wake the calls of ``peer`` held for a pay-alongside credit (the
        harness calls it after every credit to ``peer``)."""
        self.held.credited(peer)

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
        ``brmcp/callerEpoch`` (already validated; None = none): a new one
        first drops the caller's calls held under another
        (:meth:`observe_epoch`). A charged result carries the receipt ``_meta`` keys
        ``brmcp/chargedAtoms`` and ``brmcp/balanceAtoms`` (WIRE.md §Receipts);
        a refunded failure ``brmcp/refundedAtoms`` and ``brmcp/balanceAtoms``.
        A refusal of the harness's own carries ``brmcp/refusal``. With a
        receipt signer, a successful call the ``receipts`` mode covers also
        carries ``brmcp/signedReceipt`` (WIRE.md §Signed receipts)."""
        self.observe_epoch(peer, epoch)
        claim: Claim | None = None
        if call_key is not None:
            claim, duplicate = self._calls.claim(peer, call_key)
            if duplicate:
                return await self._calls.wait(claim)
        work = functools.partial(
            self._run, peer, spec, arguments, prepared, call_key, claim, request, alongside, epoch
        )
        if claim is None:
            return await work()
        # A keyed call's run is the harness's: the loss of this session does
        # not cancel it, and a retry with the key gets its kept outcome.
        keyed = claim
        return await self.runs.run(
            work,
            tool=spec.name,
            peer=peer,
            call_key=call_key,
            request_id=getattr(request, "request_id", None),
            settled=lambda: keyed.outcome or keyed.refused,
        )

    async def _run(
        self,
        peer: str,
        spec: ToolSpec,
        arguments: dict[str, Any],
        prepared: dict[str, Any],
        call_key: str | None,
        claim: Claim | None,
        request: Any,
        alongside: int,
        epoch: str | None,
    ) -> CallToolResult:
        """One call from its claimed key (or none) to its answer: execution
        (:meth:`_execute`), a refusal rendered, a key held elsewhere, the
        claim released when the call is abandoned before it ran; metrics."""
        started = anyio.current_time()
        outcome = "ok"
        try:
            result = await self._execute(
                peer, spec, arguments, prepared, call_key, claim, request, alongside, epoch
            )
            if result.is_error:
                outcome = "error"
        except Refused as refused:
            # The edge: the one place a refusal becomes the caller's answer.
            refusal = refused.refusal
            outcome = refusal.reason.metric_outcome
            result = refusal.result()
            if claim is not None:
                self._calls.release(claim, refusal.reason.value, result)
            return result
        except KeyClaimedElsewhere as elsewhere:
            # A shared book: another process holds the key (WIRE.md §Pools).
            result = await self._answer_elsewhere(peer, call_key, claim, elsewhere)
            outcome = "error" if result.is_error else "ok"
            return result
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

    async def _answer_elsewhere(
        self, peer: str, call_key: str | None, claim: Claim | None, elsewhere: KeyClaimedElsewhere
    ) -> CallToolResult:
        """Answer a call whose key another process sharing the book holds,
        nothing charged: its recorded outcome (kept here for local
        duplicates too), or a retry-with-the-same-key tool error
        (:func:`.callkeys.await_elsewhere`)."""
        assert call_key is not None
        assert claim is not None
        try:
            result, expires = await await_elsewhere(
                elsewhere.holder, lambda: self._accounts.key_holder(peer, call_key), self.config.timer
            )
        except BaseException:
            self._calls.release(claim, "the original call was abandoned")
            raise
        if expires is not None:
            text = _dump(result)
            self._calls.finish(claim, result, len(text.encode()), text, expires)
        else:
            self._calls.release(claim, "the original call runs at another member of the pool", result)
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
        epoch: str | None = None,
    ) -> CallToolResult:
        if not self._limiter.take(peer):
            raise Refused(Refusal.rate_limited())
        base = CallContext(peer=peer, tool=spec.name, call_key=call_key, request=request)
        try:
            price = await spec.price_for(base, arguments)
        except Exception as exc:
            raise Refused(Refusal.price_failed(peer_error_text(spec.name, exc, log))) from None
        call_id = wire.new_id() + wire.new_id()
        charged = 0
        receipt: Receipt | None = None
        held = False
        if price > 0:
            balance, held = await self.held.charge_or_hold(
                functools.partial(self._charge_once, call_id, peer, call_key, spec.name, price),
                call_id=call_id,
                peer=peer,
                tool=spec.name,
                price=price,
                alongside=alongside,
                claim=claim,
                epoch=epoch,
            )
            charged = price
            receipt = Receipt(charged_atoms=price, balance_atoms=balance)
        ctx = CallContext(
            peer=peer, tool=spec.name, charged_atoms=charged, call_key=call_key, request=request
        )
        self.executions += 1
        failed = False
        try:
            value = await spec.handler(ctx, prepared)
            result = tool_output(to_result(value))
            problem = spec.check_output(result)
            if problem is not None:
                failed = True
                result = tool_error(problem)
            elif result.is_error:
                failed = True
            else:
                if receipt is not None:
                    result = _with_receipt(result, receipt, held=held)
                # Signed before the result is serialized and journaled, so
                # a duplicate callKey replays this very receipt.
                signed = self._signed_receipt(call_id, peer, spec.name, arguments, call_key, charged)
                if signed is not None:
                    meta = dict(result.meta or {})
                    meta[SIGNED_RECEIPT_KEY] = signed
                    result = result.model_copy(update={"meta": meta})
            # Serialized here, inside the failure handling: a result that
            # cannot be written must become a refunded failure, not an error
            # escaping after the charge (the key would be released with the
            # debit still open).
            signs = result.meta is not None and SIGNED_RECEIPT_KEY in result.meta
            text = _result_json(result) if charged > 0 or claim is not None or signs else None
            if text is not None:
                self._check_deliverable(text, getattr(request, "request_id", None))
        except Exception as exc:
            failed = True
            log.info(
                "tool %s failed for %s: %s", spec.name, peer, exc, exc_info=log.isEnabledFor(logging.DEBUG)
            )
            result = tool_error(peer_error_text(spec.name, exc, log))
            text = None
        except BaseException:
            # Cancelled (the caller gave up): refund and record like a failure.
            with anyio.CancelScope(shield=True):
                await self._settle(
                    call_id, peer, claim, charged, error_result("call cancelled"), True, tool=spec.name
                )
            raise
        with anyio.CancelScope(shield=True):
            result = await self._settle(call_id, peer, claim, charged, result, failed, text, tool=spec.name)
        return result

    def _signed_receipt(
        self,
        call_id: str,
        peer: str,
        tool: str,
        arguments: dict[str, Any],
        call_key: str | None,
        charged: int,
    ) -> dict[str, str] | None:
        """The signed receipt (WIRE.md §Signed receipts) of a successful call
        charged ``charged`` atoms, or None when the config's
        ``receipt_signer`` is unset or its ``receipts`` mode does not cover
        the call (``"paid"``: charged calls only; ``"all"``: every call;
        ``"off"``: none). ``time`` is the harness clock's unix seconds. A
        receipt that cannot be made (arguments JSON cannot write) is logged
        and left out: the call and its charge stand as they are."""
        signer = self.config.receipt_signer
        mode = self.config.receipts
        if signer is None or mode == "off" or (mode == "paid" and charged <= 0):
            return None
        try:
            return signer.sign(
                call_id=call_id,
                caller=peer,
                tool=tool,
                args_digest=args_sha256(arguments),
                call_key=call_key,
                atoms=charged,
                time=int(self._clock()),
            )
        except (TypeError, ValueError) as exc:
            log.warning("no signed receipt for call %s of %s: %s", call_id, tool, exc)
            return None

    async def _charge_once(
        self, call_id: str, peer: str, call_key: str | None, tool: str, price: int, quiet: bool = False
    ) -> int:
        """Debit ``price``; returns the balance after the charge, or raises
        :class:`._refusal.Refused` (payment_required with the balance, or a
        ledger failure). A negative return value never escapes: an unknown
        balance (external billing) is read again. ``quiet``: no log line
        for a payment_required refusal (a call that may be held logs what
        happens to it instead)."""
        try:
            with anyio.CancelScope(shield=True):
                ok, balance = await self._accounts.charge(
                    call_id=call_id, peer=peer, call_key=call_key, tool=tool, atoms=price
                )
                if ok and balance < 0:
                    balance = max(0, await self._accounts.balance(peer))
        except KeyClaimedElsewhere:
            raise
        except Exception as exc:
            log.error("charge of %s atoms to %s failed: %s", f"{price:,}", peer, exc)
            if self.metrics is not None:
                self.metrics.errors.labels("ledger").inc()
            unknown = isinstance(exc, ChargeOutcomeUnknown)
            raise Refused(Refusal.outcome_unknown() if unknown else Refusal.ledger_unavailable()) from None
        if not ok:
            refusal = Refusal.payment_required(tool, price, balance)
            if not quiet:
                refusal.log_payment_required(peer)
            raise Refused(refusal)
        if self.metrics is not None:
            self.metrics.charged_atoms.labels(tool).inc(price)
        log.info(
            "charged %s atoms to %s for %s (call %s%s, balance now %s)",
            f"{price:,}",
            peer,
            tool,
            call_id,
            f", callKey {call_key[:8]}" if call_key else "",
            f"{balance:,}" if balance >= 0 else "kept by the billing store",
        )
        return balance

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
    ) -> CallToolResult:
        """Journal completion (refunding a failed paid call in the same
        transaction) and record the outcome for duplicates. ``text`` is the
        result's JSON when the caller already has it. Returns what the
        caller gets: ``result``, with ``brmcp/refundedAtoms`` and
        ``brmcp/balanceAtoms`` (the balance after the refund) in its
        ``_meta`` once a refund committed (WIRE.md §Receipts); the outcome
        kept for replay is that same result. A successful charged result
        whose completion cannot be journaled is withheld (:func:`._withheld.withhold`)."""
        if charged <= 0 and claim is None:
            return result  # a free unkeyed call: nothing to journal or replay
        if text is None:
            text = _dump(result)
        if charged > 0:
            outcome: str | Callable[[int | None], str | None] | None
            rendered: list[str] = []
            if failed:

                def refunded_outcome(balance: int | None) -> str | None:
                    # Runs in the completing transaction: the kept outcome
                    # names the balance that transaction left.
                    rendered.append(_dump(_with_refund(result, charged, balance)))
                    return rendered[-1] if len(rendered[-1].encode()) <= OUTCOME_CAP else None

                # A result too large to keep is not rendered on the ledger's thread.
                fits = len(text.encode()) + _REFUND_META_ROOM <= OUTCOME_CAP
                outcome = refunded_outcome if claim is not None and fits else None
            else:
                outcome = text if len(text.encode()) <= OUTCOME_CAP else None
            complete = functools.partial(
                self._accounts.complete,
                call_id=call_id,
                peer=peer,
                atoms=charged,
                keyed=claim is not None,
                outcome_json=outcome,
                refund=failed,
            )
            try:
                balance = await complete(expires=self._clock() + REPLAY_WINDOW)
            except Exception as exc:
                # The journal row stays 'charged': the next start refunds it
                # exactly once.
                log.error("could not journal completion of call %s for %s: %s", call_id, peer, exc)
                if self.metrics is not None:
                    self.metrics.errors.labels("ledger").inc()
                if not failed:
                    # A result is delivered only once its charge is on the
                    # book as done: delivered now, the next start would
                    # refund a result the caller has. A keyed one is kept
                    # for the same callKey's retry, which journals it first.
                    return withhold(
                        self._calls, call_id, peer, claim, charged, result, text, tool, complete, self._clock
                    )
            else:
                if failed:
                    result = _with_refund(result, charged, balance)
                    text = rendered[-1] if rendered else None
                    if self.metrics is not None:
                        self.metrics.refunds.labels(tool).inc()
                        self.metrics.refunded_atoms.labels(tool).inc(charged)
                    log.info(
                        "refunded %s atoms to %s (call %s): the call failed: %s",
                        f"{charged:,}",
                        peer,
                        call_id,
                        _first_text(result),
                    )
        if claim is not None:
            if text is None:
                text = _dump(result)
            self._calls.finish(claim, result, len(text.encode()), text)
        return result


def response_overhead(request_id: Any) -> int:
    """Bytes the JSON-RPC response wrapper adds around a result's JSON for a
    request with id ``request_id``, as the transport writes it (compact)."""
    empty = JSONRPCResponse(jsonrpc="2.0", id=request_id, result={})
    return len(empty.model_dump_json(by_alias=True, exclude_unset=True).encode()) - len(b"{}")


def _with_receipt(result: CallToolResult, receipt: Receipt, *, held: bool = False) -> CallToolResult:
    """``result`` with the receipt keys added to its ``_meta`` (WIRE.md
    §Receipts), and ``brmcp/held`` when the call was held for its credit
    (WIRE.md §Pay alongside)."""
    meta = dict(result.meta or {})
    meta.update(receipt.to_meta())
    if held:
        meta[HELD_KEY] = True
    return result.model_copy(update={"meta": meta})


def _with_refund(result: CallToolResult, refunded: int, balance: int | None) -> CallToolResult:
    """``result`` with the refund keys in its ``_meta`` (WIRE.md §Receipts):
    ``brmcp/refundedAtoms`` = ``refunded`` and, when known, ``brmcp/balanceAtoms``
    = ``balance`` (atoms, after the refund)."""
    meta = dict(result.meta or {})
    meta[REFUNDED_ATOMS_KEY] = refunded
    if balance is not None and balance >= 0:
        meta[BALANCE_ATOMS_KEY] = balance
    return result.model_copy(update={"meta": meta})


def _dump(result: CallToolResult) -> str:
    """The compact JSON of a result (what the journal keeps)."""
    return result.model_dump_json(by_alias=True, exclude_none=True)


def _first_text(result: CallToolResult, limit: int = 200) -> str:
    """The first text item of ``result`` (shortened), for a log line."""
    for item in result.content:
        text = getattr(item, "text", None)
        if isinstance(text, str):
            return text if len(text) <= limit else text[:limit] + "…"
    return "no text"


def _result_json(result: CallToolResult) -> str:
    """The JSON of a handler's result; TypeError when it cannot be written
    (e.g. bytes that are not UTF-8 in structuredContent)."""
    try:
        return result.model_dump_json(by_alias=True, exclude_none=True)
    except (ValueError, TypeError) as exc:
        raise TypeError(f"tool returned a value that is not JSON: {exc}") from None


def outcome_json_for_error(text: str) -> str:
    """The journal's outcome JSON for a tool error saying ``text`` (what the
    ledger's reconciliation records for a call a crash interrupted)."""
    return error_result(text).model_dump_json(by_alias=True, exclude_none=True)
