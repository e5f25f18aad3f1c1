"""Received tips on the books of :class:`~._accounts.Accounts`: credited
once per (sequence id, sender, milliatoms), floored to atoms, or held for a
sender not allowed and released later, each exactly once (WIRE.md
§Payments). Without a journal (an external Billing store and no data dir)
the tips seen and held are kept in memory, the newest
:data:`~.store.TIP_MEMORY` of each."""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from brmcp.protocol.units import atoms_from_milliatoms
from brmcp.server import store
from brmcp.server.billing import Billing
from brmcp.server.store import HeldTip
from brmcp.server.store._executor import BatchExecutor

__all__ = ["TipLedger"]

log = logging.getLogger("brmcp.server")


class TipLedger:
    """The tip operations of :class:`~._accounts.Accounts`, which sets the
    state declared here (its store, Billing store, clock and the in-memory
    tips of a book without a journal)."""

    _db: BatchExecutor[Any] | None
    _billing: Billing | None
    _clock: Callable[[], float]
    local: bool
    _seen_tips: OrderedDict[tuple[int, str, int], None]
    #: Without a journal: tips held for senders not allowed, (seq, peer, matoms) -> atoms.
    _held_memory: OrderedDict[tuple[int, str, int], int]

    async def credit_tip(
        self, *, peer: str, amount_matoms: int, sequence_id: int, allowed: bool
    ) -> tuple[bool, int]:
        """Returns (new, atoms credited). Milliatoms are floored to atoms
        (:func:`~brmcp.protocol.units.atoms_from_milliatoms`; none for an
        amount <= 0)."""
        atoms = atoms_from_milliatoms(amount_matoms)
        now = self._clock()
        db = self._db
        key = (sequence_id, peer, amount_matoms)
        if db is None:
            if key in self._seen_tips:
                return False, 0
            self._seen_tips[key] = None
            while len(self._seen_tips) > store.TIP_MEMORY:
                self._seen_tips.popitem(last=False)
            if allowed and atoms > 0:
                assert self._billing is not None
                await self._billing.credit(peer, atoms, ref=store.tip_ref(sequence_id, peer, amount_matoms))
                return True, atoms
            if atoms > 0:
                self._hold_in_memory(key, atoms)
            return True, 0
        new, credited = await db.run(
            lambda c: store.record_tip(
                c,
                sequence_id=sequence_id,
                peer=peer,
                amount_matoms=amount_matoms,
                atoms=atoms,
                credit_it=allowed,
                ts=now,
                local=self.local,
            )
        )
        if new and allowed and atoms > 0 and not credited:
            log.error(
                "tip %d from %s (%d matoms) recorded but NOT credited: the balance would pass the "
                "maximum of %d atoms",
                sequence_id,
                peer,
                amount_matoms,
                store.MAX_BALANCE_ATOMS,
            )
        if new and credited and self._billing is not None:
            await self._billing.credit(peer, credited, ref=store.tip_ref(sequence_id, peer, amount_matoms))
            await db.run(
                lambda c: store.finish_tip(
                    c, sequence_id=sequence_id, peer=peer, amount_matoms=amount_matoms, ts=now
                )
            )
        return new, credited

    def _hold_in_memory(self, key: tuple[int, str, int], atoms: int) -> None:
        """No journal: keep a held tip in memory (the newest
        :data:`store.TIP_MEMORY`; an older one is dropped and logged)."""
        self._held_memory[key] = atoms
        while len(self._held_memory) > store.TIP_MEMORY:
            (seq, peer, matoms), lost = self._held_memory.popitem(last=False)
            log.error(
                "tip %d from %s (%d matoms, %d atoms) held for a sender not allowed is forgotten: "
                "without a data directory only the newest %d held tips are kept",
                seq,
                peer,
                matoms,
                lost,
                store.TIP_MEMORY,
            )

    async def held_peers(self) -> list[str]:
        """The senders with tips held because they were not allowed."""
        if self._db is None:
            return sorted({peer for _, peer, _ in self._held_memory})
        return await self._db.run(store.held_peers)

    async def held_tips(self, peer: str | None = None) -> list[HeldTip]:
        """The tips held now (of ``peer``, or of everyone), oldest first."""
        if self._db is None:
            return [
                HeldTip(seq, who, matoms, atoms, 0.0)
                for (seq, who, matoms), atoms in self._held_memory.items()
                if peer is None or who == peer
            ]
        return await self._db.run(lambda c: store.held_tips(c, peer))

    async def release_held(self, peer: str) -> int:
        """Credit every tip held for ``peer``, each exactly once (its own
        transaction, under the tip's ref; with a Billing store the credit
        comes first, then the audit row, so a crash in between is settled
        by the next release under the same ref). Returns the atoms credited
        now. A tip that would pass the maximum balance stays held (logged)."""
        db = self._db
        billing = self._billing
        total = 0
        if db is None:
            assert billing is not None
            for key in [k for k in self._held_memory if k[1] == peer]:
                atoms = self._held_memory[key]
                await billing.credit(peer, atoms, ref=store.tip_ref(*key))
                self._held_memory.pop(key, None)
                total += atoms
            return total
        now = self._clock()
        for tip in await db.run(lambda c: store.held_tips(c, peer)):
            if billing is not None:
                await billing.credit(
                    peer, tip.atoms, ref=store.tip_ref(tip.sequence_id, tip.peer, tip.amount_matoms)
                )
            try:
                total += await db.run(
                    functools.partial(store.release_held_tip, tip=tip, ts=now, local=self.local)
                )
            except store.BalanceLimitError as exc:
                log.error("tip %d held for %s stays held: %s", tip.sequence_id, peer, exc)
        return total

    async def has_tip_history(self) -> bool:
        """True once any received tip was recorded (credited or not)."""
        if self._db is None:
            return bool(self._seen_tips)
        return await self._db.run(lambda c: store.has_tips(c))
