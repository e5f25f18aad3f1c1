"""In-memory callKey claims and outcome replay (WIRE.md §callKey).

A claim is keyed by ``(peer, callKey)``: the first call runs, duplicates
wait for it and get its outcome. Completed outcomes are replayed for
``window`` seconds (30 minutes). A refusal before execution releases the
claim; waiting duplicates then get a clear tool error and a later retry
with the same key runs for real. A replayed outcome is never a refusal: it
goes through :func:`._guard.recorded_outcome` (WIRE.md §Payments, "Genuine
refusals"), whoever recorded it.

On a book several processes share (PostgreSQL, a bot pool: WIRE.md §Pools)
this registry only dedups inside one process; the database decides across
them, in the charging transaction (:func:`.store.journal.key_holder`). A
key another process holds raises :class:`KeyClaimedElsewhere` from the
charge, and :func:`await_elsewhere` answers the duplicate from the shared
row: the recorded outcome once it is done, after polling with backoff
(:data:`POLL_FIRST` doubling to :data:`POLL_MAX` seconds) for at most
:data:`SHARED_WAIT` seconds while it runs.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from mcp.types import CallToolResult, TextContent

from brmcp.protocol.payment import CALL_KEY, valid_call_key
from brmcp.protocol.pool import STILL_RUNNING_ELSEWHERE

from ._guard import recorded_outcome
from ._timer import timer_now

if TYPE_CHECKING:
    from brmcp._ops.clock import Clock
    from brmcp.server.store.journal import KeyHolder

__all__ = [
    "POLL_FIRST",
    "POLL_MAX",
    "REPLAY_WINDOW",
    "SHARED_WAIT",
    "CallKeyRegistry",
    "Claim",
    "KeyClaimedElsewhere",
    "await_elsewhere",
    "call_key_from_meta",
]

#: Seconds a completed outcome is replayed to duplicates.
REPLAY_WINDOW = 30 * 60.0
#: Text for duplicates of a completed call whose outcome is not retained.
NOT_RETAINED_TEXT = "duplicate call: outcome not retained across a restart"
_EVICTED_TEXT = "duplicate call: outcome no longer retained"
#: Seconds a duplicate waits for the original running at another process
#: sharing the book before it answers :data:`STILL_RUNNING_TEXT` (a tool
#: error, uncharged; a retry with the same callKey asks again). A dead
#: original is settled by recovery well before: its owner's lease expires
#: after :data:`.store.journal.LEASE_EXPIRY` seconds.
SHARED_WAIT = 120.0
#: First and longest pause, in seconds, between two reads of the shared row.
POLL_FIRST = 0.05
POLL_MAX = 2.0
STILL_RUNNING_TEXT = f"{STILL_RUNNING_ELSEWHERE}; retry with the same callKey"
_GONE_TEXT = (
    "duplicate call: the original call with this callKey was refused before running; "
    "retry with the same callKey"
)


class KeyClaimedElsewhere(Exception):
    """The shared book already holds this (peer, callKey): another process
    (or an earlier run) charged it. ``holder`` is the row as the charging
    transaction read it (:class:`.store.journal.KeyHolder`); nothing was
    charged."""

    def __init__(self, holder: KeyHolder) -> None:
        super().__init__(f"callKey held ({holder.state})")
        self.holder = holder


def _replayed(holder: KeyHolder) -> CallToolResult:
    """What a duplicate of the completed call ``holder`` answers."""
    if holder.outcome is None:
        return error_result(NOT_RETAINED_TEXT)
    return _outcome(holder.outcome.encode())


async def await_elsewhere(
    holder: KeyHolder,
    read: Callable[[], Awaitable[KeyHolder | None]],
    timer: Clock | None,
    *,
    wait: float = SHARED_WAIT,
) -> tuple[CallToolResult, float | None]:
    """Answer a duplicate whose original is ``holder`` at another process:
    its recorded outcome (:func:`._guard.recorded_outcome`: never a
    refusal) once done, reading the row again with ``read`` (None: the key
    is free again) after pauses of :data:`POLL_FIRST` doubling to
    :data:`POLL_MAX` seconds on ``timer`` (None: anyio's clock), for at most
    ``wait`` seconds. Returns ``(answer, expires)``: ``expires`` (unix
    seconds, the end of the row's replay window) when the answer is the
    recorded outcome, None for a tool error telling the caller to retry
    with the same key (still running, or the row gone because the original
    was refused before running). A failing ``read`` propagates."""
    deadline = timer_now(timer) + wait
    pause = POLL_FIRST
    current: KeyHolder | None = holder
    while True:
        if current is None:
            return error_result(_GONE_TEXT), None
        if current.state == "done":
            return _replayed(current), current.expires
        remaining = deadline - timer_now(timer)
        if remaining <= 0:
            return error_result(STILL_RUNNING_TEXT), None
        step = min(pause, remaining)
        if timer is None:
            await anyio.sleep(step)
        else:
            await timer.sleep(step)
        pause = min(pause * 2, POLL_MAX)
        current = await read()


def call_key_from_meta(meta: Any) -> str | None:
    """The ``brmcp/callKey`` of a ``tools/call`` request's ``_meta`` (a
    dict) when it is a string of 8..128 UTF-8 bytes
    (:func:`brmcp.protocol.payment.valid_call_key`), else None: the call
    runs unkeyed (WIRE.md §callKey)."""
    if not isinstance(meta, dict):
        return None
    key = meta.get(CALL_KEY)
    return key if valid_call_key(key) else None


def error_result(text: str) -> CallToolResult:
    """A tool error result with a single text content."""
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


class Claim:
    """One claimed key. ``outcome`` is set when the original finished;
    ``refusal`` (the reason) when it was refused before running, with
    ``refused`` the answer the original got when there was one; ``pending``
    while the original's result is ready but its completion could not be
    journaled (:meth:`CallKeyRegistry.hold`): a duplicate calls it, which
    journals the completion and answers the result, or says it is still
    kept."""

    __slots__ = ("event", "expires", "key", "outcome", "pending", "refusal", "refused", "size")

    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.event = anyio.Event()
        self.outcome: CallToolResult | None = None
        self.refusal: str | None = None
        self.refused: CallToolResult | None = None
        self.pending: Callable[[], Awaitable[CallToolResult]] | None = None
        self.expires = float("inf")
        self.size = 0

    @property
    def finished(self) -> bool:
        return self.event.is_set()


class CallKeyRegistry:
    """Claims per (peer, callKey). Not thread-safe; one event loop.

    In-flight claims are :class:`Claim` objects; a completed outcome is
    kept as ``(expires, JSON bytes, size)`` and parsed again for each
    duplicate. Keeping tens of thousands of outcomes as pydantic objects for
    the 30-minute window would make every full garbage collection (which
    runs on the event loop) walk all of them; bytes cost it nothing.

    ``max_retained_bytes`` bounds the memory held by replayable outcomes;
    past it the oldest outcomes are dropped (their keys stay claimed until
    expiry, so they still never run twice; duplicates get a tool error).
    """

    def __init__(
        self,
        *,
        window: float = REPLAY_WINDOW,
        clock: Callable[[], float] = time.time,
        max_retained_bytes: int = 256 << 20,
    ) -> None:
        self.window = window
        self._clock = clock
        self._max_bytes = max_retained_bytes
        self._claims: dict[tuple[str, str], Claim] = {}
        #: completed: key -> (expires, outcome JSON or None when not retained, size)
        self._done: OrderedDict[tuple[str, str], tuple[float, bytes | None, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._claims) + len(self._done)

    def claim(self, peer: str, key: str) -> tuple[Claim, bool]:
        """Claim ``key`` for ``peer``. Returns ``(claim, duplicate)``;
        ``duplicate`` True means another call holds it or completed it
        (wait with :meth:`wait`). Expired outcomes are purged first."""
        now = self._clock()
        self._purge(now)
        k = (peer, key)
        existing = self._claims.get(k)
        if existing is not None:
            return existing, True
        done = self._done.get(k)
        if done is not None and done[0] <= now:
            # Kept with another process's window (out of expiry order).
            del self._done[k]
            self._bytes -= done[2]
            done = None
        if done is not None:
            replay = Claim(k)
            replay.expires = done[0]
            replay.outcome = _outcome(done[1])
            replay.event.set()
            return replay, True
        claim = Claim(k)
        self._claims[k] = claim
        return claim, False

    def finish(
        self,
        claim: Claim,
        outcome: CallToolResult,
        size: int,
        outcome_json: str | None = None,
        expires: float | None = None,
    ) -> None:
        """Record the original's outcome (``size``: its JSON bytes;
        ``outcome_json``: that JSON when the caller has it) and wake
        duplicates; replayable until now + window, or until ``expires``
        (unix seconds: an outcome another process recorded keeps its own
        window)."""
        if self._claims.get(claim.key) is not claim or (claim.finished and claim.pending is None):
            return
        claim.pending = None
        claim.outcome = outcome  # for the duplicates waiting right now
        claim.size = size
        claim.expires = self._clock() + self.window if expires is None else expires
        del self._claims[claim.key]
        if outcome_json is None:
            outcome_json = outcome.model_dump_json(by_alias=True, exclude_none=True)
        self._remember(claim.key, claim.expires, outcome_json.encode(), size)
        claim.event.set()
        self._enforce_memory()

    def hold(self, claim: Claim, pending: Callable[[], Awaitable[CallToolResult]]) -> None:
        """The original's result is ready but its completion could not be
        journaled: the key stays claimed (it never runs again), and every
        duplicate, waiting now or later, gets ``pending()`` (which journals
        the completion and then :meth:`finish` es the claim, or answers that
        the result is still kept)."""
        if self._claims.get(claim.key) is not claim:
            return
        claim.pending = pending
        claim.event.set()

    def release(self, claim: Claim, reason: str, answer: CallToolResult | None = None) -> None:
        """Forget a claim refused before execution and wake duplicates.
        ``answer`` is the refusal the original got (``payment_required``,
        rate limited...): the duplicates waiting right now get the same
        answer, so two deliveries of one request are answered alike
        (WIRE.md §callKey). Later calls with the key run afresh."""
        if self._claims.get(claim.key) is claim:
            del self._claims[claim.key]
        claim.refusal = reason
        claim.refused = answer
        claim.event.set()

    def load(self, peer: str, key: str, outcome: CallToolResult | None, expires: float, size: int) -> None:
        """Restore a completed call from the journal at start-up (``outcome``
        None: not retained). The outcome is replayed as
        :func:`._guard.recorded_outcome` makes it: never a refusal, even
        when an older version recorded refusal-shaped tool output."""
        k = (peer, key)
        self._claims.pop(k, None)
        if outcome is None:
            self._remember(k, expires, None, 0)
            return
        data = recorded_outcome(outcome).model_dump_json(by_alias=True, exclude_none=True).encode()
        self._remember(k, expires, data, len(data))

    async def wait(self, claim: Claim) -> CallToolResult:
        """Wait for the original call and return what a duplicate answers."""
        await claim.event.wait()
        if claim.outcome is not None:
            return claim.outcome
        if claim.pending is not None:
            return await claim.pending()
        if claim.refused is not None:
            return claim.refused.model_copy(deep=True)
        reason = claim.refusal or "refused"
        return error_result(
            f"duplicate call: the original call with this callKey was refused before running ({reason}); "
            "retry with the same callKey"
        )

    def _remember(self, key: tuple[str, str], expires: float, data: bytes | None, size: int) -> None:
        old = self._done.pop(key, None)
        if old is not None:
            self._bytes -= old[2]
        self._done[key] = (expires, data, size)
        self._bytes += size

    def _purge(self, now: float) -> None:
        done = self._done
        while done:
            key, (expires, _, size) = next(iter(done.items()))
            if expires > now:
                break
            del done[key]
            self._bytes -= size

    def _enforce_memory(self) -> None:
        if self._bytes <= self._max_bytes:
            return
        for key, (expires, data, size) in list(self._done.items()):
            if self._bytes <= self._max_bytes:
                break
            if size and data is not None:
                self._bytes -= size
                self._done[key] = (expires, _EVICTED, 0)


#: Marker for an outcome dropped to respect ``max_retained_bytes``.
_EVICTED = b""


def _outcome(data: bytes | None) -> CallToolResult:
    if data is None:
        return error_result(NOT_RETAINED_TEXT)
    if data == _EVICTED:
        return error_result(_EVICTED_TEXT)
    try:
        outcome = CallToolResult.model_validate_json(data)
    except ValueError:
        return error_result(NOT_RETAINED_TEXT)
    return recorded_outcome(outcome)
