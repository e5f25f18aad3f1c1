"""A successful result whose completion the ledger could not record
(WIRE.md §callKey; SECURITY.md, "A paid call's COMMIT lost on the wire").

A result is delivered only once its charge is on the book as done: delivered
while the journal row still says ``charged``, the next start would refund a
result the caller has. So the result is withheld: for a keyed call it is
kept on the call's claim, and the same callKey's retry records the
completion first and then gets it, charged once; an unkeyed call cannot be
asked again, so its caller is told the charge is refunded at the next start.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
from mcp.types import CallToolResult

from ._callkeys import REPLAY_WINDOW, CallKeyRegistry, Claim, error_result

__all__ = ["withhold"]

log = logging.getLogger("brmcp.server")


def withhold(
    registry: CallKeyRegistry,
    call_id: str,
    peer: str,
    claim: Claim | None,
    charged: int,
    result: CallToolResult,
    text: str,
    tool: str,
    complete: Callable[..., Awaitable[int | None]],
    clock: Callable[[], float],
) -> CallToolResult:
    """The answer for the successful ``result`` (its JSON ``text``) of call
    ``call_id`` of ``tool``, charged ``charged`` atoms, whose completion
    could not be journaled; ``complete(expires=...)`` retries that
    completion (unix seconds from ``clock``). Keyed (``claim``): the result
    is kept on the claim (:meth:`CallKeyRegistry.hold`) and the caller is
    told so; a retry with the same callKey journals the completion and gets
    the result, or is told again that it is kept. Unkeyed: not delivered."""
    if claim is None:
        return error_result(
            f"the result of {tool} could not be recorded as delivered (the bot's ledger is"
            f" unreachable), so it is not delivered; the {charged} atoms charged are refunded"
            " when the bot next starts"
        )
    kept = (
        f"the result of {tool} is ready, but the bot's ledger could not record its charge of"
        f" {charged} atoms as delivered (the ledger is unreachable); it is kept: a retry with the"
        " same callKey gets it, charged once, once the ledger is back; if the bot restarts"
        " first, the charge is refunded"
    )
    lock = anyio.Lock()

    async def complete_later() -> CallToolResult:
        async with lock:
            if claim.outcome is not None:
                return claim.outcome
            try:
                # A completion changes only a call still in flight, so one
                # whose earlier commit did land is not applied twice.
                await complete(expires=clock() + REPLAY_WINDOW)
            except Exception as exc:
                log.warning("completion of call %s for %s still not journaled: %s", call_id, peer, exc)
                return error_result(kept)
            log.info("completion of call %s for %s journaled; its kept result delivered", call_id, peer)
            registry.finish(claim, result, len(text.encode()), text)
            return result

    registry.hold(claim, complete_later)
    return error_result(kept)
