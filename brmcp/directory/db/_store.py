"""The directory's durable state (docs/directory.md §Files, §Money).

The tables live in the harness's own database (``brmcp.sqlite3`` in the
data directory, or the PostgreSQL database its ``store`` names: the SQL
is SQLite's, rewritten for PostgreSQL by :mod:`brmcp.directory.db._sql`),
next to the ledger that holds every provider's balance, and every state
change runs as one transaction of the harness
(:meth:`brmcp.server.Harness.transact`): the listing fee's debit and the
move to ``crawling`` commit together, as do a test payment's escrow debit,
its spend-journal row and the registration's ``paid_atoms``. A SIGKILL at
any point therefore leaves the books exact: either the whole step is there
or none of it. Every ledger movement carries a unique ref (``dirfee:``,
``dirtest:``, ``dirrefund:``), so none is ever applied twice.

Tables (all ``dir_*``): ``dir_registrations`` (one in-flight pipeline run
per uid), ``dir_listings`` (the live listings, each with its crawled
catalog as JSON text), ``dir_flags`` (moderation notes and rejection
reasons), ``dir_peers``, ``dir_leads`` and ``dir_spend`` (the outbound
spend journal: a row is written before money moves and deleted only on a
definitive rail failure); ``dir_removed`` holds the removal times changes
report (:mod:`brmcp.directory.db._pagetables`). The shapes follow karamble/brmcp,
``directory/store.go``.

The tables, the row shapes and the one-row functions are in
:mod:`brmcp.directory.db._rows` (the shapes, the constants and the one-row
readers and writers are importable from here too); :class:`DirectoryStore`
composes them into transitions, each one transaction run off the event loop.
"""

from __future__ import annotations

import secrets
import sqlite3
from dataclasses import replace
from typing import TypeVar

from brmcp.server import store as ledger

from ..model import (
    STATE_AWAITING_FUNDING,
    STATE_CRAWLING,
    STATE_PENDING_REVIEW,
    STATE_TESTING,
    TestSpec,
)
from . import _index as search_index
from . import _pagetables as pagetools
from . import _ratings as ratings
from . import _reputation as reputation
from ._peers import PeerRecords
from ._rows import (
    KIND_FEE,
    KIND_REFUND,
    KIND_TEST,
    LEAD_CONVERTED,
    LEAD_INVITED,
    LEAD_NEW,
    LEAD_PURSUING,
    Lead,
    Listing,
    Peer,
    Registration,
    SpendEntry,
    all_listings,
    get_flag,
    get_listing,
    get_registration,
    put_listing,
    put_registration,
    set_flag,
)
from ._rows import LISTING_COLUMNS as _LISTING_COLUMNS
from ._rows import REG_COLUMNS as _REG_COLUMNS
from ._rows import SCHEMA as _SCHEMA
from ._rows import SPEND_COLUMNS as _SPEND_COLUMNS
from ._rows import debit as _debit
from ._rows import listing_of as _listing
from ._rows import promote as _promote
from ._rows import registration_of as _reg
from ._rows import spend_of as _spend
from ._sql import is_postgres

__all__ = [
    "KIND_FEE",
    "KIND_REFUND",
    "KIND_TEST",
    "LEAD_CONVERTED",
    "LEAD_INVITED",
    "LEAD_NEW",
    "LEAD_PURSUING",
    "DirectoryStore",
    "Lead",
    "Listing",
    "Peer",
    "Registration",
    "SpendEntry",
    "TestSpec",
    "get_flag",
    "get_listing",
    "get_registration",
    "put_listing",
    "put_registration",
    "set_flag",
]

T = TypeVar("T")


# -- the store ------------------------------------------------------------------------


