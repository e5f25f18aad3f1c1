"""Bot glue: serve a :class:`~brmcp.server.Harness` through a running brclient
over clientrpc (the Go reference, karamble/brmcp, ``server/bot.go``; WIRE.md
§Payments for the tip credit; docs/clientrpc.md §How bots consume the streams).

Three consumers run side by side, each acknowledging an event only after it
was processed (at-least-once; docs/clientrpc.md §Acks and replay):

* PMs: a brmcp envelope goes to the harness's router, other text to the
  host's ``on_pm`` hook (dropped without one); then ``AckReceivedPM``. A
  redelivered envelope is harmless: the router reassembles it again and a
  repeated keyed call replays its first outcome (WIRE.md §callKey). Once the
  router's intake stopped (:meth:`~brmcp.Router.stop_intake`, a host's
  drain before it stops), PMs are neither handled nor acked: brclient
  hands them to the next start.
* Received tips: a tip whose sequence id or amount is outside 0..2**63-1 is
  logged, acked and not credited. :meth:`Harness.record_tip` credits the sender once per tip
  (durably, deduplicated by sequence id, sender and amount; only allowed
  senders are credited, a tip from another sender is held in the same
  transaction and credited once that sender is allowed), then
  ``AckTipReceived``, then ``on_tip_received`` for new tips only.
* Tip progress: the ``on_tip_progress`` hook, then ``AckTipProgress``.

Unlike bisonbotkit (which acks PMs before handing them over), nothing is
acked before it is processed, and the received-tips log is acked with
``PaymentsService.AckTipReceived`` (docs/clientrpc.md §How bots consume the
streams, on the kit's wrong ack).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from .._ops.lockfile import HARNESS, FileLock
from ..clientrpc import (
    Client,
    ClientrpcError,
    ReceivedPM,
    ReceivedTip,
    Subscription,
    TipProgressEvent,
    acquire_brclient,
)
from ..clientrpc._glue import Acker, call_hook, connection_signals, flush_on_connect
from ..transport.router import Router
from ..wire import is_batch, is_envelope
from .harness import Harness, HarnessError
from .store import MAX_INT63

__all__ = ["ConnectedHook", "PMHook", "TipProgressHook", "TipReceivedHook", "lock_brclient", "run_bot"]

log = logging.getLogger("brmcp.server.bot")

#: ``on_pm(uid, text)``: a PM that is not a brmcp envelope (plain chat). Sync or async.
PMHook = Callable[[str, str], Awaitable[None] | None]
#: ``on_tip_received(uid, atoms)``: a new tip, floored to atoms, allowed sender or not.
TipReceivedHook = Callable[[str, int], Awaitable[None] | None]
#: ``on_tip_progress(event)``: progress of a tip this brclient sends.
TipProgressHook = Callable[[TipProgressEvent], Awaitable[None] | None]
#: ``on_connected()``: after every (re)connect to brclient.
ConnectedHook = Callable[[], Awaitable[None] | None]

#: Seconds without a tip after which the replayed backlog is taken to be over.
BACKLOG_QUIET = 1.0
#: Seconds after the tip stream opened after which the backlog report is logged anyway.
BACKLOG_MAX = 10.0
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
    exclusive: bool = True,
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
    atoms)`` fires once per new tip (atoms: :attr:`ReceivedTip.atoms`, the
    milliatoms floored), after it was recorded and acked;
    ``on_tip_progress(event)`` gets every tip-progress event before its
    ack; ``on_connected()`` runs after every (re)connect, once acks that
    failed while disconnected were re-sent.

    One harness per brclient (``exclusive``, the default): brclient's
    streams and acks are shared by every program on it, so two harnesses
    on one brclient would both credit every tip, each into its own ledger.
    Before subscribing, this takes the lock
    :func:`brmcp._ops.lockfile.brclient_lock_path` (named after brclient's
    certificate, so it is the same for every program driving that
    brclient; ``brmcp-bridge`` takes it too) and raises
    :class:`HarnessError` saying why and naming the holder's pid when
    another harness or bridge holds it.

    When the harness has no tip history yet (a new data directory), tips
    already waiting in brclient's replay log are credited as usual, and one
    INFO line then says how many were replayed and from whom.

    A lost connection loses nothing: events are acked only after processing,
    acks that failed are re-sent after the reconnect, and replays are
    dropped by the subscription (same event) or by the harness's tip record
    (same tip after a restart). Malformed events and streams brclient ends
    with an error are logged by the client and skipped. Returns when
    cancelled (the cancellation propagates) or when ``client`` is closed.
    """
    lock = await anyio.to_thread.run_sync(lock_brclient, client) if exclusive else None
    try:
        await _run_bot(harness, client, on_pm, on_tip_received, on_tip_progress, on_connected, task_status)
    finally:
        if lock is not None:
            lock.release()


