"""A bot link's re-send loop (WIRE.md §Deadlines; :mod:`.retry`): one
request sent to the bot and sent again, same params, on an RTT-sized
backoff until a reply comes or its deadline passes (:class:`DeadlineError`).
:class:`Resender` is that loop, a component each :class:`~.link.BotLink`
owns (:meth:`BotLink.exchange` is its :meth:`Resender.exchange`);
:func:`first_answer` is the same timing for a request on one session
(``initialize``).

Each copy's timer starts when the copy left this side (its
:class:`~brmcp.transport.conn.SendReceipt`: brclient's ``PM`` call returned), and no
copy is sent while the one before it is still waiting to leave (to be
dialed, or in brclient's PM queue): copies queued behind each other would
only add to the queue they wait in.

:class:`CallTally` counts what the copies of one logical call did over
every request of it (each exchange, every pool member, each re-send): the
copies sent and the answers received, from the call's start. The proxy
opens it for the call (:func:`tally_call`); :class:`Resender` and the pools
(:mod:`.pools`) count into the one in force, and the errors that end the
call quote it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar, cast

import anyio
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR
from pydantic import BaseModel, ValidationError

from brmcp.transport.conn import SendReceipt, send_deadline, send_receipt
from brmcp.transport.router import Router

from ._linkbase import TRANSPORT_ERROR_CODES, HostOffline, LinkError, LinkSessions, describe_failure, log
from ._retry import RetryPolicy, RttEstimator

__all__ = [
    "CallTally",
    "DeadlineError",
    "ProgressFn",
    "Resender",
    "current_tally",
    "first_answer",
    "tally_call",
]

_T = TypeVar("_T", bound=BaseModel)
_R = TypeVar("_R")
ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]


def _count(number: int, one: str, many: str | None = None) -> str:
    return f"{number} {one if number == 1 else many or one + 's'}"


class CallTally:
    """What the ``tools/call`` copies of one logical call did, over every
    request of it: each exchange (a reissue after a payment, a re-send of
    the same request), every pool member, each "still running at another
    member" answer. ``started`` is the call's start on
    :func:`anyio.current_time`; ``sends`` the copies handed to a session
    per bot uid (in the order first sent to); ``answers`` the replies
    received per uid, ``still_running`` those of them saying the original
    still runs at another member (WIRE.md §Pools), and ``asks_due`` when
    such a member may be asked next (:mod:`.pools`, across requests)."""

    __slots__ = ("answers", "asks_due", "sends", "started", "still_running")

    def __init__(self) -> None:
        self.started = anyio.current_time()
        self.sends: dict[str, int] = {}
        self.answers: dict[str, int] = {}
        self.still_running: dict[str, int] = {}
        self.asks_due: dict[str, float] = {}

    def sent(self, uid: str) -> None:
        """One more copy was handed to a session for bot ``uid``."""
        self.sends[uid] = self.sends.get(uid, 0) + 1

    def answered(self, uid: str) -> None:
        """Bot ``uid`` replied to a copy (a result, an error, a refusal)."""
        self.answers[uid] = self.answers.get(uid, 0) + 1

    def said_still_running(self, uid: str) -> int:
        """Bot ``uid``'s reply (counted by :meth:`answered`) said the
        original still runs at another member; returns how many of its
        replies in this call said so."""
        self.still_running[uid] = self.still_running.get(uid, 0) + 1
        return self.still_running[uid]

    @property
    def copies(self) -> int:
        """Copies sent to any bot so far."""
        return sum(self.sends.values())

    def elapsed(self) -> float:
        """Seconds since the call started."""
        return anyio.current_time() - self.started

    def describe(self) -> str:
        """What was sent and answered, for an error that ends the call, e.g.
        ``66 copies sent to 3 members, each answered that the call is still
        running at another member (66 answers)``."""
        if not self.sends:
            return "no copy could be sent"
        sent = f"{_count(self.copies, 'copy', 'copies')} sent to {_count(len(self.sends), 'member')}"
        answers = sum(self.answers.values())
        if not answers:
            return f"{sent}, none answered"
        still = sum(self.still_running.values())
        what = "that the call is still running at another member"
        quiet = [uid[:8] for uid in self.sends if not self.answers.get(uid)]
        if still == answers and not quiet:
            who = "each answered" if len(self.sends) > 1 else "which answered"
            return f"{sent}, {who} {what} ({_count(answers, 'answer')})"
        parts = [f"{still} {what}"] if still else []
        if answers - still:
            parts.append(f"{answers - still} to an earlier request of the call")
        text = f"{sent}; {_count(answers, 'answer')}: {', '.join(parts)}"
        return f"{text}; no answer from {', '.join(quiet)}" if quiet else text


_TALLY: ContextVar[CallTally | None] = ContextVar("brmcp_call_tally", default=None)


def current_tally() -> CallTally | None:
    """The :class:`CallTally` of the logical call running in this context, if any."""
    return _TALLY.get()


@contextmanager
def tally_call() -> Iterator[CallTally]:
    """The tally of the logical call running in this context: the one in
    force, else a new one for the block (a new logical call). Tasks started
    inside the block count into it too (they copy the context)."""
    current = _TALLY.get()
    if current is not None:
        yield current
        return
    tally = CallTally()
    token = _TALLY.set(tally)
    try:
        yield tally
    finally:
        _TALLY.reset(token)


class _Copy:
    """One copy of a request: its send receipt, the RTO its timer runs
    (seconds), and when (:func:`anyio.current_time`) it was started and
    handed to its session. ``measure``: its reply may be a round-trip
    sample (not a copy the bot holds, e.g. for a payment)."""

    __slots__ = ("ended", "handed_at", "measure", "receipt", "rto", "started")

    def __init__(self, rto: float, *, measure: bool = True) -> None:
        self.receipt = SendReceipt()
        self.rto = rto
        self.measure = measure
        self.started = anyio.current_time()
        self.handed_at: float | None = None
        self.ended = False

    def handed(self) -> None:
        """The copy is about to be written (called right before the request)."""
        self.handed_at = anyio.current_time()

    def end(self) -> None:
        """The copy's task finished (answered, failed or cancelled)."""
        self.ended = True
        self.receipt.settled.set()

    @property
    def left_at(self) -> float | None:
        """When the copy left this side; None while it waits to (or never did)."""
        receipt = self.receipt
        if receipt.left_at is not None:
            return receipt.left_at
        if self.handed_at is not None and not receipt.claimed and not receipt.failed:
            # Handed over but written outside this context (not through a
            # Conn): timed from the hand-over, so re-sends never stop.
            return self.handed_at
        return None

    @property
    def waiting(self) -> bool:
        """Still waiting to leave: no other copy may be sent meanwhile."""
        return self.left_at is None and not self.ended and not self.receipt.failed

    def answered(self, rtt: RttEstimator) -> bool:
        """The copy's reply arrived now: a round-trip sample when it may be
        (:meth:`~.retry.RttEstimator.answered`). Returns whether it was."""
        left = self.left_at
        if left is None or not self.measure:
            return False
        return rtt.answered(anyio.current_time() - left, self.rto)