class DirectoryStore(PeerRecords):
    """The directory's tables in ``harness``'s database; every method is
    one transaction run off the event loop and shielded from cancellation
    (its effects stand once it started; :class:`~._records.Records`).
    Raises what sqlite3 raises. The peers and leads are
    :class:`~._peers.PeerRecords`'."""

    async def open(self) -> None:
        """Create the tables when missing and the search index when missing
        or out of step (:func:`brmcp.directory.db.ensure_index`). Raises
        :class:`brmcp.directory.db._search.Fts5Unavailable` without FTS5."""

        def create(conn: sqlite3.Connection) -> None:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            pagetools.open_tables(conn, self._now())
            reputation.open_tables(conn)
            ratings.open_tables(conn)
            search_index.ensure_index(conn, lambda: all_listings(conn))

        await self._run(create)

    # -- reads --------------------------------------------------------------------

    async def registration(self, uid: str) -> Registration | None:
        return await self._run(lambda c: get_registration(c, uid))

    async def listing(self, uid: str) -> Listing | None:
        return await self._run(lambda c: get_listing(c, uid))

    async def flag(self, uid: str) -> str:
        return await self._run(lambda c: get_flag(c, uid))

    async def entry(self, uid: str) -> tuple[Listing | None, Registration | None, str]:
        """The uid's live listing, registration and flag, read together."""
        return await self._run(lambda c: (get_listing(c, uid), get_registration(c, uid), get_flag(c, uid)))

    async def registrations(self) -> list[Registration]:
        """Every registration, ordered by uid."""
        return await self._run(
            lambda c: [
                _reg(r) for r in c.execute(f"SELECT {_REG_COLUMNS} FROM dir_registrations ORDER BY uid")
            ]
        )

    async def listings(self) -> list[Listing]:
        """Every live listing, ordered by uid."""
        return await self._run(
            lambda c: [
                _listing(r) for r in c.execute(f"SELECT {_LISTING_COLUMNS} FROM dir_listings ORDER BY uid")
            ]
        )

    async def balance(self, uid: str) -> int:
        return await self._run(lambda c: ledger.balance(c, uid))

    # -- the pipeline's transitions ------------------------------------------------------

    async def register(self, reg: Registration) -> bool:
        """Store ``reg`` (awaiting funding) unless a run for its uid is
        crawling or testing, or passed its test and awaits review (a second
        fee for an application already verified would buy nothing); returns
        False then (nothing changed). The registration is a renewal when the
        uid is listed; a lead for the uid is marked converted in the same
        transaction."""

        def op(conn: sqlite3.Connection) -> bool:
            current = get_registration(conn, reg.uid)
            if current is not None and current.state in (STATE_CRAWLING, STATE_TESTING):
                return False
            if current is not None and current.state == STATE_PENDING_REVIEW and current.test_outcome == "ok":
                return False
            renewal = get_listing(conn, reg.uid) is not None
            put_registration(conn, replace(reg, renewal=renewal))
            conn.execute(
                "UPDATE dir_leads SET state = ?, updated_at = ? WHERE provider_uid = ? AND state != ?",
                (LEAD_CONVERTED, reg.created_at, reg.uid, LEAD_CONVERTED),
            )
            return True

        return await self._run(op)

    async def start_if_funded(self, uid: str, ts: int) -> bool:
        """When ``uid`` awaits funding and its balance covers fee plus test
        budget: debit the fee (ref ``dirfee:<uid>:<reg_id>``) and move to
        ``crawling``, together. Returns whether it did."""

        def op(conn: sqlite3.Connection) -> bool:
            reg = get_registration(conn, uid)
            if reg is None or reg.state != STATE_AWAITING_FUNDING:
                return False
            if ledger.balance(conn, uid) < reg.fee_atoms + reg.budget_atoms:
                return False
            if reg.fee_atoms > 0 and not _debit(
                conn, uid, reg.fee_atoms, ts=ts, kind=KIND_FEE, ref=f"dirfee:{uid}:{reg.reg_id}"
            ):
                return False
            put_registration(conn, replace(reg, state=STATE_CRAWLING))
            return True

        return await self._run(op)

    async def to_testing(
        self, uid: str, reg_id: str, catalog: str, call_key: str, *, receipt_key: str | None = None
    ) -> Registration | None:
        """Store the crawled catalog and the test's callKey and move to
        ``testing`` (the key is stored before any payment); None when the
        run was replaced or is not crawling. ``receipt_key`` (``""``: the
        crawl announced none) is recorded for the run
        (:func:`brmcp.directory.db._reputation.set_run_key`)."""

        def op(conn: sqlite3.Connection) -> Registration | None:
            reg = get_registration(conn, uid)
            if reg is None or reg.reg_id != reg_id or reg.state != STATE_CRAWLING:
                return None
            reg = replace(reg, catalog=catalog, call_key=reg.call_key or call_key, state=STATE_TESTING)
            put_registration(conn, reg)
            if receipt_key is not None:
                reputation.set_run_key(conn, uid, reg_id, receipt_key)
            return reg

        return await self._run(op)

    async def park(self, uid: str, reg_id: str, error: str) -> None:
        """Move a run to ``pending_review`` with the failure noted."""

        def op(conn: sqlite3.Connection) -> None:
            reg = get_registration(conn, uid)
            if reg is not None and reg.reg_id == reg_id:
                put_registration(
                    conn, replace(reg, state=STATE_PENDING_REVIEW, test_outcome="failed", test_err=error)
                )

        await self._run(op)

    async def finish_test(
        self,
        uid: str,
        reg_id: str,
        *,
        error: str,
        latency_ms: int,
        now: int,
        expiry_seconds: int,
        receipt_verified: bool = False,
    ) -> str:
        """Record a judged test (``error`` empty: it passed). A passed
        renewal is promoted at once (``"listed"``); anything else parks in
        ``pending_review`` (returned). ``""`` when the run was replaced.
        The test's outcome, the atoms the run paid and ``receipt_verified``
        join the provider's history in the same transaction
        (:func:`brmcp.directory.db._reputation.record_test`)."""

        def op(conn: sqlite3.Connection) -> str:
            reg = get_registration(conn, uid)
            if reg is None or reg.reg_id != reg_id:
                return ""
            reputation.record_test(
                conn, uid, at=now, ok=not error, atoms=reg.paid_atoms, receipt_verified=receipt_verified
            )
            reg = replace(
                reg, test_outcome="failed" if error else "ok", test_err=error, test_latency_ms=latency_ms
            )
            if not error and reg.renewal and get_listing(conn, uid) is not None:
                put_registration(conn, reg)
                _promote(conn, reg, now, expiry_seconds)
                return "listed"
            put_registration(conn, replace(reg, state=STATE_PENDING_REVIEW))
            return STATE_PENDING_REVIEW

        return await self._run(op)

    async def approve(self, uid: str, now: int, expiry_seconds: int) -> None:
        """Publish a parked registration whose test passed. Raises
        ValueError when there is none or its test did not pass."""

        def op(conn: sqlite3.Connection) -> None:
            reg = get_registration(conn, uid)
            if reg is None or reg.state != STATE_PENDING_REVIEW:
                raise ValueError("nothing pending review for that uid")
            if reg.test_outcome != "ok":
                raise ValueError("verification has not passed")
            _promote(conn, reg, now, expiry_seconds)

        await self._run(op)

    async def reject(self, uid: str, reason: str) -> None:
        """Drop the registration; a non-empty reason becomes the flag shown
        by ``my_status``. Raises ValueError when there is none."""

        def op(conn: sqlite3.Connection) -> None:
            if get_registration(conn, uid) is None:
                raise ValueError("no registration for that uid")
            conn.execute("DELETE FROM dir_registrations WHERE uid = ?", (uid,))
            if reason:
                set_flag(conn, uid, reason)

        await self._run(op)

    async def spot_check(self, uid: str, reg_id: str, call_key: str, now: int) -> None:
        """Start a paid re-test of a live listing (a renewal run in
        ``testing``, budget the listing's ``test.maxAtoms``, funded by the
        provider's residual balance). Raises ValueError when not listed,
        already in flight, or the balance cannot fund the test."""

        def op(conn: sqlite3.Connection) -> None:
            live = get_listing(conn, uid)
            if live is None:
                raise ValueError("no listing for that uid")
            if get_registration(conn, uid) is not None:
                raise ValueError("a registration is already in flight")
            balance = ledger.balance(conn, uid)
            if balance < live.test.max_atoms:
                raise ValueError(
                    f"provider balance {balance} cannot fund the {live.test.max_atoms} atom test"
                )
            put_registration(
                conn,
                Registration(
                    uid=uid,
                    reg_id=reg_id,
                    state=STATE_TESTING,
                    description=live.description,
                    tags=live.tags,
                    test=live.test,
                    fee_atoms=0,
                    budget_atoms=live.test.max_atoms,
                    renewal=True,
                    created_at=now,
                    call_key=call_key,
                    catalog=live.catalog,
                ),
            )

        await self._run(op)

    async def expire(self, uid: str, now: int) -> bool:
        """Remove ``uid``'s listing when it lapsed (``expires_at <= now``);
        the registration of a renewal in flight stays. Returns whether it did."""

        def op(conn: sqlite3.Connection) -> bool:
            live = get_listing(conn, uid)
            if live is None or live.expires_at > now:
                return False
            conn.execute("DELETE FROM dir_listings WHERE uid = ?", (uid,))
            search_index.unindex_listing(conn, uid)
            pagetools.record_removal(conn, uid, self._now())
            if get_registration(conn, uid) is None:
                set_flag(conn, uid, "")
            return True

        return await self._run(op)

    async def recrawled(
        self, uid: str, catalog: str, now: int, *, receipt_key: str | None = None
    ) -> Listing | None:
        """Replace a live catalog after a free crawl; moves
        ``catalog_checked_at`` only. None when no longer listed. The
        re-crawl is recorded as a success in the provider's history, and
        ``receipt_key`` (``""``: the crawl announced none) as the listing's
        key, in the same transaction."""

        def op(conn: sqlite3.Connection) -> Listing | None:
            live = get_listing(conn, uid)
            if live is None:
                return None
            live = replace(live, catalog=catalog, catalog_checked_at=now)
            put_listing(conn, live)
            reputation.record_recrawl(conn, uid, at=now, ok=True)
            if receipt_key is not None:
                reputation.set_listed_key(conn, uid, receipt_key)
            return live

        return await self._run(op)

    async def recrawl_failed(self, uid: str, now: int) -> Listing | None:
        """Record a failed re-crawl of a live listing in its history; the
        listing (unchanged), or None when no longer listed."""

        def op(conn: sqlite3.Connection) -> Listing | None:
            live = get_listing(conn, uid)
            if live is not None:
                reputation.record_recrawl(conn, uid, at=now, ok=False)
            return live

        return await self._run(op)

    async def judging_key(self, uid: str, reg_id: str) -> str:
        """The receipt key a test of ``reg_id`` is checked against
        (:func:`brmcp.directory.db._reputation.judging_key`)."""
        return await self._run(lambda c: reputation.judging_key(c, uid, reg_id))

    async def unlist(self, uid: str) -> None:
        """Take a listing down; the entry goes entirely when nothing else
        (registration, flag) remains. Raises ValueError when not listed."""

        def op(conn: sqlite3.Connection) -> None:
            if get_listing(conn, uid) is None:
                raise ValueError("no listing for that uid")
            conn.execute("DELETE FROM dir_listings WHERE uid = ?", (uid,))
            search_index.unindex_listing(conn, uid)
            pagetools.record_removal(conn, uid, self._now())

        await self._run(op)

    async def set_flag(self, uid: str, note: str) -> None:
        await self._run(lambda c: set_flag(c, uid, note))

    # -- money ----------------------------------------------------------------------

    async def launch_spend(
        self, *, uid: str, tool: str, atoms: int, call_key: str, ts: int, escrow_reg: str | None
    ) -> SpendEntry | None:
        """Journal an outbound payment before it is made. With
        ``escrow_reg`` (the run's ``reg_id``) it is a test payment: the
        atoms are debited from ``uid``'s balance (ref ``dirtest:...``) and
        added to the registration's ``paid_atoms`` in the same transaction;
        None (nothing written) when the balance does not cover it or the
        run was replaced. Without, it is paid out of the directory's pocket."""
        ref = f"dirtest:{uid}:{secrets.token_hex(8)}"

        def op(conn: sqlite3.Connection) -> SpendEntry | None:
            if escrow_reg is not None:
                reg = get_registration(conn, uid)
                if reg is None or reg.reg_id != escrow_reg:
                    return None
                if not _debit(conn, uid, atoms, ts=ts, kind=KIND_TEST, ref=ref):
                    return None
                put_registration(conn, replace(reg, paid_atoms=reg.paid_atoms + atoms))
            insert = (
                "INSERT INTO dir_spend (ts, uid, tool, atoms, ref, call_key, escrow, state) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'launched')"
            )
            values = (ts, uid, tool, atoms, ref, call_key, int(escrow_reg is not None))
            if is_postgres(conn):
                spend_id = int(conn.execute(insert + " RETURNING id", values).fetchone()[0])
            else:
                spend_id = int(conn.execute(insert, values).lastrowid or 0)
            return SpendEntry(
                spend_id,
                ts,
                uid,
                tool,
                atoms,
                ref,
                call_key,
                escrow_reg is not None,
                "launched",
            )

        return await self._run(op)

    async def spend_paid(self, spend_id: int) -> None:
        """The rail confirmed the payment."""
        await self._run(lambda c: c.execute("UPDATE dir_spend SET state = 'paid' WHERE id = ?", (spend_id,)))

    async def spend_failed(self, spend_id: int, ts: int) -> None:
        """A definitive rail failure: no money left. The journal row goes
        and an escrowed amount returns to the provider's balance (ref
        ``dirrefund:<spend ref>``) and leaves ``paid_atoms``, together."""

        def op(conn: sqlite3.Connection) -> None:
            row = conn.execute(f"SELECT {_SPEND_COLUMNS} FROM dir_spend WHERE id = ?", (spend_id,)).fetchone()
            if row is None:
                return
            entry = _spend(row)
            conn.execute("DELETE FROM dir_spend WHERE id = ?", (spend_id,))
            if not entry.escrow:
                return
            after = ledger.add_balance(conn, entry.uid, entry.atoms)
            ledger.record_movement(
                conn,
                ts=ts,
                peer=entry.uid,
                kind=KIND_REFUND,
                atoms=entry.atoms,
                ref=f"dirrefund:{entry.ref}",
                balance_after=after,
            )
            reg = get_registration(conn, entry.uid)
            if reg is not None and reg.call_key == entry.call_key:
                put_registration(conn, replace(reg, paid_atoms=max(0, reg.paid_atoms - entry.atoms)))

        await self._run(op)

    async def spends(self, uid: str | None = None, call_key: str | None = None) -> list[SpendEntry]:
        """The spend journal, oldest first (of ``uid`` / ``call_key`` when given)."""

        def op(conn: sqlite3.Connection) -> list[SpendEntry]:
            sql = f"SELECT {_SPEND_COLUMNS} FROM dir_spend"
            clauses: list[str] = []
            params: list[str] = []
            if uid is not None:
                clauses.append("uid = ?")
                params.append(uid)
            if call_key is not None:
                clauses.append("call_key = ?")
                params.append(call_key)
            if clauses:
                sql += " WHERE " + " AND ".join(clauses)
            return [_spend(r) for r in conn.execute(sql + " ORDER BY id", params)]

        return await self._run(op)
