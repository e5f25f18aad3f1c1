"""The federation's records (docs/directory.md §Federation): the peer
directories this one trusts (``dir_peers``) and the leads their snapshots
named (``dir_leads``), providers to invite.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace

from ._records import Records
from ._rows import (
    LEAD_COLUMNS,
    LEAD_CONVERTED,
    Lead,
    Peer,
    get_lead,
    get_listing,
    get_registration,
    lead_of,
    put_lead,
)

__all__ = ["PeerRecords"]


class PeerRecords(Records):
    """Peer directories and leads; methods as :class:`~._records.Records`'."""

    async def put_peer(self, peer: Peer) -> None:
        await self._run(
            lambda c: c.execute(
                "INSERT OR REPLACE INTO dir_peers (uid, pub_key, added_at, last_verified_at) "
                "VALUES (?, ?, ?, ?)",
                (peer.uid, peer.pub_key, peer.added_at, peer.last_verified_at),
            )
        )

    async def delete_peer(self, uid: str) -> None:
        await self._run(lambda c: c.execute("DELETE FROM dir_peers WHERE uid = ?", (uid,)))

    async def peers(self) -> list[Peer]:
        return await self._run(
            lambda c: [
                Peer(r[0], r[1], int(r[2]), int(r[3]))
                for r in c.execute(
                    "SELECT uid, pub_key, added_at, last_verified_at FROM dir_peers ORDER BY uid"
                )
            ]
        )

    async def stamp_peer(self, uid: str, now: int) -> None:
        await self._run(
            lambda c: c.execute("UPDATE dir_peers SET last_verified_at = ? WHERE uid = ?", (now, uid))
        )

    async def add_leads(self, leads: list[Lead]) -> int:
        """Store the leads whose provider is neither known (listed,
        registered) nor a lead already; returns how many were new."""

        def op(conn: sqlite3.Connection) -> int:
            added = 0
            for lead in leads:
                uid = lead.provider_uid
                if get_listing(conn, uid) or get_registration(conn, uid) or get_lead(conn, uid):
                    continue
                put_lead(conn, lead)
                added += 1
            return added

        return await self._run(op)

    async def lead(self, uid: str) -> Lead | None:
        return await self._run(lambda c: get_lead(c, uid))

    async def leads(self) -> list[Lead]:
        return await self._run(
            lambda c: [
                lead_of(r) for r in c.execute(f"SELECT {LEAD_COLUMNS} FROM dir_leads ORDER BY provider_uid")
            ]
        )

    async def set_lead_state(self, uid: str, state: str, note: str, now: int) -> Lead | None:
        """Move a lead (a converted lead keeps its state; an empty note
        keeps the old one). None when there is no lead for ``uid``."""

        def op(conn: sqlite3.Connection) -> Lead | None:
            lead = get_lead(conn, uid)
            if lead is None:
                return None
            lead = replace(
                lead,
                state=lead.state if lead.state == LEAD_CONVERTED else state,
                note=note or lead.note,
                updated_at=now,
            )
            put_lead(conn, lead)
            return lead

        return await self._run(op)
