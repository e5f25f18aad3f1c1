"""Read-only operator reports on a harness's book (``brmcp-serve
balances``, ``statement``, ``stats``), on either backend of the store.

:func:`open_book` opens the book a ``store`` URL names
(:mod:`.store.url`) for reading only, so a report is safe while the bot
runs -- on a pool's shared PostgreSQL book, while every member runs:

* SQLite, ``<data_dir>/brmcp.sqlite3``: a read-only connection (``mode=ro``,
  ``query_only``; :func:`open_readonly`); WAL readers do not block the
  bot's writes;
* PostgreSQL: a psycopg 3 connection whose every transaction is ``READ
  ONLY`` (``default_transaction_read_only``); nothing is created or
  migrated, so a database no harness has prepared is refused. The URL's
  password is in no error message (:meth:`.store.url.StoreURL.redacted`,
  :meth:`~.store.url.StoreURL.scrub`).

A report runs inside :meth:`ReportBook.snapshot`, one read transaction
(``REPEATABLE READ`` on PostgreSQL, a deferred read transaction on
SQLite's WAL), so its figures come from one state of the book while the
bot writes. The queries are written once with ``?`` placeholders for both
dialects (as the store's operations are, :mod:`.store._conn`); what differs
is kept in :class:`ReportBook`: the catalogue probes (``sqlite_master`` and
``pragma_table_info`` or ``information_schema``) and the ordering of uids
(byte order on both: ``COLLATE "C"`` on PostgreSQL), so both backends print
the same report for the same book.

Every figure comes from the ``balances`` and ``movements`` tables
(brmcp/server/store/_schema.py): atoms are signed in movements (tips and
credits positive, charges negative, refunds positive). With the built-in
ledger the sum of all balances equals the sum of all movements
(:attr:`LedgerStats.reconciles`); with an external Billing store the
balances live elsewhere and only the movements are here. Free calls are
not journaled, so the counts here are of paid calls.

Tips from senders not allowed when they arrived are held, not credited
(``held_tips``, WIRE.md §Payments "Tips from senders not allowed"): they
are in no balance and no movement until their sender is allowed, and are
reported beside them (:func:`held_totals`, :func:`held_of`,
:attr:`LedgerStats.held_atoms`), so that what the wallet received
(:attr:`LedgerStats.received_atoms`) is accounted for to the atom.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from brmcp.server.store import DB_FILENAME, HeldTip, StatementEntry, StoreError
from brmcp.server.store._conn import Connection, Cursor
from brmcp.server.store.url import DEFAULT_STORE, StoreURL, parse_store_url

__all__ = [
    "HeldTotal",
    "LedgerStats",
    "ReportBook",
    "StatementLine",
    "ToolStats",
    "balances",
    "held_of",
    "held_totals",
    "ledger_stats",
    "open_book",
    "open_readonly",
    "statement",
]

_CALL_KINDS = ("charge", "refund", "recovery_refund")

#: The SQL dialect of a book.
Dialect = Literal["sqlite", "postgresql"]

#: Catalogue probes per dialect: is there a table ``?``; has table ``?`` a column ``?``.
_HAS_TABLE = {
    "sqlite": "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
    "postgresql": (
        "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?"
    ),
}
_HAS_COLUMN = {
    "sqlite": "SELECT 1 FROM pragma_table_info(?) WHERE name = ?",
    "postgresql": (
        "SELECT 1 FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = ? AND column_name = ?"
    ),
}
#: Statements opening and closing a report's read transaction.
_BEGIN = {"sqlite": "BEGIN", "postgresql": "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"}
_END = {"sqlite": "COMMIT", "postgresql": "ROLLBACK"}


class ReportBook:
    """A book opened for reading: ``conn`` runs statements with ``?``
    placeholders (:class:`~.store._conn.Connection`), ``dialect`` says
    which backend, ``where`` names the book in errors (the file, or the
    PostgreSQL URL with its password redacted). :meth:`scrub` removes the
    URL's password from a driver message; :meth:`close` closes the
    connection (idempotent). Build one with :func:`open_book`."""

    __slots__ = ("_close", "_depth", "_probes", "_scrub", "conn", "dialect", "where")

    def __init__(
        self,
        conn: Connection,
        dialect: Dialect,
        where: str,
        *,
        close: Callable[[], None] = lambda: None,
        scrub: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.conn = conn
        self.dialect: Dialect = dialect
        self.where = where
        self._close: Callable[[], None] | None = close
        self._scrub = scrub
        self._depth = 0
        self._probes: dict[tuple[str, ...], bool] = {}

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Cursor:
        """Run one read statement (``?`` placeholders, either dialect)."""
        return self.conn.execute(sql, parameters)

    def has_table(self, table: str) -> bool:
        """Whether the book has ``table`` (an older SQLite ledger may lack one)."""
        key = (table,)
        if key not in self._probes:
            self._probes[key] = self.execute(_HAS_TABLE[self.dialect], key).fetchone() is not None
        return self._probes[key]

    def has_column(self, table: str, column: str) -> bool:
        """Whether ``table`` of the book has ``column``."""
        key = (table, column)
        if key not in self._probes:
            self._probes[key] = self.execute(_HAS_COLUMN[self.dialect], key).fetchone() is not None
        return self._probes[key]

    def by_bytes(self, column: str) -> str:
        """``column`` (text) as an ORDER BY term sorting by bytes, as
        SQLite's default collation does, whatever the PostgreSQL
        database's locale."""
        return f'{column} COLLATE "C"' if self.dialect == "postgresql" else column

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read transaction around the block: every statement in it
        sees the same state of the book. Nested blocks join the outer one;
        a transaction already open on a SQLite connection is joined too."""
        outer = self._depth == 0 and not (
            isinstance(self.conn, sqlite3.Connection) and self.conn.in_transaction
        )
        if outer:
            self.execute(_BEGIN[self.dialect])
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if outer:
                with contextlib.suppress(Exception):  # a broken connection ends its transaction
                    self.execute(_END[self.dialect])

    def scrub(self, text: str) -> str:
        """``text`` with the store URL's password replaced by ``[redacted]``."""
        return self._scrub(text)

    def close(self) -> None:
        if self._close is not None:
            close, self._close = self._close, None
            close()


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


