"""A paid call's commit whose outcome was lost on the wire, resolved from
the database before anyone is answered.

When the connection to the book fails after ``COMMIT`` was sent, the
executor cannot know whether the transaction is durable
(:class:`~.store.records.CommitOutcomeUnknown`). For the charge of a paid
call :class:`~._accounts.Accounts` then reads the book again on a fresh
connection (:func:`resolve`: at most :data:`RESOLVE_ATTEMPTS` reads, the
pause before each next one doubling from :data:`RESOLVE_FIRST_PAUSE`
seconds): the charge's audit row (ref ``charge:<call id>``, unique) present
means the charge committed and the call runs as charged; absent means
nothing was charged (the caller gets the ledger-unavailable refusal). A
book that stays unreachable is answered with :data:`OUTCOME_UNKNOWN_TEXT`
and the call is remembered as unsettled: the next charge of the same
(peer, callKey), or the next lease beat, settles it first
(:func:`settle_unknown_charge`: a charge that did commit is refunded once
and its key keeps :data:`UNKNOWN_REFUNDED_TEXT` for the replay window; the
tool never ran), so a retry under that callKey is answered from the
journal at once rather than waiting on a claim nobody will complete.

A completion (journal row settled, a failed call's refund) whose commit
was lost is run again on a fresh connection: it changes only a call still
in flight, so a rerun after a commit that did land changes nothing (no
second refund) and the caller still gets the tool's result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from brmcp.server.store import journal as calls_journal
from brmcp.server.store._conn import Connection
from brmcp.server.store._executor import BatchExecutor
from brmcp.server.store.records import StoreError

from ._callkeys import error_result

__all__ = [
    "OUTCOME_UNKNOWN_TEXT",
    "RESOLVE_ATTEMPTS",
    "RESOLVE_FIRST_PAUSE",
    "UNKNOWN_REFUNDED_TEXT",
    "ChargeOutcomeUnknown",
    "movement_balance",
    "resolve",
    "settle_unknown_charge",
]

T = TypeVar("T")

#: Reads of the book after a commit whose outcome was lost, before giving up.
RESOLVE_ATTEMPTS = 5
#: Seconds before the second read; each later pause doubles (about 1.5 s in all,
#: plus the executor's connect timeout per read of an unreachable server).
RESOLVE_FIRST_PAUSE = 0.05

#: The answer when a charge's commit was lost and the book stayed unreachable.
OUTCOME_UNKNOWN_TEXT = (
    "payment outcome unknown: the ledger could not be reached; "
    "retry with the same callKey to get the recorded outcome"
)
#: The outcome kept for a callKey whose lost charge did commit and was then
#: refunded, the tool not having run.
UNKNOWN_REFUNDED_TEXT = (
    "the ledger could not be reached when this call was charged, so the tool did not run; "
    "the charge was refunded; call again with a new callKey"
)


class ChargeOutcomeUnknown(StoreError):
    """A charge whose commit was lost and whose outcome the book could not be
    read for (:func:`resolve` gave up). The call is remembered and settled
    before its callKey is charged again."""


def movement_balance(conn: Connection, ref: str) -> tuple[bool, int | None]:
    """Whether the audit row ``ref`` exists, with its ``balance_after``
    (atoms; None when the row records none)."""
    row = conn.execute("SELECT balance_after FROM movements WHERE ref = ?", (ref,)).fetchone()
    if row is None:
        return False, None
    return True, None if row[0] is None else int(row[0])


async def resolve(
    db: BatchExecutor[Any],
    op: Callable[[Connection], T],
    pause: Callable[[float], Awaitable[None]],
) -> T:
    """Run ``op`` (a read, or a write changing only a call still in flight,
    so a rerun is safe) until one run's outcome is known: at most
    :data:`RESOLVE_ATTEMPTS` runs, ``pause`` (seconds) between them. Raises
    :class:`ChargeOutcomeUnknown` when none succeeded."""
    last: Exception | None = None
    for attempt in range(RESOLVE_ATTEMPTS):
        if attempt:
            await pause(RESOLVE_FIRST_PAUSE * 2 ** (attempt - 1))
        try:
            return await db.run(op)
        except Exception as exc:  # a store or driver error: the book is still out of reach
            last = exc
    raise ChargeOutcomeUnknown(f"ledger unreachable after {RESOLVE_ATTEMPTS} reads: {last}")


def settle_unknown_charge(
    conn: Connection,
    *,
    call_id: str,
    peer: str,
    call_key: str | None,
    atoms: int,
    ts: float,
    expires: float,
    local: bool,
) -> bool:
    """Settle a call whose charge's outcome was lost and whose tool never
    ran: when the charge committed and the call is still in flight, refund
    it once and keep its key bound to :data:`UNKNOWN_REFUNDED_TEXT` until
    ``expires`` (unix seconds; :func:`.store.journal.recover_call`). Returns
    whether the charge had committed."""
    committed, _ = movement_balance(conn, f"charge:{call_id}")
    if committed:
        outcome = error_result(UNKNOWN_REFUNDED_TEXT).model_dump_json(by_alias=True, exclude_none=True)
        calls_journal.recover_call(
            conn,
            call_id=call_id,
            peer=peer,
            call_key=call_key,
            atoms=atoms,
            ts=ts,
            expires=expires,
            outcome_json=outcome,
            local=local,
            charged=True,
        )
    return committed
