"""Money and journal operations of the harness, over the built-in ledger
(one transaction per movement plus its journal row, in SQLite or, with a
``postgresql://`` store URL, PostgreSQL: :mod:`.store.url`) or an external
:class:`~.billing.Billing` store (journal in the store, balances elsewhere,
exactly-once through movement refs).

On PostgreSQL the book may be shared by several harness processes (a bot
pool, WIRE.md §Pools). Each :class:`Accounts` then has an owner id (random
per process start) and a lease it beats (:meth:`Accounts.heartbeat`, every
:data:`~.store.journal.HEARTBEAT_INTERVAL` seconds, run by the harness);
every call it charges records that owner, recovery refunds only the calls
of dead owners (:func:`.store.journal.dead_owners`), and the (peer,
callKey) claim is decided in the charging transaction: a key another
process holds raises :class:`~.callkeys.KeyClaimedElsewhere` with nothing
charged. On SQLite (one process) none of this applies.
Tips are :mod:`._tips`'s (a mixin); recovery plans and liveness :mod:`._recovery`'s."""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import sqlite3
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

from brmcp.server import store
from brmcp.server.billing import Billing, InsufficientBalance
from brmcp.server.store import CommitOutcomeUnknown, JournalEntry, StatementEntry
from brmcp.server.store import journal as calls_journal
from brmcp.server.store._conn import Connection
from brmcp.server.store._executor import BatchExecutor, GroupCommitExecutor
from brmcp.server.store.journal import KeyHolder
from brmcp.server.store.postgres import paidcalls
from brmcp.server.store.postgres.connection import RowLocked
from brmcp.server.store.postgres.driver import is_driver_error
from brmcp.server.store.url import DEFAULT_STORE, StoreURL, parse_store_url

from . import _doubt
from ._callkeys import REPLAY_WINDOW, KeyClaimedElsewhere
from ._recovery import (
    Interrupted,
    Plan,
    dead_interrupted,
    host_identity,
    lease_drops,
    recovery,
    run_plan,
    run_plan_now,
)
from ._tips import TipLedger

log = logging.getLogger("brmcp.server")

T = TypeVar("T")

INTERRUPTED_TEXT = "call interrupted by a server restart; the charge was refunded"
#: Seconds between sweeps of completed journal rows past their replay window
#: (piggybacked on a charge's transaction; start-up sweeps too).
GC_INTERVAL = 60.0


