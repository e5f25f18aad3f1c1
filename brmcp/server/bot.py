"""Bot glue: serve a :class:`~brmcp.server.Harness` through a running brclient
over clientrpc (go-brmcp.md §3.12; clientrpc.md §6 "What brmcp server/bot.go
does").

Three consumers run side by side, each acknowledging an event only after it
was processed (at-least-once; clientrpc.md §4.3):

* PMs: a brmcp envelope goes to the harness's router, other text to the
  host's ``on_pm`` hook (dropped without one); then ``AckReceivedPM``. A
  redelivered envelope is harmless: the router reassembles it again and a
  repeated keyed call replays its first outcome (WIRE.md §callKey).
* Received tips: a tip whose sequence id or amount is outside 0..2**63-1 is
  logged, acked and not credited. :meth:`Harness.record_tip` credits the sender once per tip
  (durably, deduplicated by sequence id, sender and amount; only allowed
  senders are credited), then ``AckTipReceived``, then ``on_tip_received``
  for new tips only.
* Tip progress: the ``on_tip_progress`` hook, then ``AckTipProgress``.

Unlike bisonbotkit (which acks PMs before handing them over), nothing is
acked before it is processed, and the received-tips log is acked with
``PaymentsService.AckTipReceived`` (clientrpc.md §6 on the kit's wrong ack).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from ..clientrpc import Client, ReceivedPM, ReceivedTip, Subscription, TipProgressEvent
from ..clientrpc._glue import Acker, call_hook, connection_signals, flush_on_connect
from ..router import Router
from ..wire import is_envelope
from .harness import Harness
from .store import MAX_INT63

__all__ = ["ConnectedHook", "PMHook", "TipProgressHook", "TipReceivedHook", "run_bot"]

log = logging.getLogger("brmcp.server.bot")

#: ``on_pm(uid, text)``: a PM that is not a brmcp envelope (plain chat). Sync or async.
PMHook = Callable[[str, str], Awaitable[None] | None]
#: ``on_tip_received(uid, atoms)``: a new tip, floored to atoms, allowed sender or not.
TipReceivedHook = Callable[[str, int], Awaitable[None] | None]
#: ``on_tip_progress(event)``: progress of a tip this brclient sends.
TipProgressHook = Callable[[TipProgressEvent], Awaitable[None] | None]
#: ``on_connected()``: after every (re)connect to brclient.
ConnectedHook = Callable[[], Awaitable[None] | None]

#: Retry delays (seconds) while a tip cannot be recorded: first, then doubling up to the cap.
CREDIT_RETRY_INITIAL = 0.5
CREDIT_RETRY_MAX = 30.0


async def run_bot(
    harness: Harness,
    client: Client,
    *,
    on_pm: PMHook | None = None,
    on_tip_received: TipReceivedHook | None = None,
    on_tip_progress: TipProgressHook | None = None,
    on_connected: ConnectedHook | None = None,
    task_status: anyio.abc.TaskStatus[Router] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``harness`` through brclient until cancelled.

    ``client`` must already be entered (``async with client:``); it is the
    harness's PM sender, so while it is disconnected sends fail at once with
    :class:`~brmcp.clientrpc.ClientrpcNotConnected` and the MCP session that
    tried closes with a transport error (callers retry on a new session).
    ``harness`` must not be entered: this enters it (``harness.serve``) and
    closes it on return. With ``tg.start(run_bot, ...)`` the started value
    is the harness's :class:`~brmcp.Router`, once the three streams are
    subscribed.

    Hooks may be plain functions or coroutines; they run inline (a slow
    hook delays the events behind it) and their exceptions are logged, never
    fatal. ``on_pm(uid, text)`` gets plain chat; ``on_tip_received(uid,
    atoms)`` fires once per new tip (atoms = milliatoms // 1000), after it was
    recorded and acked; ``on_tip_progress(event)`` gets every tip-progress
    event before its ack; ``on_connected()`` runs after every (re)connect,
    once acks that failed while disconnected were re-sent.

    A lost connection loses nothing: events are acked only after processing,
    acks that failed are re-sent after the reconnect, and replays are
    dropped by the subscription (same event) or by the harness's tip record
    (same tip after a restart). Malformed events and streams brclient ends
    with an error are logged by the client and skipped. Returns when
    cancelled (the cancellation propagates) or when ``client`` is closed.
    """
    pm_ack = Acker("PM", client.ack_received_pm)
    tip_ack = Acker("received-tip", client.ack_tip_received)
    progress_ack = Acker("tip-progress", client.ack_tip_progress)
    async with harness.serve(client) as router:
        with connection_signals(client) as connects:
            pms = client.pm_stream()
            tips = client.tip_stream()
            progress = client.tip_progress()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_until_end, tg, _pm_loop, pms, router, on_pm, pm_ack)
                    tg.start_soon(_until_end, tg, _tip_loop, tips, harness, on_tip_received, tip_ack)
                    tg.start_soon(_until_end, tg, _progress_loop, progress, on_tip_progress, progress_ack)
                    tg.start_soon(
                        flush_on_connect,
                        connects,
                        [pm_ack, tip_ack, progress_ack],
                        on_connected,
                        "on_connected",
                    )
                    task_status.started(router)
            finally:
                for sub in (pms, tips, progress):
                    sub.close()
    log.info("brclient client closed; bot stopped")


