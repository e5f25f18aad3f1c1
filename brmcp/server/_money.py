"""The money entry points of :class:`~brmcp.server.Harness`: balances,
operator credits, received tips (credited once, or held for senders not
allowed; WIRE.md §Payments), the built-in ledger's transactions and the
audit statement. They delegate to the harness's accounts, call pipeline and
received-tips handler (:mod:`brmcp.server.calls`)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import TypeVar

import anyio

from .. import wire
from . import store
from .calls import Accounts, CallPipeline, ReceivedTips
from .config import HarnessError
from .store import HeldTip, StatementEntry

__all__ = ["MoneyMethods"]

log = logging.getLogger("brmcp.server")

T = TypeVar("T")


class MoneyMethods:
    """Mixed into :class:`~brmcp.server.Harness`, which sets the accounts,
    the call pipeline and the received-tips handler."""

    _accounts: Accounts
    _pipeline: CallPipeline
    _tips: ReceivedTips

    async def balance(self, peer: str) -> int:
        """Prepaid balance of ``peer`` in atoms."""
        return await self._accounts.balance(peer)

    async def credit(self, peer: str, atoms: int, *, memo: str | None = None) -> None:
        """Credit ``atoms`` (> 0) to ``peer`` outside the tip path (operator
        top-ups, tests). Audited as kind ``credit``. Raises ValueError for a
        non-positive amount, and ``store.BalanceLimitError`` (a ValueError;
        logged, nothing credited) when the built-in ledger's balance would
        pass ``MAX_BALANCE_ATOMS`` (21 million DCR; SECURITY.md)."""
        if isinstance(atoms, bool) or not isinstance(atoms, int) or atoms <= 0:
            raise ValueError(f"credit amount must be a positive number of atoms, got {atoms!r}")
        if atoms > store.MAX_BALANCE_ATOMS:
            exc = store.BalanceLimitError(peer, await self.balance(peer), atoms)
            log.error("%s", exc)
            raise exc
        ref = f"credit:{wire.new_id()}{wire.new_id()}"
        try:
            with anyio.CancelScope(shield=True):
                await self._accounts.credit(peer, atoms, kind="credit", ref=ref)
        except store.BalanceLimitError as exc:
            log.error("%s", exc)
            raise
        self._pipeline.credited(peer)

    async def credit_tip(self, peer: str, amount_matoms: int, sequence_id: int) -> int:
        """Credit a received tip: milliatoms floored to atoms, only for
        allowed peers, once per tip (sequence id, sender and amount recorded
        in the same transaction as the credit, so a redelivered tip never
        credits twice, even across a crash). Returns the atoms credited (0
        for replays, non-allowed senders and amounts under 1000 matoms). A
        tip of at least one atom from a sender not allowed is held, in that
        same transaction, and credited once when the sender is allowed
        (:meth:`release_held_tips`; WIRE.md §Payments, "Tips from senders
        not allowed")."""
        _, atoms = await self.record_tip(peer, amount_matoms, sequence_id)
        return atoms

    async def record_tip(self, peer: str, amount_matoms: int, sequence_id: int) -> tuple[bool, int]:
        """Like :meth:`credit_tip` but also says whether the tip was new
        (False: a redelivery, nothing changed). Raises ValueError, changing
        nothing, when the sequence id or the amount is not a signed 64-bit
        integer (the ledger's type; ids must also be >= 0; a negative
        amount is recorded, never credited); a tip that would
        push the built-in ledger's balance past ``MAX_BALANCE_ATOMS`` is
        recorded as seen, not credited, and logged as an error."""
        return await self._tips.record(peer, amount_matoms, sequence_id)

    async def release_held_tips(self, peer: str | None = None) -> int:
        """Credit the tips held for senders not allowed when they arrived
        (WIRE.md §Payments, "Tips from senders not allowed") to those of
        them allowed now: ``peer`` only, or (None) every sender with held
        tips, read from the ledger. Each tip is credited exactly once, as a
        ``tip`` movement under its own ref in one transaction that also
        drops it from the held tips, however often and concurrently this
        runs. Returns the atoms credited by this call. The harness runs it
        on entry, before a ``tools/call`` of a sender with held tips and
        after a tip from such a sender. Raises what the ledger raises
        (nothing is lost: the tips stay held)."""
        return await self._tips.release(peer)

    async def held_tips(self, peer: str | None = None) -> list[HeldTip]:
        """The tips held now for senders not allowed (of ``peer``, or of
        everyone), oldest first (:class:`~.store.HeldTip`: atoms > 0)."""
        return await self._accounts.held_tips(peer)

    async def has_tip_history(self) -> bool:
        """True once this harness's ledger has recorded any received tip
        (False for a new data directory)."""
        return await self._accounts.has_tip_history()

    async def transact(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op(conn)`` in one transaction of the built-in ledger's
        database and return its result once committed (off the event loop,
        serialised with the harness's own money movements). ``op`` may move
        balances with :func:`store.add_balance` and must audit every
        movement with :func:`store.record_movement` under a unique ref (a
        ref applied twice raises ``sqlite3.IntegrityError``, or
        ``psycopg.IntegrityError`` on a PostgreSQL store, rolling back
        all of ``op``), so a movement and the state change it pays for
        commit together or not at all; it may keep its own tables in the
        same file (the directory does: docs/directory.md §Files). Raises
        :class:`HarnessError` with an external Billing store (no built-in
        ledger), else whatever ``op`` raises (nothing of ``op`` is then
        written). Callers on money paths shield this from cancellation."""
        executor = self._accounts.executor
        if executor is None or not self._accounts.local:
            raise HarnessError("transact needs the built-in ledger (a data_dir and no Billing store)")
        return await executor.run(op)

    async def statement(self, peer: str) -> list[StatementEntry]:
        """Every money movement of ``peer``, oldest first (tips, credits,
        charges, refunds), from the append-only audit table."""
        return await self._accounts.statement(peer)
