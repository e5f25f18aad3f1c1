"""The tasks a :class:`~.harness.Harness` owns, not any session: the run of
each keyed ``tools/call`` (:class:`Runs`) and the lease beat on a shared
book (:func:`heartbeat`).

A keyed call's run (charge → handler → settlement and journal) is started
in the harness's task group, and the session's request handler only waits
for it. When that session is lost (BRIDGE.md §Failures, "The bot's session
is lost during a paid call": brclient could not send one of its PMs, or it
was closed) the run goes on, is settled and journaled under its callKey, and
the caller's retry with the same callKey, on any session, gets that result
without paying or running again (WIRE.md §callKey). A genuine cancel
(``notifications/cancelled`` for that request, seen by :class:`SessionWatch`),
a call without a callKey (nothing could fetch its result) and the harness
stopping still cancel the run, which refunds and journals it as before.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import anyio
from anyio.abc import TaskGroup
from mcp.shared._stream_protocols import ReadStream
from mcp.shared.message import SessionMessage
from mcp.types import CallToolResult, JSONRPCNotification

from brmcp.transport.conn import Conn
from brmcp.transport.sender import SendError

from ._callkeys import error_result
from ._observed import ObservedRead

__all__ = ["CURRENT_SESSION", "Runs", "SessionWatch", "heartbeat"]

log = logging.getLogger("brmcp.server")

#: Peer-cancelled request ids remembered per session (a peer cannot grow it).
_CANCELS_KEPT = 64


class SessionWatch:
    """What the harness knows of one served session: its :class:`Conn`
    (closed once the session is lost; ``error`` a :class:`~brmcp.SendError`
    when brclient could not send one of its PMs) and the request ids its
    peer cancelled with ``notifications/cancelled`` (the last 64).
    :meth:`watch` wraps the session's read stream to see those."""

    __slots__ = ("_cancelled", "conn")

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self._cancelled: OrderedDict[int | str, None] = OrderedDict()

    def watch(self, stream: ReadStream[SessionMessage | Exception]) -> ObservedRead:
        """``stream`` (the session's inbound messages), noting each peer cancel."""
        return ObservedRead(stream, self._inbound)

    def cancelled(self, request_id: Any) -> bool:
        """True when the peer sent ``notifications/cancelled`` for ``request_id``."""
        return request_id is not None and _key(request_id) in self._cancelled

    @property
    def lost(self) -> bool:
        """True once the session is closed (nothing can be sent on it any more)."""
        return self.conn.closed

    @property
    def why(self) -> str:
        """Why the session was lost, for a log line."""
        return "brclient unreachable" if isinstance(self.conn.error, SendError) else "its session closed"

    def _inbound(self, item: SessionMessage | Exception) -> None:
        if not isinstance(item, SessionMessage):
            return
        message = item.message
        if not isinstance(message, JSONRPCNotification) or message.method != "notifications/cancelled":
            return
        request_id = (message.params or {}).get("requestId")
        if isinstance(request_id, int | str) and not isinstance(request_id, bool):
            self._cancelled[_key(request_id)] = None
            while len(self._cancelled) > _CANCELS_KEPT:
                self._cancelled.popitem(last=False)


#: The session whose request the current task serves (set for the life of
#: each served session: its request handlers inherit it).
CURRENT_SESSION: ContextVar[SessionWatch | None] = ContextVar("brmcp_session", default=None)


class _Run:
    """One keyed call's run in the harness's task group: its own cancel
    scope, ``done`` once it ended, and what it ended with."""

    __slots__ = ("detached", "done", "error", "result", "scope")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.result: CallToolResult | None = None
        self.error: Exception | None = None
        self.detached: str | None = None  #: why its session was lost, once it was

    async def main(
        self, work: Callable[[], Awaitable[CallToolResult]], tool: str, peer: str, key: str
    ) -> None:
        # anyio cancels a task only once it started, so this try always runs
        # and ``done`` is always set: its waiter never waits for ever.
        try:
            with self.scope:
                try:
                    self.result = await work()
                except Exception as exc:  # handed to the waiter, which raises it
                    self.error = exc
        finally:
            self.done.set()
            if self.detached is not None:
                if self.result is not None:
                    log.warning(
                        "result of %s for %s kept under callKey %s: %s; "
                        "a retry with the same callKey gets it",
                        tool,
                        peer,
                        key[:8],
                        self.detached,
                    )
                elif self.error is not None:
                    # Nobody waits for it any more: this line is its only trace.
                    log.error(
                        "call of %s for %s (callKey %s) failed after its session was lost (%s): %s",
                        tool,
                        peer,
                        key[:8],
                        self.detached,
                        self.error,
                        exc_info=self.error,
                    )
                else:
                    # Only the harness's task group cancels a detached run: it stopped.
                    log.info(
                        "call of %s for %s (callKey %s) cancelled by the harness stopping after its "
                        "session was lost (%s): any charge refunded, the outcome kept for its callKey",
                        tool,
                        peer,
                        key[:8],
                        self.detached,
                    )