async def _until_end(tg: anyio.abc.TaskGroup, loop: Callable[..., Awaitable[None]], *args: Any) -> None:
    """Run one consumer; when its subscription ends (the client closed), stop the bot."""
    await loop(*args)
    tg.cancel_scope.cancel()


async def _pm_loop(pms: Subscription[ReceivedPM], router: Router, on_pm: PMHook | None, acker: Acker) -> None:
    async for pm in pms:
        text = pm.message
        try:
            if is_envelope(text):
                router.handle_pm(pm.uid, text)
            elif text and on_pm is not None:
                await call_hook(on_pm, pm.uid, text, what="on_pm")
        except Exception:
            log.exception("PM %d from %s could not be dispatched; dropping it", pm.sequence_id, pm.uid)
        await acker.ack(pm.sequence_id)


async def _tip_loop(
    tips: Subscription[ReceivedTip], harness: Harness, on_tip: TipReceivedHook | None, acker: Acker
) -> None:
    async for tip in tips:
        if not (_fits63(tip.sequence_id) and _fits63(tip.amount_matoms)):
            # brclient's ids are uint64 and amounts int64: a value outside
            # 0..2**63-1 cannot be stored (or is negative). Acking it is safe
            # (we received that id), and keeps it from coming back forever.
            log.error(
                "tip %d from %s (%d matoms) out of range (sequence id and amount must be in 0..2**63-1): "
                "not credited, acked",
                tip.sequence_id,
                tip.uid,
                tip.amount_matoms,
            )
            await acker.ack(tip.sequence_id)
            continue
        outcome = await _record(harness, tip)
        if outcome is None:
            continue  # malformed: not acked, see _record
        new, credited = outcome
        await acker.ack(tip.sequence_id)
        metrics = harness.metrics
        if metrics is not None:
            metrics.tips.labels("credited" if credited else "not_credited" if new else "duplicate").inc()
            if credited:
                metrics.tip_atoms.inc(credited)
        if new:
            if credited:
                log.info(
                    "tip %d: credited %d atoms to %s (%d matoms received)",
                    tip.sequence_id,
                    credited,
                    tip.uid,
                    tip.amount_matoms,
                )
            else:
                log.info(
                    "tip %d: %d matoms from %s not credited: %s",
                    tip.sequence_id,
                    tip.amount_matoms,
                    tip.uid,
                    _uncredited_reason(harness, tip),
                )
            await call_hook(on_tip, tip.uid, tip.atoms, what="on_tip_received")
        else:
            log.debug("tip %d from %s already recorded; ignored", tip.sequence_id, tip.uid)


def _uncredited_reason(harness: Harness, tip: ReceivedTip) -> str:
    """Why a new tip credited nothing (for the log)."""
    if not harness.allowed(tip.uid):
        return "the sender is not an allowed caller (add its uid to the allowlist to credit its tips)"
    if tip.amount_matoms < 1000:
        return "under 1 atom (1,000 matoms)"
    return "nothing to credit"


def _fits63(value: int) -> bool:
    return 0 <= value <= MAX_INT63


async def _record(harness: Harness, tip: ReceivedTip) -> tuple[bool, int] | None:
    """Record (and credit) one tip, retrying with backoff until the ledger
    takes it: the tip loop must never ack past a tip it could not record,
    since the ack is cumulative. A tip the ledger cannot represent (e.g. a
    value of the wrong type) is logged and skipped without an ack; out-of-range
    ids and amounts never get here (the tip loop acks them uncredited)."""
    delay = CREDIT_RETRY_INITIAL
    while True:
        try:
            return await harness.record_tip(tip.uid, tip.amount_matoms, tip.sequence_id)
        except (ValueError, TypeError, OverflowError) as exc:
            log.error("malformed tip %r skipped (not credited, not acked): %s", tip, exc)
            return None
        except Exception as exc:
            log.error(
                "tip %d from %s (%d matoms) could not be recorded (%s); retrying in %.1fs",
                tip.sequence_id,
                tip.uid,
                tip.amount_matoms,
                exc,
                delay,
            )
        await anyio.sleep(delay)
        delay = min(delay * 2, CREDIT_RETRY_MAX)


async def _progress_loop(
    progress: Subscription[TipProgressEvent], on_progress: TipProgressHook | None, acker: Acker
) -> None:
    async for event in progress:
        await call_hook(on_progress, event, what="on_tip_progress")
        await acker.ack(event.sequence_id)