def open_book(data_dir: str | os.PathLike[str], store: str | StoreURL = DEFAULT_STORE) -> ReportBook:
    """The book ``store`` names, opened read-only: ``sqlite:`` is
    ``<data_dir>/brmcp.sqlite3`` (:func:`open_readonly`), a PostgreSQL URL
    that database (``data_dir`` unused). Raises :class:`StoreError` (one
    line naming the file or the redacted URL) when it cannot be reached or
    read, is not a brmcp book, or psycopg 3 is missing; :class:`ValueError`
    for a ``store`` that is not a store URL."""
    url = store if isinstance(store, StoreURL) else parse_store_url(store)
    if url.kind == "sqlite":
        conn = open_readonly(data_dir)
        where = str(Path(data_dir).expanduser() / DB_FILENAME)
        return ReportBook(conn, "sqlite", where, close=conn.close)
    return _open_postgres(url)


def _open_postgres(url: StoreURL) -> ReportBook:
    from brmcp.server.store.postgres.connection import PgConnection
    from brmcp.server.store.postgres.driver import psycopg
    from brmcp.server.store.postgres.executor import CONNECT_TIMEOUT

    driver = psycopg()
    where = url.redacted()

    def detail(exc: BaseException) -> str:
        return url.scrub(" ".join(str(exc).split()))

    try:
        raw = driver.connect(url.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
    except driver.Error as exc:
        raise StoreError(f"cannot connect to PostgreSQL store {where}: {detail(exc)}") from None
    book = ReportBook(PgConnection(raw), "postgresql", where, close=raw.close, scrub=url.scrub)
    try:
        book.execute("SET default_transaction_read_only = on")
        ledger = book.has_table("balances") and book.has_table("movements")
    except driver.Error as exc:
        book.close()
        raise StoreError(f"cannot read PostgreSQL store {where}: {detail(exc)}") from None
    if not ledger:
        book.close()
        raise StoreError(
            f"PostgreSQL database {where} is not a brmcp ledger (no balances and movements tables; "
            "has a bot run with this store?)"
        )
    return book


def _book(source: ReportBook | sqlite3.Connection) -> ReportBook:
    """``source`` as a :class:`ReportBook` (a SQLite connection, e.g. from
    :func:`open_readonly`, is wrapped; closing the wrapper leaves it open)."""
    if isinstance(source, ReportBook):
        return source
    return ReportBook(source, "sqlite", "the ledger")


@dataclass(frozen=True, slots=True)
class HeldTotal:
    """The tips held for one sender not allowed: ``uid``, how many
    (``tips``) and their ``atoms`` (floored from milliatoms, each > 0)."""

    uid: str
    tips: int
    atoms: int

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "tips": self.tips, "atoms": self.atoms}


