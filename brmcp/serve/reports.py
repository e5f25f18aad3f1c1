"""``brmcp-serve balances``, ``statement <uid>`` and ``stats``: read-only
reports on the bot's ledger (``<datadir>/brmcp.sqlite3``), safe while the
bot runs (:mod:`brmcp.server.reports`). Atoms throughout; tips arrive in
milliatoms and are credited as whole atoms. Tips held for senders not
allowed (WIRE.md §Payments, "Tips from senders not allowed") are shown in
every report beside the balances and movements they are not yet part of,
so the ledger accounts for every atom the wallet received."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from ..server.reports import balances, held_of, held_totals, ledger_stats, open_readonly, statement
from ..server.store import StoreError

__all__ = ["ReportError", "run_report"]


class ReportError(Exception):
    """A one-line reason the report cannot be made."""


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _uid(value: str) -> str:
    uid = value.strip().lower()
    if len(uid) != 64 or any(ch not in "0123456789abcdef" for ch in uid):
        raise ReportError(f"{value!r} is not a Bison Relay uid (64 hex characters)")
    return uid


def run_report(command: str, datadir: Path, uid: str = "", *, as_json: bool = False) -> None:
    """Print report ``command`` (``balances``, ``statement`` or ``stats``)
    for the ledger in ``datadir``. Raises :class:`ReportError`."""
    try:
        conn = open_readonly(datadir)
    except StoreError as exc:
        raise ReportError(str(exc)) from None
    try:
        if command == "balances":
            _balances(conn, as_json)
        elif command == "statement":
            _statement(conn, _uid(uid), as_json)
        elif command == "stats":
            _stats(conn, as_json)
        else:
            raise ReportError(f"unknown report {command!r}")
    except StoreError as exc:
        raise ReportError(str(exc)) from None
    except Exception as exc:  # sqlite3.Error while the file changes under us, ...
        if isinstance(exc, ReportError):
            raise
        raise ReportError(f"cannot read the ledger: {exc}") from None
    finally:
        conn.close()


def _balances(conn: sqlite3.Connection, as_json: bool) -> None:
    rows = balances(conn)
    held = held_totals(conn)
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


def _statement(conn: sqlite3.Connection, uid: str, as_json: bool) -> None:
    lines = statement(conn, uid)
    held = held_of(conn, uid)
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


def _stats(conn: sqlite3.Connection, as_json: bool) -> None:
    stats = ledger_stats(conn)
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