class Runs:
    """The runs of keyed calls, in a task group the harness owns
    (:meth:`bind` while it serves; without one a call runs in its caller's
    task, as a direct :meth:`~.harness.Harness.call` outside ``async with``
    does). ``kept`` counts the runs that outlived their session."""

    def __init__(self) -> None:
        self._tg: TaskGroup | None = None
        self._stopping = False
        self.kept = 0

    def bind(self, tg: TaskGroup | None) -> None:
        """Run keyed calls in ``tg`` from now on (None: in their caller's
        task); a new task group also ends :meth:`stop`."""
        self._tg = tg
        self._stopping = False

    def stop(self) -> None:
        """The harness is stopping: the sessions it closes now are not lost
        but ended, so their calls' runs are cancelled (refunded, journaled)."""
        self._stopping = True

    async def run(
        self,
        work: Callable[[], Awaitable[CallToolResult]],
        *,
        tool: str,
        peer: str,
        call_key: str | None,
        request_id: Any,
        settled: Callable[[], CallToolResult | None],
    ) -> CallToolResult:
        """Run ``work`` (the call's pipeline: claim held, charge, handler,
        settlement) and return its result, or raise what it raised.

        With a task group, a callKey and a served session (:data:`CURRENT_SESSION`),
        ``work`` runs in the harness's task group. If the caller is cancelled
        because that session was lost, the run goes on (logged, counted in
        :attr:`kept`); if the peer cancelled request ``request_id``, or the
        caller was cancelled for any other reason, the run is cancelled and
        this waits, shielded, for it to refund and journal. ``settled``
        gives the outcome the run kept when it ended without returning one
        (the harness stopped under a waiting caller)."""
        tg = self._tg
        session = CURRENT_SESSION.get()
        if tg is None or session is None or call_key is None:
            return await work()
        run = _Run()
        tg.start_soon(run.main, work, tool, peer, call_key)
        try:
            await run.done.wait()
        except BaseException:
            lost = session.lost and not self._stopping and not session.cancelled(request_id)
            if lost and not run.done.is_set():
                # The session is gone, not the caller's wish: the run is the harness's.
                run.detached = session.why
                self.kept += 1
                log.info(
                    "session %s of %s lost (%s) during its call of %s (callKey %s): the call runs on",
                    session.conn.sid,
                    peer,
                    session.why,
                    tool,
                    call_key[:8],
                )
                raise
            run.scope.cancel()
            with anyio.CancelScope(shield=True):
                await run.done.wait()
            raise
        if run.error is not None:
            raise run.error
        if run.result is not None:
            return run.result
        return settled() or error_result("call cancelled")


def _key(request_id: int | str) -> int | str:
    """A request id's correlation key, as the MCP SDK coerces it (``"7"`` is 7)."""
    if isinstance(request_id, str):
        try:
            return int(request_id)
        except ValueError:
            return request_id
    return request_id


async def heartbeat(
    beat: Callable[[], Awaitable[int]], sleep: Callable[[float], Awaitable[None]], every: float
) -> None:
    """Beat this process's lease on a shared book with ``beat()`` (returns
    how many calls of dead members it refunded) every ``every`` seconds of
    ``sleep``, first at once, until cancelled; a failed beat is logged and
    tried again at the next."""
    while True:
        try:
            refunded = await beat()
        except Exception as exc:
            log.error("lease beat on the shared book failed: %s", exc)
        else:
            if refunded:
                log.warning("refunded %d calls of pool members that died", refunded)
        await sleep(every)