def lock_brclient(client: Client) -> FileLock:
    """Take the one-consumer-per-brclient lock for ``client``'s brclient (see
    :func:`run_bot` and :func:`brmcp.clientrpc.acquire_brclient`, which a
    ``brmcp-bridge`` on the same brclient takes too; blocking file I/O, run
    it in a thread from async code). First asks brclient for its TLS
    certificate: raises :class:`HarnessError` saying that ``servercertpath``
    is not the certificate of the brclient at ``client.url`` when it presents
    another one (the lock is named after that file, so a wrong one would
    find another brclient's lock). Raises :class:`HarnessError` naming the
    holder and its pid, or when the lock or brclient's certificate cannot be
    opened."""
    return acquire_brclient(
        client.server_cert,
        client.url,
        what=HARNESS,
        error=HarnessError,
        client_cert=client.client_cert,
        client_key=client.client_key,
    )


async def _run_bot(
    harness: Harness,
    client: Client,
    on_pm: PMHook | None,
    on_tip_received: TipReceivedHook | None,
    on_tip_progress: TipProgressHook | None,
    on_connected: ConnectedHook | None,
    task_status: anyio.abc.TaskStatus[Router],
) -> None:
    pm_ack = Acker("PM", client.ack_received_pm)
    tip_ack = Acker("received-tip", client.ack_tip_received)
    progress_ack = Acker("tip-progress", client.ack_tip_progress)
    async with harness.serve(client) as router:
        backlog = _Backlog() if not await harness.has_tip_history() else None
        with connection_signals(client) as connects:
            pms = client.pm_stream()
            tips = client.tip_stream()
            progress = client.tip_progress()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_until_end, tg, _pm_loop, pms, router, on_pm, pm_ack)
                    tg.start_soon(_until_end, tg, _tip_loop, tips, harness, on_tip_received, tip_ack, backlog)
                    if backlog is not None:
                        tg.start_soon(backlog.report, tips)
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
        if router.intake_stopped:
            # Stopping (the host's drain): no new work. Left unread and
            # unacked, like every PM after it (an ack covers the ids below
            # it too), so brclient replays it to the next start.
            router.stats.pms_held += 1
            continue
        text = pm.message
        try:
            if is_envelope(text) or is_batch(text):
                router.handle_pm(pm.uid, text)
            elif text and on_pm is not None:
                await call_hook(on_pm, pm.uid, text, what="on_pm")
        except Exception:
            log.exception("PM %d from %s could not be dispatched; dropping it", pm.sequence_id, pm.uid)
        await acker.ack(pm.sequence_id)


class _Backlog:
    """Counts the tips credited from brclient's replay log when a harness
    starts without tip history, and logs them once at INFO. brclient replays
    every unacked tip as soon as the stream opens, before live events
    (docs/clientrpc.md §Acks and replay), but does not mark the end of the replay: it is taken
    to end once no tip arrived for :data:`BACKLOG_QUIET` seconds after the
    stream opened (at most :data:`BACKLOG_MAX` seconds)."""

    def __init__(self) -> None:
        self.open = True
        self.count = 0
        self.by_peer: dict[str, list[int]] = {}  # uid -> [tips, atoms credited]
        self._last = 0.0

    def add(self, uid: str, credited: int) -> None:
        if not self.open:
            return
        self.count += 1
        entry = self.by_peer.setdefault(uid, [0, 0])
        entry[0] += 1
        entry[1] += credited
        self._last = anyio.current_time()

    async def report(self, tips: Subscription[ReceivedTip]) -> None:
        try:
            await tips.wait_open()
        except ClientrpcError:  # closed before it opened: nothing to report
            return
        started = self._last = anyio.current_time()
        while True:
            now = anyio.current_time()
            quiet_until = self._last + BACKLOG_QUIET
            if now >= quiet_until or now - started >= BACKLOG_MAX:
                break
            await anyio.sleep(quiet_until - now)
        self.open = False
        if not self.count:
            log.info("no tip history and no tips waiting in brclient's replay log")
            return
        who = ", ".join(
            f"{uid} ({tips_} tip{'s' if tips_ != 1 else ''}, {atoms} atoms credited)"
            for uid, (tips_, atoms) in self.by_peer.items()
        )
        log.info(
            "no tip history: %d tip%s already waiting in brclient's replay log, from %s",
            self.count,
            "s" if self.count != 1 else "",
            who,
        )


async def _tip_loop(
    tips: Subscription[ReceivedTip],
    harness: Harness,
    on_tip: TipReceivedHook | None,
    acker: Acker,
    backlog: _Backlog | None = None,
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
        if new and backlog is not None:
            backlog.add(tip.uid, credited)
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
        return (
            "the sender is not an allowed caller: held, and credited once its uid is allowed "
            "(brmcp-serve balances lists held tips)"
        )
    if tip.atoms == 0:
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
