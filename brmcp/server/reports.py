"""Read-only operator reports on a harness's ledger (``brmcp-serve
balances``, ``statement``, ``stats``).

The database is opened with a SQLite read-only connection (``mode=ro``,
``query_only``), so a report is safe while the bot runs: it never writes,
and WAL readers do not block the bot's writes. Every figure comes from the
``balances`` and ``movements`` tables (brmcp/server/store/_schema.py): atoms are
signed in movements (tips and credits positive, charges negative, refunds
positive). With the built-in ledger the sum of all balances equals the sum
of all movements (:attr:`LedgerStats.reconciles`); with an external
Billing store the balances live elsewhere and only the movements are here.
Free calls are not journaled, so the counts here are of paid calls.

Tips from senders not allowed when they arrived are held, not credited
(``held_tips``, WIRE.md §Payments "Tips from senders not allowed"): they
are in no balance and no movement until their sender is allowed, and are
reported beside them (:func:`held_totals`, :func:`held_of`,
:attr:`LedgerStats.held_atoms`), so that what the wallet received
(:attr:`LedgerStats.received_atoms`) is accounted for to the atom.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .store import DB_FILENAME, HeldTip, StatementEntry, StoreError

__all__ = [
    "HeldTotal",
    "LedgerStats",
    "StatementLine",
    "ToolStats",
    "balances",
    "held_of",
    "held_totals",
    "ledger_stats",
    "open_readonly",
    "statement",
]

_CALL_KINDS = ("charge", "refund", "recovery_refund")


def open_readonly(data_dir: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection to ``<data_dir>/brmcp.sqlite3``. Raises
    :class:`StoreError` naming the file when it is missing, unreadable or
    not a brmcp ledger."""
    path = Path(data_dir).expanduser() / DB_FILENAME
    if not path.is_file():
        raise StoreError(f"no ledger at {path} (has the bot run with this --datadir?)")
    try:
        conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0, isolation_level=None
        )
        conn.execute("PRAGMA query_only=1")
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read ledger database {path}: {exc}") from exc
    if not {"balances", "movements"} <= tables:
        conn.close()
        raise StoreError(f"{path} is not a brmcp ledger database")
    return conn


def _has_tool_column(conn: sqlite3.Connection) -> bool:
    return any(row[1] == "tool" for row in conn.execute("PRAGMA table_info(movements)"))


def _has_held_tips(conn: sqlite3.Connection) -> bool:
    """False for a ledger written before schema version 3 (no held tips)."""
    return (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'held_tips'").fetchone()
        is not None
    )


@dataclass(frozen=True, slots=True)
class HeldTotal:
    """The tips held for one sender not allowed: ``uid``, how many
    (``tips``) and their ``atoms`` (floored from milliatoms, each > 0)."""

    uid: str
    tips: int
    atoms: int

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "tips": self.tips, "atoms": self.atoms}


def held_totals(conn: sqlite3.Connection) -> list[HeldTotal]:
    """Per sender, the tips held because it was not allowed, most atoms first."""
    if not _has_held_tips(conn):
        return []
    rows = conn.execute(
        "SELECT peer, COUNT(*), SUM(atoms) FROM held_tips GROUP BY peer ORDER BY SUM(atoms) DESC, peer"
    ).fetchall()
    return [HeldTotal(str(r[0]), int(r[1]), int(r[2])) for r in rows]


def held_of(conn: sqlite3.Connection, peer: str) -> list[HeldTip]:
    """The tips held for ``peer`` (uid, compared without case), oldest first."""
    if not _has_held_tips(conn):
        return []
    rows = conn.execute(
        "SELECT sequence_id, peer, amount_matoms, atoms, ts FROM held_tips "
        "WHERE lower(peer) = lower(?) ORDER BY ts, sequence_id",
        (peer,),
    ).fetchall()
    return [HeldTip(int(r[0]), str(r[1]), int(r[2]), int(r[3]), float(r[4])) for r in rows]


def balances(conn: sqlite3.Connection) -> list[tuple[str, int]]:
    """Every caller's prepaid balance (uid, atoms), largest first; zero
    balances included."""
    rows = conn.execute("SELECT peer, atoms FROM balances ORDER BY atoms DESC, peer").fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


@dataclass(frozen=True, slots=True)
class StatementLine:
    """One movement of a caller: the :class:`StatementEntry` fields plus the
    ``tool`` of a charge or refund (None when unknown)."""

    entry: StatementEntry
    tool: str | None

    def to_dict(self) -> dict[str, Any]:
        e = self.entry
        return {
            "ts": e.ts,
            "kind": e.kind,
            "atoms": e.atoms,
            "tool": self.tool,
            "call_key": e.call_key,
            "tip_seq": e.tip_seq,
            "balance_after": e.balance_after,
        }


def statement(conn: sqlite3.Connection, peer: str) -> list[StatementLine]:
    """Every money movement of ``peer`` (uid, compared without case), oldest first."""
    tool = "tool" if _has_tool_column(conn) else "NULL"
    rows = conn.execute(
        f"SELECT ts, kind, atoms, call_key, tip_seq, balance_after, {tool} FROM movements "
        "WHERE lower(peer) = lower(?) ORDER BY id",
        (peer,),
    ).fetchall()
    return [
        StatementLine(
            StatementEntry(
                float(r[0]), str(r[1]), int(r[2]), r[3], None if r[4] is None else int(r[4]), r[5]
            ),
            r[6],
        )
        for r in rows
    ]


