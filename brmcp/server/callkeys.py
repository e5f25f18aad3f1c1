"""In-memory callKey claims and outcome replay (go-brmcp.md §3.6, §3.8).

A claim is keyed by ``(peer, callKey)``: the first call runs, duplicates
wait for it and get its outcome. Completed outcomes are replayed for
``window`` seconds (30 minutes). A refusal before execution releases the
claim; waiting duplicates then get a clear tool error and a later retry
with the same key runs for real.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import anyio
from mcp.types import CallToolResult, TextContent

__all__ = ["REPLAY_WINDOW", "CallKeyRegistry", "Claim"]

#: Seconds a completed outcome is replayed to duplicates.
REPLAY_WINDOW = 30 * 60.0
#: Text for duplicates of a completed call whose outcome is not retained.
NOT_RETAINED_TEXT = "duplicate call: outcome not retained across a restart"
_EVICTED_TEXT = "duplicate call: outcome no longer retained"


def error_result(text: str) -> CallToolResult:
    """A tool error result with a single text content."""
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


class Claim:
    """One claimed key. ``outcome`` is set when the original finished;
    ``refusal`` when it was refused before running."""

    __slots__ = ("event", "expires", "key", "outcome", "refusal", "size")

    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.event = anyio.Event()
        self.outcome: CallToolResult | None = None
        self.refusal: str | None = None
        self.expires = float("inf")
        self.size = 0

    @property
    def finished(self) -> bool:
        return self.event.is_set()


class CallKeyRegistry:
    """Claims per (peer, callKey). Not thread-safe; one event loop.

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
        self._done: OrderedDict[tuple[str, str], Claim] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._claims)

    def claim(self, peer: str, key: str) -> tuple[Claim, bool]:
        """Claim ``key`` for ``peer``. Returns ``(claim, duplicate)``;
        ``duplicate`` True means another call holds it (wait with
        :meth:`wait`). Expired outcomes are purged first."""
        self._purge(self._clock())
        k = (peer, key)
        existing = self._claims.get(k)
        if existing is not None:
            return existing, True
        claim = Claim(k)
        self._claims[k] = claim
        return claim, False

    def finish(self, claim: Claim, outcome: CallToolResult, size: int) -> None:
        """Record the original's outcome (``size``: its JSON bytes) and wake
        duplicates; replayable until now + window."""
        if self._claims.get(claim.key) is not claim or claim.finished:
            return
        claim.outcome = outcome
        claim.size = size
        claim.expires = self._clock() + self.window
        self._done[claim.key] = claim
        self._bytes += size
        claim.event.set()
        self._enforce_memory()

    def release(self, claim: Claim, reason: str) -> None:
        """Forget a claim refused before execution and wake duplicates."""
        if self._claims.get(claim.key) is claim:
            del self._claims[claim.key]
        claim.refusal = reason
        claim.event.set()

    def load(self, peer: str, key: str, outcome: CallToolResult | None, expires: float, size: int) -> None:
        """Restore a completed call from the journal at start-up (``outcome``
        None: not retained)."""
        k = (peer, key)
        claim = Claim(k)
        claim.outcome = outcome if outcome is not None else error_result(NOT_RETAINED_TEXT)
        claim.expires = expires
        claim.size = size if outcome is not None else 0
        claim.event.set()
        old = self._claims.get(k)
        if old is not None and old.key in self._done:
            self._bytes -= old.size
            del self._done[old.key]
        self._claims[k] = claim
        self._done[k] = claim
        self._bytes += claim.size

    async def wait(self, claim: Claim) -> CallToolResult:
        """Wait for the original call and return what a duplicate answers."""
        await claim.event.wait()
        if claim.outcome is not None:
            return claim.outcome
        reason = claim.refusal or "refused"
        return error_result(
            f"duplicate call: the original call with this callKey was refused before running ({reason}); "
            "retry with the same callKey"
        )

    def _purge(self, now: float) -> None:
        done = self._done
        while done:
            key, claim = next(iter(done.items()))
            if claim.expires > now:
                break
            del done[key]
            self._bytes -= claim.size
            if self._claims.get(key) is claim:
                del self._claims[key]

    def _enforce_memory(self) -> None:
        if self._bytes <= self._max_bytes:
            return
        for claim in self._done.values():
            if self._bytes <= self._max_bytes:
                break
            if claim.size:
                self._bytes -= claim.size
                claim.size = 0
                claim.outcome = error_result(_EVICTED_TEXT)