async def first_answer(
    rtt: RttEstimator,
    ask: Callable[[], Awaitable[_R]],
    *,
    limit: float,
    on_resend: Callable[[], None] | None = None,
    on_sample: Callable[[], None] | None = None,
) -> _R:
    """Call ``ask`` (one copy of a request on one session) and again on the
    RTO backoff of ``rtt`` until a copy answers, and return the first
    answer; the copies still waiting are then cancelled. The first copy's
    timer is ``rtt.rto``; each expiry doubles it and is kept in ``rtt``
    (RFC 6298 §5.5); each timer starts when its copy left this side, and no
    copy is sent while the last one waits to leave. The answer is a
    round-trip sample when it may be (:mod:`.retry`); ``on_sample`` is then
    called, and ``on_resend`` for every copy after the first.

    Raises TimeoutError after ``limit`` seconds without an answer, and the
    first exception a copy raises (the other copies are cancelled)."""
    start = anyio.current_time()
    end = start + limit
    outcome: list[tuple[_R] | BaseException] = []
    done = anyio.Event()

    async def one(copy: _Copy) -> None:
        token = send_receipt.set(copy.receipt)
        try:
            copy.handed()
            try:
                result = await ask()
            except Exception as exc:
                outcome.append(exc)
                done.set()
                return
            if copy.answered(rtt) and on_sample is not None:
                on_sample()
            outcome.append((result,))
            done.set()
        finally:
            send_receipt.reset(token)
            copy.end()

    async with anyio.create_task_group() as tg:
        copy = _Copy(rtt.rto)
        tg.start_soon(one, copy)
        while not done.is_set():
            now = anyio.current_time()
            if now >= end:
                break
            left = copy.left_at
            if copy.waiting or left is None:
                # Waiting to leave (or ended without leaving, which ends the
                # request through ``done``): no timer runs yet.
                wait_until = end
                events = [done, copy.receipt.settled]
            else:
                wait_until = min(left + copy.rto, end)
                events = [done]
            with anyio.move_on_after(max(0.0, wait_until - now)):
                await _first_of(*events)
            if done.is_set() or anyio.current_time() < wait_until or anyio.current_time() >= end:
                continue
            gap = rtt.expired(copy.rto)
            if on_resend is not None:
                on_resend()
            copy = _Copy(gap)
            tg.start_soon(one, copy)
        tg.cancel_scope.cancel()
    if not outcome:
        raise TimeoutError
    first = outcome[0]
    if isinstance(first, BaseException):
        raise first
    return first[0]


