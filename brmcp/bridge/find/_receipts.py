"""The bridge's receipt book (BRIDGE.md §Signed receipts): every signed
receipt a bot's result carried (``brmcp/signedReceipt``,
WIRE.md §Signed receipts), checked against what this bridge knows of the call and kept in
``receipts.sqlite3`` in the data directory.

What is checked, in this order, each failure named in the stored receipt's
``checks`` (an empty tuple: all good):

* ``signature``: the receipt does not verify
  (:func:`~brmcp.protocol.receipts.verify_receipt` against its own ``pub``:
  shape, signature, payload fields); nothing else is checked then, and the
  receipt is kept without claims;
* ``keyChanged``: ``pub`` is not the key pinned for the bot: the first key
  seen for a bot uid (announced in its ``tools/list`` ``_meta``, else the
  first verified receipt's) is pinned in the book for good;
* ``key``: ``pub`` is not the key the bot announced in the tool list in force;
* ``bot``: the payload names a bot uid other than the one that answered;
* ``caller``: ``caller`` is not this bridge's own uid (when known);
* ``argsSha256``: not :func:`~brmcp.protocol.receipts.args_sha256` of the
  arguments this bridge sent;
* ``atoms``: not the result's ``brmcp/chargedAtoms`` (0 when absent);
* ``callKey``: not the callKey this bridge sent.

Bounds: a receipt whose parts are longer than a valid one can be
(:data:`~brmcp.protocol.receipts.MAX_RECEIPT_PAYLOAD` bytes of payload) is
refused unstored; at most :data:`MAX_RECEIPTS_PER_BOT` receipts are kept
per bot (the oldest dropped first); a receipt seen twice for one bot (a
callKey replay carries the same one) is kept once. The book is blocking
SQLite (WAL): the bridge calls it through :func:`anyio.to_thread.run_sync`,
after the agent has its result (:func:`record_receipt`), so a receipt never
delays nor breaks a call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs

import anyio.to_thread
from starlette.types import Send

from brmcp.bridge.base import is_uid, send_json
from brmcp.protocol.payment import parse_receipt
from brmcp.protocol.receipts import (
    MAX_RECEIPT_PAYLOAD,
    ReceiptClaims,
    ReceiptError,
    args_sha256,
    is_receipt_key,
    signed_receipt_from_meta,
    verify_receipt,
)

__all__ = [
    "CHECKS",
    "DEFAULT_LIST_LIMIT",
    "MAX_LIST_LIMIT",
    "MAX_RECEIPTS_PER_BOT",
    "RECEIPTS_FILE",
    "ReceiptBook",
    "ReceiptCall",
    "StoredReceipt",
    "check_receipt",
    "receipts_handler",
    "record_receipt",
]

log = logging.getLogger("brmcp.bridge")

#: The book's file in the bridge's data directory.
RECEIPTS_FILE = "receipts.sqlite3"
#: Receipts kept per bot; the oldest are dropped past it.
MAX_RECEIPTS_PER_BOT = 10_000
#: Receipts :meth:`ReceiptBook.list` returns when not told, and at most.
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 1000
#: The check names, in the order they are made (see the module docstring).
CHECKS = ("signature", "keyChanged", "key", "bot", "caller", "argsSha256", "atoms", "callKey")
#: Longest ``payload`` (base64 characters), ``sig`` and ``pub`` a receipt may have.
_MAX_PAYLOAD_B64 = (MAX_RECEIPT_PAYLOAD + 2) // 3 * 4
_MAX_SIG = 128
_MAX_PUB = 64

_SCHEMA = """
CREATE TABLE IF NOT EXISTS receipts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    bot TEXT NOT NULL,
    receipt_id TEXT NOT NULL,
    received_at REAL NOT NULL,
    checks TEXT NOT NULL,
    signed TEXT NOT NULL,
    UNIQUE (bot, receipt_id)
);
CREATE TABLE IF NOT EXISTS receipt_keys (
    bot TEXT PRIMARY KEY,
    pub TEXT NOT NULL,
    pinned_at REAL NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class ReceiptCall:
    """What this bridge knows of the call a receipt is for: ``announced``
    (the bot's announced receipt key, None when not known), ``caller`` (this
    bridge's own uid, None when not known), ``args_digest``
    (:func:`~brmcp.protocol.receipts.args_sha256` of the arguments sent),
    ``atoms`` (the result's ``brmcp/chargedAtoms``, 0 when absent) and
    ``call_key`` (the callKey sent)."""

    announced: str | None
    caller: str | None
    args_digest: str
    atoms: int
    call_key: str

    @classmethod
    def of(
        cls,
        *,
        announced: str | None,
        caller: str | None,
        arguments: Mapping[str, Any] | None,
        call_key: str,
        meta: Any,
    ) -> ReceiptCall:
        """The call as the payment loop saw it: ``arguments`` as sent and the
        result's ``meta`` (for ``brmcp/chargedAtoms``)."""
        receipt = parse_receipt(meta)
        return cls(
            announced=announced,
            caller=caller.lower() if caller else None,
            args_digest=args_sha256(arguments),
            atoms=receipt.charged_atoms if receipt is not None else 0,
            call_key=call_key,
        )


@dataclass(frozen=True, slots=True)
class StoredReceipt:
    """One receipt in the book: ``bot`` (the uid that sent it), ``signed``
    (``{"payload", "sig", "pub"}`` as received), ``claims`` (None when the
    receipt does not verify), ``checks`` (the failed checks, :data:`CHECKS`
    names; empty: all good), ``received_at`` (unix seconds, the bridge's
    clock) and ``receipt_id`` (the claims' id; for a receipt that does not
    verify, the SHA-256 of its ``payload`` text)."""

    bot: str
    signed: dict[str, str]
    claims: ReceiptClaims | None
    checks: tuple[str, ...]
    received_at: float
    receipt_id: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (one ``export_jsonl`` line, one admin API entry):
        ``{"bot", "receiptId", "checks", "receivedAt", "receipt", "claims"}``,
        ``claims`` null for a receipt that does not verify."""
        return {
            "bot": self.bot,
            "receiptId": self.receipt_id,
            "checks": list(self.checks),
            "receivedAt": self.received_at,
            "receipt": dict(self.signed),
            "claims": None if self.claims is None else self.claims.to_dict(),
        }


def _oversize(signed: Mapping[str, str]) -> bool:
    return (
        len(signed["payload"]) > _MAX_PAYLOAD_B64
        or len(signed["sig"]) > _MAX_SIG
        or len(signed["pub"]) > _MAX_PUB
    )


def check_receipt(
    bot: str, signed: Mapping[str, str], call: ReceiptCall, pinned: str | None
) -> tuple[ReceiptClaims | None, tuple[str, ...]]:
    """Verify ``signed`` from ``bot`` against ``call`` and the ``pinned`` key
    (None: none yet). Returns the claims (None when it does not verify) and
    the failed checks in :data:`CHECKS` order. Never raises."""
    try:
        claims = verify_receipt(dict(signed))
    except ReceiptError:
        return None, ("signature",)
    failed: list[str] = []
    if pinned is not None and claims.pub != pinned:
        failed.append("keyChanged")
    if call.announced is not None and claims.pub != call.announced:
        failed.append("key")
    if claims.bot and claims.bot != bot:
        failed.append("bot")
    if call.caller is not None and claims.caller != call.caller:
        failed.append("caller")
    if claims.args_sha256 != call.args_digest:
        failed.append("argsSha256")
    if claims.atoms != call.atoms:
        failed.append("atoms")
    if claims.call_key != call.call_key:
        failed.append("callKey")
    return claims, tuple(failed)


def _stored(row: tuple[Any, ...]) -> StoredReceipt:
    bot, receipt_id, received_at, checks, signed_text = row
    signed = json.loads(signed_text)
    try:
        claims: ReceiptClaims | None = verify_receipt(signed)
    except ReceiptError:
        claims = None
    return StoredReceipt(
        bot=bot,
        signed=signed,
        claims=claims,
        checks=tuple(json.loads(checks)),
        received_at=received_at,
        receipt_id=receipt_id,
    )


class ReceiptBook:
    """The receipts of every bot, in the SQLite file ``path`` (mode 0600,
    WAL), opened on first use. Methods block (run them off the event loop);
    one lock serialises them, so threads may share a book. ``max_per_bot``
    bounds the rows kept per bot (:data:`MAX_RECEIPTS_PER_BOT`); ``clock``
    gives unix seconds for ``received_at``. Errors of the file are
    ``sqlite3.Error`` or OSError."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_per_bot: int = MAX_RECEIPTS_PER_BOT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_per_bot <= 0:
            raise ValueError(f"max_per_bot must be > 0, got {max_per_bot}")
        self.path = Path(path)
        self.max_per_bot = max_per_bot
        self._clock = clock
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            if not self.path.exists():
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA busy_timeout=5000")
                conn.executescript(_SCHEMA)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def close(self) -> None:
        """Close the file (a later call opens it again)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def pinned_key(self, bot: str) -> str | None:
        """The receipt key pinned for ``bot``, or None."""
        with self._lock:
            row = self._db().execute("SELECT pub FROM receipt_keys WHERE bot = ?", (bot,)).fetchone()
        return None if row is None else str(row[0])

    def add(
        self, bot: str, signed: Mapping[str, str], call: ReceiptCall, *, received_at: float | None = None
    ) -> StoredReceipt | None:
        """Check ``signed`` (a ``{"payload", "sig", "pub"}`` of three strings)
        from ``bot`` against ``call`` and the pinned key
        (:func:`check_receipt`), pin the key when none is yet (``call``'s
        announced key, else the receipt's when it verifies) and keep the
        receipt, dropping the bot's oldest past ``max_per_bot``, all in one
        transaction. Returns what is stored (the earlier copy when the bot
        sent this receipt before), or None for a receipt over the size
        bounds (refused, logged). Raises ``sqlite3.Error``/OSError."""
        signed = {name: str(signed[name]) for name in ("payload", "sig", "pub")}
        if _oversize(signed):
            log.warning("receipt from bot %s refused: larger than a receipt can be", bot[:8])
            return None
        when = self._clock() if received_at is None else received_at
        with self._lock:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT pub FROM receipt_keys WHERE bot = ?", (bot,)).fetchone()
                pinned = None if row is None else str(row[0])
                claims, checks = check_receipt(bot, signed, call, pinned)
                if pinned is None:
                    pin = call.announced if call.announced is not None else claims.pub if claims else None
                    if pin is not None and is_receipt_key(pin):
                        db.execute(
                            "INSERT INTO receipt_keys (bot, pub, pinned_at) VALUES (?, ?, ?)",
                            (bot, pin, when),
                        )
                receipt_id = (
                    claims.receipt_id
                    if claims is not None
                    else hashlib.sha256(signed["payload"].encode("utf-8")).hexdigest()
                )
                db.execute(
                    "INSERT OR IGNORE INTO receipts (bot, receipt_id, received_at, checks, signed)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (bot, receipt_id, when, json.dumps(list(checks)), json.dumps(signed)),
                )
                db.execute(
                    "DELETE FROM receipts WHERE bot = ? AND seq NOT IN"
                    " (SELECT seq FROM receipts WHERE bot = ? ORDER BY seq DESC LIMIT ?)",
                    (bot, bot, self.max_per_bot),
                )
                kept = db.execute(
                    "SELECT bot, receipt_id, received_at, checks, signed FROM receipts"
                    " WHERE bot = ? AND receipt_id = ?",
                    (bot, receipt_id),
                ).fetchone()
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        if checks:
            log.warning(
                "receipt %s from bot %s failed checks: %s", receipt_id[:12], bot[:8], ", ".join(checks)
            )
        return _stored(kept)

    def list(
        self, bot: str | None = None, limit: int = DEFAULT_LIST_LIMIT, before: str | None = None
    ) -> list[StoredReceipt]:
        """The newest receipts first, at most ``limit`` (1 to
        :data:`MAX_LIST_LIMIT`), of ``bot`` (None: every bot), stored
        before the receipt whose id is ``before`` (None: the newest; an
        unknown id: none). Raises ValueError for a ``limit`` out of range."""
        if isinstance(limit, bool) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit must be 1 to {MAX_LIST_LIMIT}, got {limit}")
        where: list[str] = []
        params: list[Any] = []
        if bot is not None:
            where.append("bot = ?")
            params.append(bot)
        if before is not None:
            where.append("seq < (SELECT COALESCE(MIN(seq), 0) FROM receipts WHERE receipt_id = ?)")
            params.append(before)
        sql = "SELECT bot, receipt_id, received_at, checks, signed FROM receipts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq DESC LIMIT ?"
        params.append(limit)
        with self._lock:
            rows = self._db().execute(sql, params).fetchall()
        return [_stored(row) for row in rows]

    def get(self, receipt_id: str) -> StoredReceipt | None:
        """The receipt with this id (the first stored, should two bots have
        sent the same one), or None."""
        with self._lock:
            row = (
                self._db()
                .execute(
                    "SELECT bot, receipt_id, received_at, checks, signed FROM receipts"
                    " WHERE receipt_id = ? ORDER BY seq LIMIT 1",
                    (receipt_id,),
                )
                .fetchone()
            )
        return None if row is None else _stored(row)

    def by_prefix(self, prefix: str, limit: int = 2) -> tuple[StoredReceipt, ...]:
        """At most ``limit`` receipts whose id starts with ``prefix`` (lowercase
        hex), oldest first: a caller names a receipt by the first characters
        the ``receipts`` command shows. Raises ValueError for a prefix that
        is not 1 to 64 lowercase hex characters."""
        if not prefix or len(prefix) > 64 or not set(prefix) <= set("0123456789abcdef"):
            raise ValueError(f"receipt id prefix {prefix[:70]!r} is not 1 to 64 lowercase hex characters")
        with self._lock:
            rows = (
                self._db()
                .execute(
                    "SELECT bot, receipt_id, received_at, checks, signed FROM receipts"
                    " WHERE substr(receipt_id, 1, ?) = ? ORDER BY seq LIMIT ?",
                    (len(prefix), prefix, limit),
                )
                .fetchall()
            )
        return tuple(_stored(row) for row in rows)

    def _all(self, bot: str | None) -> Iterator[StoredReceipt]:
        """Every receipt (of ``bot``), oldest first, in pages."""
        after = 0
        while True:
            sql = "SELECT seq, bot, receipt_id, received_at, checks, signed FROM receipts WHERE seq > ?"
            params: list[Any] = [after]
            if bot is not None:
                sql += " AND bot = ?"
                params.append(bot)
            with self._lock:
                rows = self._db().execute(sql + " ORDER BY seq LIMIT 500", params).fetchall()
            if not rows:
                return
            for row in rows:
                after = row[0]
                yield _stored(row[1:])

    def export_jsonl(self, target: str | os.PathLike[str] | IO[str], bot: str | None = None) -> int:
        """Write every receipt (of ``bot``), oldest first, to ``target`` (a
        path, created or replaced with mode 0600, or a text file), one JSON
        object per line (:meth:`StoredReceipt.to_dict`). Returns the number
        written. Raises OSError or ``sqlite3.Error``."""
        if isinstance(target, str | os.PathLike):
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                return self.export_jsonl(fh, bot)
        count = 0
        for stored in self._all(bot):
            target.write(json.dumps(stored.to_dict(), separators=(",", ":")) + "\n")
            count += 1
        return count


async def record_receipt(book: ReceiptBook, bot: str, meta: Any, call: Callable[[], ReceiptCall]) -> bool:
    """Keep the signed receipt in a result's ``meta`` from ``bot``, if any,
    in ``book`` off the event loop (``call`` says what the bridge sent; it
    runs only when there is a receipt). Returns False when the book could
    not be written (logged at ERROR; the caller counts it), True otherwise,
    a receipt refused for its size included. Never raises but cancellation."""
    signed = signed_receipt_from_meta(meta)
    if signed is None:
        return True
    try:
        expected = call()
        await anyio.to_thread.run_sync(book.add, bot, signed, expected)
    except (sqlite3.Error, OSError, ValueError, TypeError) as exc:
        log.error("could not keep a receipt from bot %s in %s: %s", bot[:8], book.path, exc)
        return False
    return True


async def receipts_handler(
    book: ReceiptBook, parts: list[str], method: str, query: bytes, send: Send
) -> bool:
    """The admin routes ``GET /admin/receipts?bot=<uid>&limit=N&before=<id>``
    (``{"receipts": [...]}``, newest first) and ``GET
    /admin/receipts/<receiptId>`` (one, or 404); ``parts`` is the path after
    ``/admin/``. Entries are :meth:`StoredReceipt.to_dict`. Returns False
    when the path is not one of them. 400 names a bad parameter, 405 a
    method other than GET, 500 an unreadable book."""
    if not parts or parts[0] != "receipts" or len(parts) > 2:
        return False
    if method != "GET":
        await send_json(send, 405, {"error": "use GET"})
        return True
    try:
        if len(parts) == 2:
            receipt_id = parts[1].lower()
            if not is_receipt_key(receipt_id):
                await send_json(send, 400, {"error": "receipt id must be 64 hex characters"})
                return True
            stored = await anyio.to_thread.run_sync(book.get, receipt_id)
            if stored is None:
                await send_json(send, 404, {"error": "unknown receipt"})
                return True
            await send_json(send, 200, stored.to_dict())
            return True
        args = parse_qs(query.decode("latin-1"), keep_blank_values=True)
        bot = (args.get("bot") or [""])[-1].strip().lower() or None
        if bot is not None and not is_uid(bot):
            await send_json(send, 400, {"error": "bot: not a 64-hex Bison Relay uid"})
            return True
        before = (args.get("before") or [""])[-1].strip().lower() or None
        if before is not None and not is_receipt_key(before):
            await send_json(send, 400, {"error": "before: a receipt id is 64 hex characters"})
            return True
        text = (args.get("limit") or [str(DEFAULT_LIST_LIMIT)])[-1].strip()
        limit = int(text) if text.isascii() and text.isdigit() and len(text) < 8 else 0
        if not 1 <= limit <= MAX_LIST_LIMIT:
            await send_json(send, 400, {"error": f"limit: use a whole number from 1 to {MAX_LIST_LIMIT}"})
            return True
        found = await anyio.to_thread.run_sync(book.list, bot, limit, before)
    except (sqlite3.Error, OSError, ValueError) as exc:
        await send_json(send, 500, {"error": f"the receipt book cannot be read: {exc}"})
        return True
    await send_json(send, 200, {"receipts": [stored.to_dict() for stored in found]})
    return True
