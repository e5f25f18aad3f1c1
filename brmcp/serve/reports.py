"""``brmcp-serve balances``, ``statement <uid>`` and ``stats``: read-only
reports on the bot's book, safe while the bot runs
(:mod:`brmcp.server.store.reports`). The book is the one the ``store`` key of
``<datadir>/brmcp.json`` names, read as the daemon reads it
(:func:`~brmcp.serve.config.load_serve_config`): ``<datadir>/brmcp.sqlite3``
by default (also when there is no ``brmcp.json``, as for a harness run
from code), else the PostgreSQL database -- for a pool, the one book its
members share, so a report covers every member's tips and charges. Each
report reads one snapshot of the book, and prints the same for the same
book contents on either backend. Atoms throughout; tips arrive in
milliatoms and are credited as whole atoms. Tips held for senders not
allowed (WIRE.md §Payments, "Tips from senders not allowed") are shown in
every report beside the balances and movements they are not yet part of,
so the ledger accounts for every atom the wallet received."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from brmcp.server.store.reports import (
    ReportBook,
    balances,
    held_of,
    held_totals,
    ledger_stats,
    open_book,
    statement,
)

from ..server.store import StoreError
from ..server.store.url import DEFAULT_STORE, StoreURL, parse_store_url
from .config import SERVE_CONFIG_FILE, ServeConfigError, load_serve_config

__all__ = ["ReportError", "report_store", "run_report"]


class ReportError(Exception):
    """A one-line reason the report cannot be made."""


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _uid(value: str) -> str:
    uid = value.strip().lower()
    if len(uid) != 64 or any(ch not in "0123456789abcdef" for ch in uid):
        raise ReportError(f"{value!r} is not a Bison Relay uid (64 hex characters)")
    return uid


def report_store(datadir: Path) -> StoreURL:
    """The book the bot of ``datadir`` keeps: the ``store`` of
    ``<datadir>/brmcp.json`` as brmcp-serve reads it, ``sqlite:`` when that
    file does not exist. Raises :class:`ReportError` with the daemon's
    one-line message (naming the file and key, any password redacted)
    when the file cannot be read or is invalid."""
    path = datadir / SERVE_CONFIG_FILE
    if not path.exists():
        return parse_store_url(DEFAULT_STORE)
    try:
        config = load_serve_config(path)
    except ServeConfigError as exc:
        raise ReportError(str(exc)) from None
    return parse_store_url(config.store)  # validated by the load


def run_report(command: str, datadir: Path, uid: str = "", *, as_json: bool = False) -> None:
    """Print report ``command`` (``balances``, ``statement`` or ``stats``)
    for the book of the bot in ``datadir`` (:func:`report_store`), read in
    one snapshot. Raises :class:`ReportError` (one line; a PostgreSQL
    URL's password never in it)."""
    if command not in ("balances", "statement", "stats"):
        raise ReportError(f"unknown report {command!r}")
    peer = _uid(uid) if command == "statement" else ""
    try:
        book = open_book(datadir, report_store(datadir))
    except StoreError as exc:
        raise ReportError(str(exc)) from None
    try:
        with book.snapshot():
            if command == "balances":
                _balances(book, as_json)
            elif command == "statement":
                _statement(book, peer, as_json)
            else:
                _stats(book, as_json)
    except StoreError as exc:
        raise ReportError(book.scrub(str(exc))) from None
    except BrokenPipeError:  # the reader of stdout went away: brmcp-serve exits 141
        raise
    except Exception as exc:  # a driver error while the book changes under us, ...
        detail = book.scrub(" ".join(str(exc).split()))
        raise ReportError(f"cannot read the ledger {book.where}: {detail}") from None
    finally:
        book.close()


def _balances(book: ReportBook, as_json: bool) -> None:
    rows = balances(book)
    held = held_totals(book)
    if as_json:
        print(
            json.dumps(
                {
                    "balances": [{"uid": u, "atoms": a} for u, a in rows],
                    "held_tips": [h.to_dict() for h in held],
                }
            )
        )
        return
    if not rows:
        print("no callers have a balance yet")
    else:
        print(f"{'UID':<64}  {'BALANCE (atoms)':>16}")
        for uid, atoms in rows:
            print(f"{uid:<64}  {atoms:>16,}")
        print(f"{len(rows)} caller(s), {sum(a for _, a in rows):,} atoms held in total")
    if held:
        print()
        print("tips from senders not allowed, credited once the sender is allowed:")
        print(f"{'UID':<64}  {'TIPS':>6}  {'WAITING (atoms)':>16}")
        for h in held:
            print(f"{h.uid:<64}  {h.tips:>6}  {h.atoms:>16,}")
        print(f"{len(held)} sender(s), {sum(h.atoms for h in held):,} atoms waiting for the allowlist")


def _statement(book: ReportBook, uid: str, as_json: bool) -> None:
    lines = statement(book, uid)
    held = held_of(book, uid)
    if as_json:
        waiting = [
            {"ts": h.ts, "tip_seq": h.sequence_id, "amount_matoms": h.amount_matoms, "atoms": h.atoms}
            for h in held
        ]
        print(json.dumps({"uid": uid, "movements": [line.to_dict() for line in lines], "held_tips": waiting}))
        return
    if not lines:
        print(f"no money movements for {uid}")
    else:
        print(f"{'WHEN (UTC)':<20} {'KIND':<16} {'TOOL':<20} {'ATOMS':>12} {'BALANCE':>12}")
        for line in lines:
            e = line.entry
            balance = "" if e.balance_after is None else f"{e.balance_after:,}"
            print(f"{_when(e.ts):<20} {e.kind:<16} {line.tool or '':<20} {e.atoms:>+12,} {balance:>12}")
    if held:
        print()
        total = sum(h.atoms for h in held)
        print(f"tips held (the sender was not allowed; credited once it is): {total:,} atoms")
        for h in held:
            tip = f"tip {h.sequence_id}"
            print(f"{_when(h.ts):<20} {'tip (held)':<16} {tip:<20} {h.atoms:>+12,} {'':>12}")


def _stats(book: ReportBook, as_json: bool) -> None:
    stats = ledger_stats(book)
    if as_json:
        print(json.dumps(stats.to_dict()))
        return
    print(f"tips credited:  {stats.tips:>8}  {stats.tip_atoms:>14,} atoms")
    if stats.held_tips:
        print(f"tips held:      {stats.held_tips:>8}  {stats.held_atoms:>14,} atoms (senders not allowed)")
    if stats.credits:
        print(f"other credits:  {stats.credits:>8}  {stats.credit_atoms:>14,} atoms")
    print(f"paid calls:     {stats.charges:>8}  {stats.charged_atoms:>14,} atoms charged")
    print(f"refunds:        {stats.refunds:>8}  {stats.refunded_atoms:>14,} atoms")
    if stats.per_tool:
        print()
        print(f"{'TOOL':<24} {'CALLS':>8} {'CHARGED':>14} {'REFUNDS':>8} {'REFUNDED':>14} {'NET':>14}")
        for t in stats.per_tool:
            print(
                f"{t.tool:<24} {t.charges:>8} {t.charged_atoms:>14,} {t.refunds:>8} "
                f"{t.refunded_atoms:>14,} {t.net_atoms:>14,}"
            )
    print()
    print(f"{stats.callers} caller(s) hold {stats.balance_atoms:,} atoms")
    verdict = "yes" if stats.reconciles else "NO"
    print(
        f"reconciles with the ledger: {verdict} (balances {stats.balance_atoms:,} = "
        f"tips + credits - charges + refunds {stats.movement_atoms:,})"
    )
    if stats.held_tips:
        print(
            f"tips received: {stats.received_atoms:,} atoms = {stats.tip_atoms:,} credited + "
            f"{stats.held_atoms:,} held for senders not allowed (in no balance until allowed)"
        )