class DeadlineError(LinkError):
    """No reply to a request (nor to any re-sent copy) before its deadline.
    ``sends`` counts the copies sent, ``seconds`` the time waited."""

    def __init__(self, message: str, *, sends: int, seconds: float) -> None:
        super().__init__(message)
        self.sends = sends
        self.seconds = seconds


def _nothing() -> None:
    return None


class Resender:
    """The re-send loop of one bot link. ``uid`` is the bot's (it names the
    bot in errors); ``sessions`` the link's sessions (:class:`LinkSessions`:
    every copy leases the shared session, a transport failure resets it, an
    era refusal switches the link's era); ``router`` the bridge's router,
    whose message TTL is a request's deadline and whose unix clock caps
    each copy's ``exp``; ``rtt`` the link's estimator, which paces the
    copies; ``retry`` gives the least gap after a failed copy
    (``minimum``); ``on_sample`` is called after a reply that was a
    round-trip sample (the link may persist the RTT)."""

    def __init__(
        self,
        uid: str,
        sessions: LinkSessions,
        router: Router,
        rtt: RttEstimator,
        retry: RetryPolicy,
        *,
        on_sample: Callable[[], None] = _nothing,
    ) -> None:
        self.uid = uid
        self.rtt = rtt
        self._sessions = sessions
        self._router = router
        self._retry = retry
        self._on_sample = on_sample
        #: Copies sent again because no reply came in time (observability),
        #: here and by the link's ``initialize`` (:meth:`count_resend`).
        self.resends = 0

    def count_resend(self) -> None:
        """One more copy was sent again (the ``on_resend`` of :func:`first_answer`)."""
        self.resends += 1

    async def exchange(
        self,
        request: Any,
        result_type: type[_T],
        *,
        progress: ProgressFn | None = None,
        quiet: anyio.Event | None = None,
        deadline: float | None = None,
    ) -> _T:
        """Send ``request`` and return the bot's reply, re-sending the same
        request (same params, so the same callKey) on the RTT-sized backoff
        of :mod:`.retry` until a reply arrives or the deadline passes. The
        deadline is the router's message TTL from the first send, and every
        copy's ``exp`` is capped at it, so the bot never runs a copy the
        bridge stopped waiting for. The first reply wins; the others are
        dropped (the bot replays one outcome per callKey). Each copy's timer
        starts when it left this side, no copy is sent while the last one
        still waits to leave, and the winning reply is a round-trip sample
        when it may be (:mod:`.retry`).

        A copy that fails in transport resets the link (the next copy dials
        a fresh session) and is followed at once by another. An error the
        bot answered is final, except the first one, which resets the link
        and is tried once more on a fresh session (a bot that forgot the
        session answers with an error). An error answered on a session the
        link has since dropped is not the bot's verdict on this request:
        the copies on the current session decide.

        ``quiet``: while this event is unset no copy is sent (the bot is
        expected to hold the request, e.g. until a payment lands).
        ``deadline`` (on :func:`anyio.current_time`) ends the wait earlier:
        the logical call's own deadline.

        A copy that fails while the bridge's own brclient is down (its PM
        sender says so, :meth:`LinkSessions.host_offline`) ends the request
        at once with :class:`HostOffline`: no copy can reach the bot.

        Raises :class:`DeadlineError` at the deadline, :class:`HostOffline`,
        :class:`LinkError` when the link is closed, and :class:`MCPError`
        for the bot's error."""
        start = anyio.current_time()
        # Only the copies of a tools/call are the logical call's (a tools/list
        # refresh spawned meanwhile runs in a copy of this context too).
        tally = current_tally() if getattr(request, "method", None) == "tools/call" else None
        ttl = self._router.options.ttl
        if deadline is not None:
            ttl = max(0.0, min(ttl, deadline - start))
        end = start + ttl
        # A bot accepts a part until floor(now) > exp (WIRE.md §Deadlines), up
        # to a second past exp: cap exp one second early so no copy can start
        # after the bridge stopped waiting.
        cap = self._router._clock() + (ttl - 1 if ttl > 2 else ttl)
        replies: list[_T | MCPError] = []
        done = anyio.Event()
        sends = 0
        bot_errors = 0
        heard = start
        last: list[BaseException] = []
        wakes = [anyio.Event()]

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            # Only asked for when the agent wants progress (the bot is not
            # asked for progress nobody reads); it also proves the bot is working.
            nonlocal heard
            heard = anyio.current_time()
            if progress is not None:
                await progress(value, total, message)

        callback = cast(ProgressFnT, on_progress) if progress is not None else None

        def offline() -> bool:
            """The bridge's own brclient is down (a copy just failed because
            of it): the request fails now, naming it (:class:`HostOffline`)."""
            reason = self._sessions.host_offline()
            if reason is None:
                return False
            replies.append(HostOffline(reason))  # type: ignore[arg-type]
            done.set()
            return True

        async def attempt(copy: _Copy) -> None:
            nonlocal sends, bot_errors
            token = send_deadline.set(cap)
            receipt_token = send_receipt.set(copy.receipt)
            try:
                async with self._sessions.lease() as (session, gen):
                    sends += 1
                    if tally is not None:
                        tally.sent(self.uid)
                    copy.handed()
                    try:
                        reply = await session.send_request(
                            request,
                            result_type,
                            progress_callback=callback,
                        )
                    except MCPError as exc:
                        if tally is not None and exc.error.code not in TRANSPORT_ERROR_CODES:
                            tally.answered(self.uid)
                        if exc.error.code in TRANSPORT_ERROR_CODES:
                            self._sessions.reset(gen)
                            last.append(exc)
                            if not offline():
                                wakes[-1].set()
                            return
                        if self._sessions.era_refused(exc, gen):
                            # The bot wants the handshake era: the next copy
                            # (same request, same callKey) initializes first.
                            last.append(exc)
                            wakes[-1].set()
                            return
                        if not self._sessions.is_current(gen):
                            # The answer to a copy on a session already
                            # dropped: a restarted bot answers every stale
                            # copy queued at the relay with the SDK's
                            # before-initialize error. A copy on the fresh
                            # session decides (sent already, or by the timer).
                            last.append(exc)
                            return
                        bot_errors += 1
                        if bot_errors == 1:
                            log.info("bot %s answered %s; trying a fresh session", self.uid[:8], exc)
                            self._sessions.reset(gen)
                            last.append(exc)
                            wakes[-1].set()
                            return
                        replies.append(exc)
                        done.set()
                        return
                    except ValidationError as exc:
                        # An answer that is not a valid result for this
                        # request (e.g. a modern result without resultType):
                        # one clear line for the agent, not a task-group trace.
                        count = exc.error_count()
                        log.info("bot %s answered an invalid result: %s", self.uid[:8], exc)
                        replies.append(
                            MCPError(
                                INTERNAL_ERROR,
                                f"bot {self.uid[:8]} answered with an invalid result ({count} problem(s) in"
                                " its shape); a paid call may have been charged for it",
                            )
                        )
                        done.set()
                        return
                    if tally is not None:
                        tally.answered(self.uid)
                    if not replies and copy.answered(self.rtt):
                        self._on_sample()
                    replies.append(reply)
                    done.set()
            except HostOffline as exc:
                last.append(exc)
                replies.append(exc)  # type: ignore[arg-type]
                done.set()
            except LinkError as exc:
                last.append(exc)
                if self._sessions.closed:
                    replies.append(exc)  # type: ignore[arg-type]
                    done.set()
                else:
                    offline()
            finally:
                send_receipt.reset(receipt_token)
                send_deadline.reset(token)
                copy.end()

        def held() -> bool:
            return quiet is not None and not quiet.is_set()

        async with anyio.create_task_group() as tg:
            gap = self.rtt.rto
            copy = _Copy(gap, measure=not held())
            tg.start_soon(attempt, copy)
            was_held = held()
            # A copy failed in transport: the next one is due then, timer or not.
            soon: float | None = None
            while not done.is_set():
                now = anyio.current_time()
                if now >= end:
                    break
                events = [done, wakes[-1]]
                if was_held:
                    assert quiet is not None
                    events.append(quiet)
                left = copy.left_at
                if copy.waiting:
                    # Still to be dialed, or in brclient's PM queue: no timer
                    # runs and no copy joins it in that queue.
                    wait_until = end
                    events.append(copy.receipt.settled)
                elif left is None:
                    # Ended without leaving (its dial or its send failed): the
                    # next copy one gap after it started, sooner after a
                    # transport failure.
                    wait_until = copy.started + gap if soon is None else soon
                else:
                    # The bot is working on it when it reports progress.
                    wait_until = max(left, heard) + gap
                    if soon is not None:
                        wait_until = min(wait_until, soon)
                with anyio.move_on_after(max(0.0, min(wait_until, end) - now)):
                    await _first_of(*events)
                if done.is_set():
                    break
                now = anyio.current_time()
                if now >= end:
                    break
                if was_held and not held():
                    # The hold just ended: the bot answers one round trip from now.
                    was_held = False
                    heard = now
                    continue
                if wakes[-1].is_set():
                    # A copy failed in transport: send the next one soon, not at once.
                    wakes[-1] = anyio.Event()
                    soon = max(now, copy.started + self._retry.minimum)
                    continue
                if now < wait_until or copy.waiting:
                    continue
                if held():
                    # A call the bot holds for a payment under way (WIRE.md
                    # §Pay alongside): its silence is expected until then.
                    heard = now
                    continue
                # The copy's timer expired: back off, and keep the backed-off
                # RTO for the next requests (RFC 6298 §5.5). After a failure,
                # not a lost copy, this request backs off alone.
                expired = soon is None and left is not None
                gap = self.rtt.expired(gap) if expired else self.rtt.clamp(gap * 2)
                soon = None
                self.resends += 1
                copy = _Copy(gap, measure=not held())
                tg.start_soon(attempt, copy)
            tg.cancel_scope.cancel()
        if replies:
            reply = replies[0]
            if isinstance(reply, HostOffline):
                raise HostOffline(str(reply), sends=sends) from None
            if isinstance(reply, LinkError | MCPError):
                raise reply
            return reply
        waited = anyio.current_time() - start
        why = f" (last failure: {describe_failure(last[-1])})" if last else ""
        took = f"{waited:.0f}" if waited >= 1 else f"{waited:.1f}"
        text = f"no reply from bot {self.uid[:8]} within {took} s after {sends} send(s){why}"
        if sends == 0:
            text = f"the call's deadline passed before the request could be sent to bot {self.uid[:8]}{why}"
        raise DeadlineError(
            text,
            sends=sends,
            seconds=waited,
        )


async def _first_of(*events: anyio.Event) -> None:
    """Return once any of ``events`` is set."""
    async with anyio.create_task_group() as tg:

        async def _wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(_wait, event)
