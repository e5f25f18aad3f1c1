"""Received tips, the harness's side (WIRE.md §Payments): each tip
credited once to an allowed sender, and a tip from a sender not allowed
held, then credited once that sender is allowed ("Tips from senders not
allowed"). The ledger work is :mod:`._accounts` over :mod:`.store`; this
keeps which senders have tips held, releases them at the moments the
harness names (entry, a tip, a ``tools/call``) and wakes held calls on
every credit. Owned by :class:`~.harness.Harness`, whose ``record_tip``
and ``release_held_tips`` delegate here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from brmcp.protocol.units import atoms_from_milliatoms
from brmcp.server.pool import member_sequence_id
from brmcp.server.store import MAX_INT63

from ._accounts import Accounts

if TYPE_CHECKING:
    from brmcp.metrics import ServeMetrics

__all__ = ["ReceivedTips"]

log = logging.getLogger("brmcp.server")


class ReceivedTips:
    """``accounts`` holds the tips; ``allowed(peer)`` is the harness's
    admission check (read live); ``credited(peer)`` wakes the calls held for
    ``peer`` (the pipeline's); ``metrics()`` the harness's metrics or None."""

    def __init__(
        self,
        accounts: Accounts,
        allowed: Callable[[str], bool],
        credited: Callable[[str], None],
        metrics: Callable[[], ServeMetrics | None],
        tip_member: Callable[[], str | None] = lambda: "",
    ) -> None:
        self._accounts = accounts
        #: ``""`` outside a pool; in a pool this member's own uid (the tip's
        #: key is then :func:`.pool.member_sequence_id`), None while unknown.
        self._tip_member = tip_member
        self._allowed = allowed
        self._credited = credited
        self._metrics = metrics
        #: Senders with tips held because they were not allowed (WIRE.md
        #: §Payments, "Tips from senders not allowed"); loaded on entry.
        self.held_peers: set[str] = set()

    async def record(self, peer: str, amount_matoms: int, sequence_id: int) -> tuple[bool, int]:
        """Record (and for an allowed sender credit) one tip; returns ``(new,
        atoms credited)``. See :meth:`Harness.record_tip
        <brmcp.server.Harness.record_tip>` for the rules and errors."""
        for name, value, low in (
            ("sequence id", sequence_id, 0),
            ("amount", amount_matoms, -MAX_INT63 - 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_INT63:
                raise ValueError(f"tip {name} {value!r} out of range (a signed 64-bit integer, ids >= 0)")
        member = self._tip_member()
        if member is None:
            # Retried by the tip loop until brclient names this member.
            raise RuntimeError("this pool member's own uid is not known yet; the tip waits for it")
        received = sequence_id
        if member:
            sequence_id = member_sequence_id(member, sequence_id)
        allowed = self._allowed(peer)
        with anyio.CancelScope(shield=True):
            outcome = await self._accounts.credit_tip(
                peer=peer, amount_matoms=int(amount_matoms), sequence_id=int(sequence_id), allowed=allowed
            )
        new, credited = outcome
        held = atoms_from_milliatoms(amount_matoms)
        if new and not allowed and held > 0:
            self.held_peers.add(peer)
            log.info(
                "holding %s atoms of tip %d from %s, a sender not allowed, until it is allowed",
                f"{held:,}",
                received,
                peer,
            )
        if credited > 0:
            self._credited(peer)
        if allowed and peer in self.held_peers:
            try:
                await self.release(peer)
            except Exception as exc:  # this tip is recorded; the held ones stay held
                log.error("tips held for %s not credited now: %s", peer, exc)
        return outcome

    async def release(self, peer: str | None = None) -> int:
        """Credit the held tips of ``peer`` (None: of every sender with held
        tips, read from the ledger) that is allowed now, each exactly once;
        returns the atoms credited. See :meth:`Harness.release_held_tips
        <brmcp.server.Harness.release_held_tips>`."""
        if peer is None:
            peers = await self._accounts.held_peers()
            self.held_peers.update(peers)  # a union: a tip held meanwhile stays known
        else:
            peers = [peer] if peer in self.held_peers else []
        total = 0
        for who in peers:
            if not self._allowed(who):
                continue
            with anyio.CancelScope(shield=True):
                atoms = await self._accounts.release_held(who)
                if not await self._accounts.held_tips(who):
                    self.held_peers.discard(who)
            if atoms > 0:
                log.info("credited %s atoms of tips held for %s, which is allowed now", f"{atoms:,}", who)
                metrics = self._metrics()
                if metrics is not None:
                    metrics.tip_atoms.inc(atoms)
                self._credited(who)
            total += atoms
        return total

    async def release_before_call(self, peer: str) -> None:
        """Before a ``tools/call`` of ``peer``: credit its held tips if it has
        any (a failure is logged; the call goes on, the tips stay held)."""
        if peer in self.held_peers:
            try:
                await self.release(peer)
            except Exception as exc:  # the call goes on; the tips stay held
                log.error("tips held for %s not credited now: %s", peer, exc)