@dataclass(frozen=True, slots=True)
class ToolStats:
    """Paid calls of one tool: ``charges`` (count) and ``charged_atoms``,
    ``refunds`` (count, including refunds after a crash) and
    ``refunded_atoms``; ``net_atoms`` = charged - refunded."""

    tool: str
    charges: int
    charged_atoms: int
    refunds: int
    refunded_atoms: int

    @property
    def net_atoms(self) -> int:
        return self.charged_atoms - self.refunded_atoms

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "charges": self.charges,
            "charged_atoms": self.charged_atoms,
            "refunds": self.refunds,
            "refunded_atoms": self.refunded_atoms,
            "net_atoms": self.net_atoms,
        }


@dataclass(frozen=True, slots=True)
class LedgerStats:
    """Totals over the whole ledger (atoms are positive amounts here).

    ``tips``/``tip_atoms``: tips credited; ``credits``/``credit_atoms``:
    other credits (``Harness.credit``); ``charges``, ``refunds`` and their
    atoms over all tools; ``per_tool`` by tool name (``"(unknown)"`` for
    rows written before tools were recorded); ``callers``: uids with a
    balance row; ``balance_atoms``: the sum of balances; ``movement_atoms``:
    the signed sum of all movements; ``reconciles``: they are equal (always
    so with the built-in ledger). ``held_tips``/``held_atoms``: tips held
    for senders not allowed (in no balance and no movement yet);
    ``received_atoms`` = ``tip_atoms + held_atoms``, every atom of tips the
    ledger knows the wallet received (sub-atom remainders excepted)."""

    tips: int
    tip_atoms: int
    credits: int
    credit_atoms: int
    charges: int
    charged_atoms: int
    refunds: int
    refunded_atoms: int
    per_tool: tuple[ToolStats, ...]
    callers: int
    balance_atoms: int
    movement_atoms: int
    held_tips: int = 0
    held_atoms: int = 0

    @property
    def reconciles(self) -> bool:
        return self.balance_atoms == self.movement_atoms

    @property
    def received_atoms(self) -> int:
        return self.tip_atoms + self.held_atoms

    def to_dict(self) -> dict[str, Any]:
        return {
            "tips": self.tips,
            "tip_atoms": self.tip_atoms,
            "credits": self.credits,
            "credit_atoms": self.credit_atoms,
            "charges": self.charges,
            "charged_atoms": self.charged_atoms,
            "refunds": self.refunds,
            "refunded_atoms": self.refunded_atoms,
            "per_tool": [t.to_dict() for t in self.per_tool],
            "callers": self.callers,
            "balance_atoms": self.balance_atoms,
            "movement_atoms": self.movement_atoms,
            "reconciles": self.reconciles,
            "held_tips": self.held_tips,
            "held_atoms": self.held_atoms,
            "received_atoms": self.received_atoms,
        }


def ledger_stats(conn: sqlite3.Connection) -> LedgerStats:
    """The totals of :class:`LedgerStats`, read in one transaction so the
    figures agree with each other while the bot writes."""
    tool = "COALESCE(tool, '(unknown)')" if _has_tool_column(conn) else "'(unknown)'"
    conn.execute("BEGIN")
    try:
        kinds = {
            str(r[0]): (int(r[1]), int(r[2]))
            for r in conn.execute(
                "SELECT kind, COUNT(*), COALESCE(SUM(atoms), 0) FROM movements GROUP BY kind"
            )
        }
        per: dict[str, list[int]] = {}
        for name, what, count, atoms in conn.execute(
            f"SELECT {tool}, kind, COUNT(*), COALESCE(SUM(atoms), 0) FROM movements "
            "WHERE kind IN ('charge', 'refund', 'recovery_refund') GROUP BY 1, 2"
        ):
            row = per.setdefault(str(name), [0, 0, 0, 0])
            if what == "charge":
                row[0] += int(count)
                row[1] += -int(atoms)
            else:
                row[2] += int(count)
                row[3] += int(atoms)
        callers, balance_atoms = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(atoms), 0) FROM balances"
        ).fetchone()
        movement_atoms = conn.execute("SELECT COALESCE(SUM(atoms), 0) FROM movements").fetchone()[0]
        held = (
            conn.execute("SELECT COUNT(*), COALESCE(SUM(atoms), 0) FROM held_tips").fetchone()
            if _has_held_tips(conn)
            else (0, 0)
        )
    finally:
        conn.execute("COMMIT")

    def kind(name: str) -> tuple[int, int]:
        return kinds.get(name, (0, 0))

    refunds = (kind("refund")[0] + kind("recovery_refund")[0], kind("refund")[1] + kind("recovery_refund")[1])
    return LedgerStats(
        tips=kind("tip")[0],
        tip_atoms=kind("tip")[1],
        credits=kind("credit")[0],
        credit_atoms=kind("credit")[1],
        charges=kind("charge")[0],
        charged_atoms=-kind("charge")[1],
        refunds=refunds[0],
        refunded_atoms=refunds[1],
        per_tool=tuple(ToolStats(name, *values) for name, values in sorted(per.items())),
        callers=int(callers),
        balance_atoms=int(balance_atoms),
        movement_atoms=int(movement_atoms),
        held_tips=int(held[0]),
        held_atoms=int(held[1]),
    )
