"""The directory's tables and rows (docs/directory.md §Files): the schema,
the row dataclasses, their mapping to and from SQLite rows, and the plain
functions that read or write one row inside a transaction the caller holds
(karamble/brmcp, ``directory/store.go``, for the shapes).

:mod:`brmcp.directory.db._store` composes these into the pipeline's
transitions, each one transaction of the harness; the row shapes, the
``KIND_*`` and ``LEAD_*`` constants and the one-row readers and writers
(``get_*``, ``put_*``, ``set_flag``) are importable from there too.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from brmcp.server import store as ledger

from ..model import TestSpec
from . import _index as search_index
from . import _poolinfo as poolinfo
from . import _reputation as reputation

__all__ = [
    "KIND_FEE",
    "KIND_REFUND",
    "KIND_TEST",
    "LEAD_COLUMNS",
    "LEAD_CONVERTED",
    "LEAD_INVITED",
    "LEAD_NEW",
    "LEAD_PURSUING",
    "LISTING_COLUMNS",
    "REG_COLUMNS",
    "SCHEMA",
    "SPEND_COLUMNS",
    "Lead",
    "Listing",
    "Peer",
    "Registration",
    "SpendEntry",
    "all_listings",
    "debit",
    "get_flag",
    "get_lead",
    "get_listing",
    "get_registration",
    "lead_of",
    "listing_of",
    "promote",
    "put_lead",
    "put_listing",
    "put_registration",
    "registration_of",
    "set_flag",
    "spend_of",
]

#: Ledger movement kinds the directory writes (``movements.kind``).
KIND_FEE = "directory_fee"
KIND_TEST = "directory_test"
KIND_REFUND = "directory_refund"

LEAD_NEW = "new"
LEAD_PURSUING = "pursuing"
LEAD_INVITED = "invited"
LEAD_CONVERTED = "converted"

SCHEMA = """
CREATE TABLE IF NOT EXISTS dir_registrations (
    uid             TEXT PRIMARY KEY,
    reg_id          TEXT NOT NULL,
    state           TEXT NOT NULL,
    description     TEXT NOT NULL,
    tags            TEXT NOT NULL,
    test            TEXT NOT NULL,
    fee_atoms       INTEGER NOT NULL CHECK (fee_atoms >= 0),
    budget_atoms    INTEGER NOT NULL CHECK (budget_atoms >= 0),
    call_key        TEXT NOT NULL DEFAULT '',
    paid_atoms      INTEGER NOT NULL DEFAULT 0 CHECK (paid_atoms >= 0),
    renewal         INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    catalog         TEXT NOT NULL DEFAULT '',
    test_outcome    TEXT NOT NULL DEFAULT '',
    test_err        TEXT NOT NULL DEFAULT '',
    test_latency_ms INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS dir_listings (
    uid                     TEXT PRIMARY KEY,
    description             TEXT NOT NULL,
    tags                    TEXT NOT NULL,
    test                    TEXT NOT NULL,
    catalog                 TEXT NOT NULL,
    catalog_checked_at      INTEGER NOT NULL,
    last_verified_execution INTEGER NOT NULL,
    test_latency_ms         INTEGER NOT NULL,
    approved_at             INTEGER NOT NULL,
    renewed_at              INTEGER NOT NULL,
    expires_at              INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dir_flags (
    uid  TEXT PRIMARY KEY,
    note TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dir_peers (
    uid              TEXT PRIMARY KEY,
    pub_key          TEXT NOT NULL,
    added_at         INTEGER NOT NULL,
    last_verified_at INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS dir_leads (
    provider_uid TEXT PRIMARY KEY,
    peer_uid     TEXT NOT NULL,
    description  TEXT NOT NULL,
    tags         TEXT NOT NULL,
    state        TEXT NOT NULL,
    note         TEXT NOT NULL DEFAULT '',
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dir_spend (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    ts         INTEGER NOT NULL,
    uid        TEXT NOT NULL,
    tool       TEXT NOT NULL,
    atoms      INTEGER NOT NULL CHECK (atoms > 0),
    ref        TEXT NOT NULL UNIQUE,
    call_key   TEXT NOT NULL,
    escrow     INTEGER NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('launched', 'paid'))
);
"""


def _tags(text: str) -> tuple[str, ...]:
    value = json.loads(text)
    return tuple(str(tag) for tag in value) if isinstance(value, list) else ()


def _test(text: str) -> TestSpec:
    return TestSpec.from_json(json.loads(text))


def _dump_test(test: TestSpec) -> str:
    return json.dumps(test.to_json(), separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Registration:
    """One in-flight pipeline run (Go's ``Registration``). Fee and budget
    are frozen at ``register``; ``call_key`` is stored before the paid test
    so a restart re-issues the same logical call; ``paid_atoms`` moves in
    the transaction of each escrow debit. ``reg_id`` names this application
    in ledger refs."""

    uid: str
    reg_id: str
    state: str
    description: str
    tags: tuple[str, ...]
    test: TestSpec
    fee_atoms: int
    budget_atoms: int
    renewal: bool
    created_at: int
    call_key: str = ""
    paid_atoms: int = 0
    catalog: str = ""
    test_outcome: str = ""
    test_err: str = ""
    test_latency_ms: int = 0

    @property
    def remaining_atoms(self) -> int:
        return max(0, self.budget_atoms - self.paid_atoms)


@dataclass(frozen=True, slots=True)
class Listing:
    """A published provider (Go's ``Listing``); ``catalog`` is the crawled
    ``tools/list`` tools array as compact JSON text."""

    uid: str
    description: str
    tags: tuple[str, ...]
    test: TestSpec
    catalog: str
    catalog_checked_at: int
    last_verified_execution: int
    test_latency_ms: int
    approved_at: int
    renewed_at: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class Peer:
    """A curated peer directory and its trusted snapshot key (hex)."""

    uid: str
    pub_key: str
    added_at: int
    last_verified_at: int = 0


@dataclass(frozen=True, slots=True)
class Lead:
    """A provider learned from a peer's snapshot, awaiting first-party
    verification (Go's ``Lead``)."""

    provider_uid: str
    peer_uid: str
    state: str
    created_at: int
    updated_at: int
    description: str = ""
    tags: tuple[str, ...] = ()
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """Go's ``Lead`` JSON: key order and ``omitempty`` as in ``store.go``."""
        out: dict[str, Any] = {"providerUid": self.provider_uid, "peerUid": self.peer_uid}
        if self.description:
            out["description"] = self.description
        if self.tags:
            out["tags"] = list(self.tags)
        out["state"] = self.state
        if self.note:
            out["note"] = self.note
        out["createdAt"] = self.created_at
        out["updatedAt"] = self.updated_at
        return out


@dataclass(frozen=True, slots=True)
class SpendEntry:
    """One outbound payment the directory launched: ``escrow`` when it was
    debited from the payee's own balance (a test), else out of the
    directory's pocket (a snapshot purchase). ``state`` is ``launched``
    until the rail confirms, then ``paid``."""

    id: int
    ts: int
    uid: str
    tool: str
    atoms: int
    ref: str
    call_key: str
    escrow: bool
    state: str

    def to_json(self) -> dict[str, Any]:
        """Go's ``SpendEntry`` keys (``ts``, ``uid``, ``tool``, ``atoms``)."""
        return {"ts": self.ts, "uid": self.uid, "tool": self.tool, "atoms": self.atoms}


# -- row mapping ----------------------------------------------------------------

REG_COLUMNS = (
    "uid, reg_id, state, description, tags, test, fee_atoms, budget_atoms, call_key, paid_atoms, "
    "renewal, created_at, catalog, test_outcome, test_err, test_latency_ms"
)
LISTING_COLUMNS = (
    "uid, description, tags, test, catalog, catalog_checked_at, last_verified_execution, "
    "test_latency_ms, approved_at, renewed_at, expires_at"
)
LEAD_COLUMNS = "provider_uid, peer_uid, description, tags, state, note, created_at, updated_at"
SPEND_COLUMNS = "id, ts, uid, tool, atoms, ref, call_key, escrow, state"


def registration_of(row: tuple[Any, ...]) -> Registration:
    return Registration(
        uid=row[0],
        reg_id=row[1],
        state=row[2],
        description=row[3],
        tags=_tags(row[4]),
        test=_test(row[5]),
        fee_atoms=int(row[6]),
        budget_atoms=int(row[7]),
        call_key=row[8],
        paid_atoms=int(row[9]),
        renewal=bool(row[10]),
        created_at=int(row[11]),
        catalog=row[12],
        test_outcome=row[13],
        test_err=row[14],
        test_latency_ms=int(row[15]),
    )


def listing_of(row: tuple[Any, ...]) -> Listing:
    return Listing(
        uid=row[0],
        description=row[1],
        tags=_tags(row[2]),
        test=_test(row[3]),
        catalog=row[4],
        catalog_checked_at=int(row[5]),
        last_verified_execution=int(row[6]),
        test_latency_ms=int(row[7]),
        approved_at=int(row[8]),
        renewed_at=int(row[9]),
        expires_at=int(row[10]),
    )


def lead_of(row: tuple[Any, ...]) -> Lead:
    return Lead(
        provider_uid=row[0],
        peer_uid=row[1],
        description=row[2],
        tags=_tags(row[3]),
        state=row[4],
        note=row[5],
        created_at=int(row[6]),
        updated_at=int(row[7]),
    )


def spend_of(row: tuple[Any, ...]) -> SpendEntry:
    return SpendEntry(
        id=int(row[0]),
        ts=int(row[1]),
        uid=row[2],
        tool=row[3],
        atoms=int(row[4]),
        ref=row[5],
        call_key=row[6],
        escrow=bool(row[7]),
        state=row[8],
    )


def get_registration(conn: sqlite3.Connection, uid: str) -> Registration | None:
    row = conn.execute(f"SELECT {REG_COLUMNS} FROM dir_registrations WHERE uid = ?", (uid,)).fetchone()
    return registration_of(row) if row else None


def put_registration(conn: sqlite3.Connection, reg: Registration) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO dir_registrations ({REG_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            reg.uid,
            reg.reg_id,
            reg.state,
            reg.description,
            json.dumps(list(reg.tags)),
            _dump_test(reg.test),
            reg.fee_atoms,
            reg.budget_atoms,
            reg.call_key,
            reg.paid_atoms,
            int(reg.renewal),
            reg.created_at,
            reg.catalog,
            reg.test_outcome,
            reg.test_err,
            reg.test_latency_ms,
        ),
    )


def get_listing(conn: sqlite3.Connection, uid: str) -> Listing | None:
    row = conn.execute(f"SELECT {LISTING_COLUMNS} FROM dir_listings WHERE uid = ?", (uid,)).fetchone()
    return listing_of(row) if row else None


def put_listing(conn: sqlite3.Connection, item: Listing) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO dir_listings ({LISTING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            item.uid,
            item.description,
            json.dumps(list(item.tags)),
            _dump_test(item.test),
            item.catalog,
            item.catalog_checked_at,
            item.last_verified_execution,
            item.test_latency_ms,
            item.approved_at,
            item.renewed_at,
            item.expires_at,
        ),
    )
    search_index.index_listing(conn, item)


def all_listings(conn: sqlite3.Connection) -> list[Listing]:
    return [listing_of(r) for r in conn.execute(f"SELECT {LISTING_COLUMNS} FROM dir_listings ORDER BY uid")]


def get_flag(conn: sqlite3.Connection, uid: str) -> str:
    row = conn.execute("SELECT note FROM dir_flags WHERE uid = ?", (uid,)).fetchone()
    return str(row[0]) if row else ""


def set_flag(conn: sqlite3.Connection, uid: str, note: str) -> None:
    if note:
        conn.execute("INSERT OR REPLACE INTO dir_flags (uid, note) VALUES (?, ?)", (uid, note))
    else:
        conn.execute("DELETE FROM dir_flags WHERE uid = ?", (uid,))


def debit(conn: sqlite3.Connection, uid: str, atoms: int, *, ts: int, kind: str, ref: str) -> bool:
    """Take ``atoms`` from ``uid``'s harness balance under ``ref``; False
    (nothing written) when the balance does not cover it."""
    if ledger.balance(conn, uid) < atoms:
        return False
    after = ledger.add_balance(conn, uid, -atoms)
    ledger.record_movement(conn, ts=ts, peer=uid, kind=kind, atoms=-atoms, ref=ref, balance_after=after)
    return True


def promote(conn: sqlite3.Connection, reg: Registration, now: int, expiry_seconds: int) -> None:
    """Publish ``reg`` as the live listing (a renewal keeps its approval
    date and is stamped ``renewed_at``), drop the run and the flag; the
    run's crawled receipt key becomes the listing's
    (:func:`brmcp.directory.db._reputation.adopt_run_key`), and so does its
    crawled pool (:func:`brmcp.directory.db._poolinfo.adopt_run_pool`)."""
    current = get_listing(conn, reg.uid)
    put_listing(
        conn,
        Listing(
            uid=reg.uid,
            description=reg.description,
            tags=reg.tags,
            test=reg.test,
            catalog=reg.catalog,
            catalog_checked_at=now,
            last_verified_execution=now,
            test_latency_ms=reg.test_latency_ms,
            approved_at=current.approved_at if current is not None else now,
            renewed_at=now if current is not None else 0,
            expires_at=now + expiry_seconds,
        ),
    )
    reputation.adopt_run_key(conn, reg.uid, reg.reg_id)
    poolinfo.adopt_run_pool(conn, reg.uid, reg.reg_id)
    conn.execute("DELETE FROM dir_registrations WHERE uid = ?", (reg.uid,))
    set_flag(conn, reg.uid, "")


def get_lead(conn: sqlite3.Connection, uid: str) -> Lead | None:
    row = conn.execute(f"SELECT {LEAD_COLUMNS} FROM dir_leads WHERE provider_uid = ?", (uid,)).fetchone()
    return lead_of(row) if row else None


def put_lead(conn: sqlite3.Connection, lead: Lead) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO dir_leads ({LEAD_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            lead.provider_uid,
            lead.peer_uid,
            lead.description,
            json.dumps(list(lead.tags)),
            lead.state,
            lead.note,
            lead.created_at,
            lead.updated_at,
        ),
    )