def held_totals(source: ReportBook | sqlite3.Connection) -> list[HeldTotal]:
    """Per sender, the tips held because it was not allowed, most atoms
    first (then by uid); none for a ledger older than held tips."""
    book = _book(source)
    if not book.has_table("held_tips"):
        return []
    rows = book.execute(
        "SELECT peer, COUNT(*), SUM(atoms) FROM held_tips GROUP BY peer "
        f"ORDER BY SUM(atoms) DESC, {book.by_bytes('peer')}"
    ).fetchall()
    return [HeldTotal(str(r[0]), int(r[1]), int(r[2])) for r in rows]


def held_of(source: ReportBook | sqlite3.Connection, peer: str) -> list[HeldTip]:
    """The tips held for ``peer`` (uid, compared without case), oldest first."""
    book = _book(source)
    if not book.has_table("held_tips"):
        return []
    rows = book.execute(
        "SELECT sequence_id, peer, amount_matoms, atoms, ts FROM held_tips "
        "WHERE lower(peer) = lower(?) ORDER BY ts, sequence_id",
        (peer,),
    ).fetchall()
    return [HeldTip(int(r[0]), str(r[1]), int(r[2]), int(r[3]), float(r[4])) for r in rows]


def balances(source: ReportBook | sqlite3.Connection) -> list[tuple[str, int]]:
    """Every caller's prepaid balance (uid, atoms), largest first (then by
    uid); zero balances included."""
    book = _book(source)
    rows = book.execute(
        f"SELECT peer, atoms FROM balances ORDER BY atoms DESC, {book.by_bytes('peer')}"
    ).fetchall()
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


def statement(source: ReportBook | sqlite3.Connection, peer: str) -> list[StatementLine]:
    """Every money movement of ``peer`` (uid, compared without case), oldest first."""
    book = _book(source)
    tool = "tool" if book.has_column("movements", "tool") else "NULL"
    rows = book.execute(
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


def ledger_stats(source: ReportBook | sqlite3.Connection) -> LedgerStats:
    """The totals of :class:`LedgerStats`, read in one snapshot
    (:meth:`ReportBook.snapshot`) so the figures agree with each other
    while the bot writes."""
    book = _book(source)
    with book.snapshot():
        tool = "COALESCE(tool, '(unknown)')" if book.has_column("movements", "tool") else "'(unknown)'"
        kinds = {
            str(r[0]): (int(r[1]), int(r[2]))
            for r in book.execute(
                "SELECT kind, COUNT(*), COALESCE(SUM(atoms), 0) FROM movements GROUP BY kind"
            )
        }
        per: dict[str, list[int]] = {}
        for name, what, count, atoms in book.execute(
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
        callers, balance_atoms = book.execute(
            "SELECT COUNT(*), COALESCE(SUM(atoms), 0) FROM balances"
        ).fetchone()
        movement_atoms = book.execute("SELECT COALESCE(SUM(atoms), 0) FROM movements").fetchone()[0]
        held = (
            book.execute("SELECT COUNT(*), COALESCE(SUM(atoms), 0) FROM held_tips").fetchone()
            if book.has_table("held_tips")
            else (0, 0)
        )

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