class Accounts(TipLedger):
    """See the module docstring. ``store_url`` selects the backend
    (:mod:`.store.url`; a :class:`ValueError` names a bad one): ``sqlite:``
    keeps the book in ``data_dir``, where ``data_dir`` None means no
    journal, only possible with an external billing store (callKey replay
    is then in memory only); a PostgreSQL URL keeps it in that database
    (``data_dir`` unused). Raises :class:`~.store.StoreError` when the
    database cannot be opened."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None,
        billing: Billing | None,
        clock: Callable[[], float],
        store_url: str | StoreURL = DEFAULT_STORE,
    ) -> None:
        try:
            url = store_url if isinstance(store_url, StoreURL) else parse_store_url(store_url)
        except ValueError as exc:
            raise ValueError(f"brmcp: store: {exc}") from None
        if billing is None and data_dir is None and url.kind == "sqlite":
            raise ValueError("brmcp: harness needs a data_dir for the built-in ledger or a Billing store")
        self._billing = billing
        self._clock = clock
        self.local = billing is None
        self.path: Path | None = None
        self.store_url = url
        self._db: BatchExecutor[Any] | None = None
        self._seen_tips: OrderedDict[tuple[int, str, int], None] = OrderedDict()
        #: Without a journal: tips held for senders not allowed, (seq, peer, matoms) -> atoms.
        self._held_memory: OrderedDict[tuple[int, str, int], int] = OrderedDict()
        self._next_gc = 0.0
        #: True on a book other processes may share (PostgreSQL).
        self.shared = url.kind == "postgresql"
        #: This process's lease owner id on a shared book (random per start), else None.
        self.owner: str | None = secrets.token_hex(16) if self.shared else None
        self._host = host_identity() if self.shared else None
        #: Charges whose commit was lost and not yet resolved, by call id:
        #: (peer, callKey, atoms); settled before that key is charged again (:mod:`._doubt`).
        self._unsettled: dict[str, tuple[str, str | None, int]] = {}
        #: How :mod:`._doubt` waits between reads of the book (seconds).
        self.resolve_pause: Callable[[float], Any] = anyio.sleep
        if url.kind == "postgresql":
            from brmcp.server.store.postgres import PostgresExecutor

            self._db = PostgresExecutor(url)
            # The lease exists before this process charges anything, so a
            # sibling starting now never takes its calls for a dead owner's.
            try:
                self._db.run_now(self._beat_op)
            except BaseException:
                self._db.close()
                raise
        elif data_dir is not None:
            conn = store.open_database(data_dir)
            self.path = Path(data_dir).expanduser() / store.DB_FILENAME
            self._db = GroupCommitExecutor(conn)

    @property
    def journaled(self) -> bool:
        return self._db is not None

    @property
    def executor(self) -> BatchExecutor[Any] | None:
        return self._db

    def close(self) -> None:
        """Close the store; on a shared book first drop this process's
        lease (its calls are settled by now; any left in flight are then
        recovered by the next start at once, as on SQLite)."""
        if self._db is not None:
            owner, self.owner = self.owner, None
            if owner is not None:
                try:
                    self._db.run_now(lambda c: calls_journal.drop_lease(c, owner))
                except Exception as exc:  # the lease then expires on its own
                    log.warning("lease of this process not dropped at exit: %s", exc)
            self._db.close()

    # -- a shared book: the lease -------------------------------------------------------

    def _beat_op(self, conn: Connection) -> None:
        assert self.owner is not None
        calls_journal.beat(conn, owner=self.owner, host=self._host, pid=os.getpid())

    def _dead_interrupted(self, conn: Connection) -> list[Interrupted]:
        return dead_interrupted(conn, owner=self.owner, host=self._host)

    async def heartbeat(self, replay_window: float, outcome_json: Callable[[str], str]) -> int:
        """One beat of this process's lease on a shared book, then the
        recovery of interrupted calls of siblings found dead meanwhile
        (built-in ledger; an external Billing store's are settled at the
        next start). Returns how many calls were refunded; 0 and nothing
        done on SQLite. A store error propagates (the harness logs it and
        beats again)."""
        db = self._db
        if db is None or not self.shared:
            return 0
        await db.run(self._beat_op)
        if self._unsettled:
            await self._settle_unsettled(None, None)
        if not self.local:
            return 0
        return await run_plan(
            db,
            self._recover_dead(
                self._clock(), replay_window, outcome_json, "a call of a pool member that died"
            ),
        )

    def _recover_dead(
        self, now: float, replay_window: float, outcome_json: Callable[[str], str], why: str
    ) -> Plan[int]:
        """The recovery of interrupted calls on the built-in ledger, as the
        store operations it takes, each its own transaction: the generator
        yields an operation and is sent its result (the start-up runs them
        with ``run_now``, the heartbeat awaits the executor's ``run``).
        First the calls to settle (:meth:`_dead_interrupted`); then, for
        each, the refund and the interrupted-call outcome kept for
        ``replay_window`` seconds from ``now`` (logged with ``why``, what
        the call was); then the leases of the dead owners are dropped.
        Returns how many calls were refunded."""
        pending: list[Interrupted] = yield self._dead_interrupted
        if not pending:
            return 0
        recover = recovery(now, now + replay_window, outcome_json(INTERRUPTED_TEXT), local=True)
        for call_id, peer, call_key, _tool, atoms, _state, lease in pending:
            yield functools.partial(
                recover,
                call_id=call_id,
                peer=peer,
                call_key=call_key,
                atoms=atoms,
                charged=True,
                lease=lease,
            )
            log.warning("refunded %s atoms to %s for %s", f"{atoms:,}", peer, why)
        yield from lease_drops(pending)
        return len(pending)

    async def _forget_dead_leases(self, pending: list[Interrupted]) -> None:
        db = self._db
        assert db is not None
        for drop in lease_drops(pending):
            await db.run(drop)

    async def key_holder(self, peer: str, call_key: str) -> KeyHolder | None:
        """The shared row holding ``(peer, call_key)`` now (None: free);
        what a duplicate polls while its original runs elsewhere."""
        assert self._db is not None
        now = self._clock()
        return await self._db.run(
            lambda c: calls_journal.key_holder(c, peer=peer, call_key=call_key, now=now)
        )

    # -- start-up ----------------------------------------------------------------

    def reconcile(self, replay_window: float, outcome_json: Callable[[str], str]) -> list[JournalEntry]:
        """Built-in ledger: refund every call interrupted between its debit
        and completion (exactly once: refund and journal update are one
        transaction), and return the completed keyed calls still inside
        their replay window. Synchronous, for start-up. With an external
        Billing store the refunds need its async API: see
        :meth:`reconcile_external`, which the harness awaits when it starts."""
        db = self._db
        if db is None:
            return []
        now = self._clock()
        if self.local:
            run_plan_now(
                db, self._recover_dead(now, replay_window, outcome_json, "a call interrupted by a restart")
            )
        return db.run_now(lambda c: store.completed_keyed(c, now))

    async def reconcile_external(
        self, replay_window: float, outcome_json: Callable[[str], str]
    ) -> list[JournalEntry]:
        """External Billing: settle interrupted calls and pending tip credits
        left by a crash, exactly once through movement refs. Returns the
        interrupted keyed calls, now bound to the interrupted-call outcome, so
        the harness answers their retries instead of executing them again."""
        db = self._db
        if db is None or self.local:
            return []
        pending = await db.run(self._dead_interrupted)
        now = self._clock()
        text = outcome_json(INTERRUPTED_TEXT)
        await self._reconcile_external(pending, now, recovery(now, now + replay_window, text, local=False))
        if self.shared:
            await self._forget_dead_leases(pending)
        outcome = json.loads(text)
        return [
            JournalEntry(peer, call_key, atoms, now + replay_window, outcome)
            for _call_id, peer, call_key, _tool, atoms, _state, _lease in pending
            if call_key is not None
        ]

    async def _reconcile_external(
        self,
        pending: list[Interrupted],
        now: float,
        recover: functools.partial[None],
    ) -> None:
        billing = self._billing
        db = self._db
        assert billing is not None
        assert db is not None
        for call_id, peer, call_key, _tool, atoms, state, lease in pending:
            charged = True
            if state == "charging":
                # Unknown whether the debit landed: repeat it under the same ref
                # (a no-op if it did), so the refund below nets to zero.
                try:
                    await billing.debit(peer, atoms, ref=f"charge:{call_id}")
                except InsufficientBalance:
                    charged = False
            if charged:
                await billing.credit(peer, atoms, ref=f"refund:{call_id}")
            await db.run(
                functools.partial(
                    recover,
                    call_id=call_id,
                    peer=peer,
                    call_key=call_key,
                    atoms=atoms,
                    charged=charged,
                    lease=lease,
                )
            )
        for seq, peer, matoms, credited in await db.run(store.pending_tips):
            if credited > 0:
                await billing.credit(peer, credited, ref=store.tip_ref(seq, peer, matoms))
            await db.run(
                functools.partial(store.finish_tip, sequence_id=seq, peer=peer, amount_matoms=matoms, ts=now)
            )

    # -- balances ----------------------------------------------------------------

    async def balance(self, peer: str) -> int:
        if self._billing is not None:
            return await self._billing.balance(peer)
        assert self._db is not None
        return await self._db.run(lambda c: store.balance(c, peer))

    async def credit(self, peer: str, atoms: int, *, kind: str, ref: str) -> None:
        if atoms <= 0:
            return
        now = self._clock()
        if self._billing is not None:
            await self._billing.credit(peer, atoms, ref=ref)
            if self._db is not None:
                await self._db.run(
                    lambda c: store.record_movement(c, ts=now, peer=peer, kind=kind, atoms=atoms, ref=ref)
                )
            return
        assert self._db is not None
        await self._db.run(lambda c: store.credit(c, peer, atoms, ts=now, kind=kind, ref=ref))

    # -- paid calls ----------------------------------------------------------------

    async def charge(
        self, *, call_id: str, peer: str, call_key: str | None, tool: str, atoms: int
    ) -> tuple[bool, int]:
        """Debit and journal. Returns (True, balance_after or -1) or
        (False, balance). Callers shield this from cancellation. On a shared
        book a keyed call whose (peer, callKey) the journal already holds
        (running or completed inside its replay window, at this process or
        another) raises :class:`~.callkeys.KeyClaimedElsewhere`, nothing
        charged."""
        now = self._clock()
        db = self._db
        billing = self._billing
        owner = self.owner
        check_key = self.shared and call_key is not None

        def holder(c: Connection) -> KeyHolder | None:
            if not check_key:
                return None
            assert call_key is not None
            return calls_journal.key_holder(c, peer=peer, call_key=call_key, now=now)

        # Completed rows are otherwise only swept at start-up: without this a
        # long-running harness would keep every keyed outcome forever.
        gc = now >= self._next_gc
        if gc:
            self._next_gc = now + GC_INTERVAL
        if billing is None and db is not None:
            await self._settle_unsettled(peer, call_key)
        if billing is None and self.shared:
            assert db is not None
            # One READ COMMITTED transaction deciding on the rows it locks
            # (store/postgres/paidcalls.py): no serialization conflicts
            # between processes charging different callers.
            charged_shared = await self._run_charge(
                call_id,
                peer,
                call_key,
                atoms,
                RowLocked(
                    functools.partial(
                        paidcalls.charge,
                        call_id=call_id,
                        peer=peer,
                        call_key=call_key,
                        tool=tool,
                        atoms=atoms,
                        ts=now,
                        owner=owner,
                        gc=gc,
                    )
                ),
            )
            if isinstance(charged_shared, KeyHolder):
                raise KeyClaimedElsewhere(charged_shared)
            return charged_shared
        if billing is None:
            assert db is not None

            def charge_op(c: Connection) -> tuple[bool, int] | KeyHolder:
                if gc:
                    store.gc_calls(c, now)
                held = holder(c)
                if held is not None:
                    return held
                return store.charge(
                    c,
                    call_id=call_id,
                    peer=peer,
                    call_key=call_key,
                    tool=tool,
                    atoms=atoms,
                    ts=now,
                    owner=owner,
                )

            charged = await self._run_charge(call_id, peer, call_key, atoms, charge_op)
            if isinstance(charged, KeyHolder):
                raise KeyClaimedElsewhere(charged)
            return charged
        journal = functools.partial(
            store.journal_charge,
            call_id=call_id,
            peer=peer,
            call_key=call_key,
            tool=tool,
            atoms=atoms,
            ts=now,
            owner=owner,
        )
        if db is not None:

            def journal_op(c: Connection) -> KeyHolder | None:
                if gc:
                    store.gc_calls(c, now)
                held = holder(c)
                if held is None:
                    journal(c, state="charging")
                return held

            claimed = await db.run(journal_op)
            if claimed is not None:
                raise KeyClaimedElsewhere(claimed)
        # Any other failure of the debit (store error, cancellation) is an
        # unknown outcome: it propagates and leaves the journal row 'charging'
        # so start-up reconciliation settles it exactly once.
        try:
            await billing.debit(peer, atoms, ref=f"charge:{call_id}")
        except InsufficientBalance:
            if db is not None:
                await db.run(lambda c: store.drop_call(c, call_id))
            return False, await billing.balance(peer)
        if db is not None:
            await db.run(functools.partial(journal, state="charged"))
        return True, -1

    async def complete(
        self,
        *,
        call_id: str,
        peer: str,
        atoms: int,
        keyed: bool,
        expires: float,
        outcome_json: str | Callable[[int | None], str | None] | None,
        refund: bool,
    ) -> int | None:
        """Finish a charged call; ``refund`` credits the price back (the
        handler failed). Built-in ledger: one transaction. Returns, after a
        refund, the caller's balance in atoms once it is refunded (the
        built-in ledger's, read in that transaction, or what the Billing
        store says right after its credit; None when it cannot say), else
        None. ``outcome_json`` (what is kept for replay) may be a function
        of that balance, called inside the completing transaction
        (:func:`store.complete`)."""
        now = self._clock()
        external: int | None = None
        if self._billing is not None and refund:
            await self._billing.credit(peer, atoms, ref=f"refund:{call_id}")
            try:
                external = await self._billing.balance(peer)
            except Exception as exc:
                log.warning("balance of %s after a refund unknown: %s", peer, exc)
            if external is not None and external < 0:
                external = None
        db = self._db
        if db is None:
            return external
        refund_spec = (peer, atoms, self.local) if refund else None
        if self.shared:
            return await self._run_complete(
                call_id,
                refund,
                RowLocked(
                    functools.partial(
                        paidcalls.complete,
                        call_id=call_id,
                        keyed=keyed,
                        ts=now,
                        expires=expires,
                        outcome_json=outcome_json,
                        refund=refund_spec,
                        balance_after=external,
                    )
                ),
            )
        return await self._run_complete(
            call_id,
            refund,
            lambda c: store.complete(
                c,
                call_id=call_id,
                keyed=keyed,
                ts=now,
                expires=expires,
                outcome_json=outcome_json,
                refund=refund_spec,
                balance_after=external,
                shared=self.shared,
            ),
        )

    async def _run_charge(
        self,
        call_id: str,
        peer: str,
        call_key: str | None,
        atoms: int,
        op: Callable[[Any], tuple[bool, int] | KeyHolder],
    ) -> tuple[bool, int] | KeyHolder:
        """Run a built-in ledger charge; a commit whose outcome was lost is
        resolved from the book (:mod:`._doubt`): charged (True and the
        balance after), or a :class:`~.store.StoreError` (nothing charged),
        or :class:`~._doubt.ChargeOutcomeUnknown` (remembered, settled first
        at the next charge of the key or the next beat)."""
        assert self._db is not None
        try:
            return await self._db.run(op)
        except CommitOutcomeUnknown as exc:
            lost = exc
        ref = f"charge:{call_id}"
        try:
            committed, after = await _doubt.resolve(
                self._db, lambda c: _doubt.movement_balance(c, ref), self.resolve_pause
            )
        except _doubt.ChargeOutcomeUnknown:
            self._unsettled[call_id] = (peer, call_key, atoms)
            log.error("charge of call %s to %s: outcome unknown, ledger unreachable: %s", call_id, peer, lost)
            raise
        if not committed:
            raise store.StoreError(f"charge of call {call_id} not recorded: {lost}") from None
        log.warning("charge of call %s to %s: commit lost on the wire, found recorded", call_id, peer)
        return True, -1 if after is None else after

    async def _settle_unsettled(self, peer: str | None, call_key: str | None) -> None:
        """Settle the lost charges of ``(peer, call_key)`` (every one when
        ``peer`` is None) from the book (:func:`._doubt.settle_unknown_charge`).
        Raises :class:`~._doubt.ChargeOutcomeUnknown` when the book is still
        out of reach for one of that key (a retry is then answered the same)."""
        db = self._db
        for call_id, (owner_peer, key, atoms) in list(self._unsettled.items()):
            if peer is not None and (owner_peer != peer or key != call_key or key is None):
                continue
            now = self._clock()
            settle = functools.partial(
                _doubt.settle_unknown_charge,
                call_id=call_id,
                peer=owner_peer,
                call_key=key,
                atoms=atoms,
                ts=now,
                expires=now + REPLAY_WINDOW,
                local=self.local,
            )
            assert db is not None
            if await _doubt.resolve(db, settle, self.resolve_pause):
                log.info("lost charge of call %s to %s refunded; the tool did not run", call_id, owner_peer)
            del self._unsettled[call_id]

    async def _run_complete(self, call_id: str, refund: bool, op: Callable[[Any], int | None]) -> int | None:
        """Run a completion; one whose commit was lost runs again on a fresh
        connection (it changes only a call still in flight: never a second
        refund). After a refund that had landed the balance is read from its
        audit row."""
        assert self._db is not None
        try:
            return await self._db.run(op)
        except CommitOutcomeUnknown:
            pass
        known = await _doubt.resolve(self._db, op, self.resolve_pause)
        if known is None and refund:
            _, known = await _doubt.resolve(
                self._db, lambda c: _doubt.movement_balance(c, f"refund:{call_id}"), self.resolve_pause
            )
        return known

    async def statement(self, peer: str) -> list[StatementEntry]:
        if self._db is None:
            return []
        return await self._db.run(lambda c: store.statement(c, peer))

    async def gc(self) -> int:
        if self._db is None:
            return 0
        now = self._clock()
        return await self._db.run(lambda c: store.gc_calls(c, now))


def is_store_error(exc: BaseException) -> bool:
    """True for an error of the store: SQLite's, psycopg's, or
    :class:`~.store.StoreError`."""
    return isinstance(exc, sqlite3.Error | store.StoreError) or is_driver_error(exc)
