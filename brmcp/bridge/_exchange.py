"""A bot link's re-send loop (WIRE.md §Deadlines; :mod:`.retry`): one
request sent to the bot and sent again, same params, on an RTT-sized
backoff until a reply comes or its deadline passes (:class:`DeadlineError`).
:class:`ExchangeMixin` gives :class:`~.link.BotLink` its
:meth:`~ExchangeMixin.exchange`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
from mcp import ClientSession
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR
from pydantic import BaseModel, ValidationError

from ..conn import send_deadline
from ..router import Router
from ._linkbase import TRANSPORT_ERROR_CODES, LinkError, _describe, log
from .retry import RetryPolicy, RttEstimator

__all__ = ["DeadlineError", "ExchangeMixin", "ProgressFn"]

_T = TypeVar("_T", bound=BaseModel)
ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]


class DeadlineError(LinkError):
    """No reply to a request (nor to any re-sent copy) before its deadline.
    ``sends`` counts the copies sent, ``seconds`` the time waited."""

    def __init__(self, message: str, *, sends: int, seconds: float) -> None:
        super().__init__(message)
        self.sends = sends
        self.seconds = seconds


class ExchangeMixin:
    """The re-send loop of :class:`~.link.BotLink`, which sets the state
    declared here and defines the methods declared under TYPE_CHECKING."""

    uid: str
    resends: int
    rtt: RttEstimator
    _router: Router
    _retry: RetryPolicy
    _closed: bool

    if TYPE_CHECKING:

        def lease(self) -> AbstractAsyncContextManager[tuple[ClientSession, int]]: ...

        def reset(self, gen: int | None = None) -> bool: ...

        def era_refused(self, exc: BaseException, gen: int, *, probe: bool = False) -> bool: ...

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
        dropped (the bot replays one outcome per callKey).

        A copy that fails in transport resets the link (the next copy dials
        a fresh session) and is followed at once by another. An error the
        bot answered is final, except the first one, which resets the link
        and is tried once more on a fresh session (a bot that forgot the
        session answers with an error).

        ``quiet``: while this event is unset no copy is sent (the bot is
        expected to hold the request, e.g. until a payment lands).
        ``deadline`` (on :func:`anyio.current_time`) ends the wait earlier:
        the logical call's own deadline.

        Raises :class:`DeadlineError` at the deadline, :class:`LinkError`
        when the link is closed, and :class:`MCPError` for the bot's error."""
        start = anyio.current_time()
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

        async def attempt() -> None:
            nonlocal sends, bot_errors
            token = send_deadline.set(cap)
            try:
                async with self.lease() as (session, gen):
                    sends += 1
                    first = sends == 1
                    sent = anyio.current_time()
                    try:
                        reply = await session.send_request(
                            request,
                            result_type,
                            progress_callback=callback,
                        )
                    except MCPError as exc:
                        if exc.error.code in TRANSPORT_ERROR_CODES:
                            self.reset(gen)
                            last.append(exc)
                            wakes[-1].set()
                            return
                        if self.era_refused(exc, gen):
                            # The bot wants the handshake era: the next copy
                            # (same request, same callKey) initializes first.
                            last.append(exc)
                            wakes[-1].set()
                            return
                        bot_errors += 1
                        if bot_errors == 1:
                            log.info("bot %s answered %s; trying a fresh session", self.uid[:8], exc)
                            self.reset(gen)
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
                    if first and sends == 1:
                        self.rtt.sample(anyio.current_time() - sent)
                    replies.append(reply)
                    done.set()
            except LinkError as exc:
                last.append(exc)
                if self._closed:
                    replies.append(exc)  # type: ignore[arg-type]
                    done.set()
            finally:
                send_deadline.reset(token)

        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt)
            gap = self.rtt.rto
            due = start + gap
            last_send = start
            held = quiet is not None and not quiet.is_set()
            while not done.is_set():
                now = anyio.current_time()
                if now >= end:
                    break
                with anyio.move_on_after(max(0.0, min(due, end) - now)):
                    if held:
                        assert quiet is not None
                        await _first_of(done, wakes[-1], quiet)
                    else:
                        await _first_of(done, wakes[-1])
                if done.is_set():
                    break
                now = anyio.current_time()
                if now >= end:
                    break
                if held and quiet is not None and quiet.is_set():
                    # The hold just ended: the bot answers one round trip from now.
                    held = False
                    heard = now
                    due = now + gap
                    continue
                if wakes[-1].is_set():
                    # A copy failed in transport: send the next one soon, not at once.
                    wakes[-1] = anyio.Event()
                    due = min(due, max(now, last_send + self._retry.minimum))
                    continue
                if now < due:
                    continue
                if quiet is not None and not quiet.is_set():
                    # A call the bot holds for a payment under way (WIRE.md
                    # §Pay alongside): its silence is expected until then.
                    heard = now
                if heard > due - gap:
                    due = heard + gap  # the bot is working on it: no copy yet
                    continue
                self.resends += 1
                tg.start_soon(attempt)
                last_send = now
                gap = self.rtt.clamp(gap * 2)
                due = now + gap
            tg.cancel_scope.cancel()
        if replies:
            reply = replies[0]
            if isinstance(reply, LinkError | MCPError):
                raise reply
            return reply
        waited = anyio.current_time() - start
        why = f" (last failure: {_describe(last[-1])})" if last else ""
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
