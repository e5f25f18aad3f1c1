"""The ``brmcp-bridge receipts`` command (BRIDGE.md §Signed receipts): the
signed receipts the bots' results carried, as the running daemon's receipt
book (:mod:`.receipts`) holds them.

::

    brmcp-bridge receipts [--bot UID] [--limit N] [--json] [--export FILE]

One line per receipt, newest first: the time it arrived (UTC), the bot
(first 8 hex), the tool, the atoms, the receipt id (first 12 hex) and
``ok`` or the checks it failed. ``--json`` prints the admin API's answer
(``{"receipts": [...]}``); ``--export FILE`` writes every receipt (of
``--bot``), oldest first, one JSON object per line, and says how many.
Without the daemon (not running, or the bridge disabled) the book is read
from ``receipts.sqlite3`` itself, with a note on stderr. Errors are
:class:`~._adminclient.CLIError` lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from brmcp.bridge.base import PROG, is_uid
from brmcp.bridge.find import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, RECEIPTS_FILE, ReceiptBook

from ._adminclient import OTHER_DATADIR_HINT, AdminError, CLIError, Disabled, NotRunning, admin, locate

__all__ = ["add_arguments", "cmd_receipts", "receipt_line"]


def add_arguments(command: str, receipts: argparse.ArgumentParser) -> None:
    """Add the arguments of ``receipts`` to its ``brmcp-bridge`` subcommand
    parser (named, with its help line, by :mod:`._main`)."""
    receipts.add_argument("--bot", metavar="UID", default=None, help="only the receipts of this bot")
    receipts.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIST_LIMIT,
        metavar="N",
        help=f"show at most N receipts, 1 to {MAX_LIST_LIMIT} (default: %(default)s)",
    )
    receipts.add_argument(
        "--export", metavar="FILE", default=None, help="write every receipt to FILE as JSON lines"
    )


def _printable(value: Any) -> str:
    """``value`` as text with control characters escaped (a bot chose it)."""
    text = str(value)
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def receipt_line(entry: dict[str, Any]) -> str:
    """One receipt (:meth:`~.receipts.StoredReceipt.to_dict`) as a line:
    ``<UTC time>  <bot[:8]>  <tool>  <atoms> atoms  <id[:12]>  ok|<checks>``."""
    received = entry.get("receivedAt")
    when = (
        datetime.fromtimestamp(received, UTC).strftime("%Y-%m-%d %H:%M:%S")
        if isinstance(received, int | float) and not isinstance(received, bool)
        else "?"
    )
    claims = entry.get("claims") if isinstance(entry.get("claims"), dict) else None
    tool = _printable(claims.get("tool", "?"))[:64] if claims else "?"
    atoms = claims.get("atoms") if claims else None
    shown_atoms = f"{atoms:,} atoms" if isinstance(atoms, int) and not isinstance(atoms, bool) else "? atoms"
    checks = entry.get("checks")
    verdict = "ok" if checks == [] else "failed: " + ", ".join(_printable(c) for c in checks or ["?"])
    bot = _printable(entry.get("bot", "?"))[:8]
    receipt_id = _printable(entry.get("receiptId", "?"))[:12]
    return f"{when}  {bot}  {tool}  {shown_atoms}  {receipt_id}  {verdict}"


def _from_daemon(datadir: Path, bot: str | None, limit: int, before: str | None) -> list[dict[str, Any]]:
    """One page of ``GET /admin/receipts``; raises NotRunning/Disabled."""
    daemon = locate(datadir)
    query: dict[str, Any] = {"limit": limit}
    if bot is not None:
        query["bot"] = bot
    if before is not None:
        query["before"] = before
    try:
        answer = admin(daemon, "GET", f"/admin/receipts?{urlencode(query)}")
    except AdminError as exc:
        raise CLIError(str(exc)) from None
    receipts = answer.get("receipts") if isinstance(answer, dict) else None
    if not isinstance(receipts, list):
        raise CLIError("the daemon's answer to GET /admin/receipts has no receipts list")
    return [entry for entry in receipts if isinstance(entry, dict)]


def _offline_book(datadir: Path, exc: CLIError) -> ReceiptBook | None:
    """The book file read directly (with a note on stderr), or None when
    there is none yet."""
    path = datadir / RECEIPTS_FILE
    if isinstance(exc, NotRunning):
        why = f"the daemon is not running ({exc.detail})"
        other = f" ({OTHER_DATADIR_HINT})"
    else:
        why = "the bridge is disabled, so the daemon's admin surface is off"
        other = ""
    if not path.exists():
        print(f"{PROG}: {why}; {path} does not exist yet (no receipts){other}", file=sys.stderr)
        return None
    print(f"{PROG}: {why}; read from {path}{other}", file=sys.stderr)
    return ReceiptBook(path)


def _all_from_daemon(datadir: Path, bot: str | None) -> list[dict[str, Any]]:
    """Every receipt (of ``bot``) from the daemon, oldest first, in pages."""
    pages: list[dict[str, Any]] = []
    before: str | None = None
    while True:
        page = _from_daemon(datadir, bot, MAX_LIST_LIMIT, before)
        pages.extend(page)
        if len(page) < MAX_LIST_LIMIT:
            break
        last = page[-1].get("receiptId")
        if not isinstance(last, str):
            break
        before = last
    pages.reverse()
    return pages


def _write_lines(path: Path, entries: list[dict[str, Any]]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for entry in entries:
            fh.write(json.dumps(entry, separators=(",", ":")) + "\n")


def cmd_receipts(datadir: Path, args: argparse.Namespace) -> None:
    """``receipts``: list (or ``--export``) the receipt book (see the module)."""
    bot = args.bot.strip().lower() if args.bot is not None else None
    if bot is not None and not is_uid(bot):
        raise CLIError(f"--bot {args.bot!r}: a bot uid is 64 hex characters")
    if not 1 <= args.limit <= MAX_LIST_LIMIT:
        raise CLIError(f"--limit {args.limit}: use a whole number from 1 to {MAX_LIST_LIMIT}")
    export = Path(args.export).expanduser() if args.export is not None else None
    try:
        try:
            if export is not None:
                entries = _all_from_daemon(datadir, bot)
                _write_lines(export, entries)
                print(f"{PROG}: wrote {len(entries)} receipt(s) to {export}")
                return
            entries = _from_daemon(datadir, bot, args.limit, None)
        except (NotRunning, Disabled) as exc:
            book = _offline_book(datadir, exc)
            try:
                if export is not None:
                    count = 0 if book is None else book.export_jsonl(export, bot)
                    if book is None:
                        _write_lines(export, [])
                    print(f"{PROG}: wrote {count} receipt(s) to {export}")
                    return
                found = [] if book is None else book.list(bot, args.limit)
                entries = [stored.to_dict() for stored in found]
            finally:
                if book is not None:
                    book.close()
    except sqlite3.Error as exc:
        raise CLIError(f"{datadir / RECEIPTS_FILE}: cannot read the receipt book: {exc}") from None
    except OSError as exc:
        raise CLIError(f"{export}: cannot write: {exc.strerror or exc}") from None
    if getattr(args, "json", False):
        print(json.dumps({"receipts": entries}))
        return
    if not entries:
        print("no receipts")
        return
    for entry in entries:
        print(receipt_line(entry))
