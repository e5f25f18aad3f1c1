"""``brmcp-serve balances``, ``statement`` and ``stats``: read-only reports
on the bot's ledger while the bot runs, reconciled with it to the atom."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from brmcp.serve.cli import main as serve_main
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.server.reports import ledger_stats, open_readonly
from brmcp.server.store import DB_FILENAME, StoreError, open_database

ALICE = "a" * 64
BOB = "b" * 64
CAROL = "c" * 64


def _harness(data_dir: Path) -> Harness:
    harness = Harness(HarnessConfig(data_dir=data_dir, allowed_peers={ALICE, BOB}))

    @harness.tool(price_atoms=300)
    async def fortune(ctx: CallContext) -> dict[str, Any]:
        return {"fortune": "ok"}

    @harness.tool(price_atoms=200)
    async def broken(ctx: CallContext) -> dict[str, Any]:
        raise RuntimeError("boom")

    return harness


async def _call(harness: Harness, peer: str, tool: str) -> Any:
    spec = next(t for t in harness.tools() if t.name == tool)
    return await harness.call(peer, spec, {}, {}, None)


async def _report(capsys: pytest.CaptureFixture[str], data_dir: Path, *args: str) -> tuple[int, str, str]:
    code = await anyio.to_thread.run_sync(serve_main, ["--datadir", str(data_dir), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


async def test_reports_while_the_bot_runs_reconcile_with_the_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "bot"
    async with _harness(data_dir) as harness:
        assert await harness.credit_tip(ALICE, 1_000_500, 1) == 1000  # 1,000.5 atoms: floored
        assert await harness.credit_tip(BOB, 250_000, 2) == 250
        assert await harness.credit_tip(CAROL, 9_000_000, 3) == 0  # not allowed: not credited
        assert not (await _call(harness, ALICE, "fortune")).is_error
        assert not (await _call(harness, ALICE, "fortune")).is_error
        assert (await _call(harness, ALICE, "broken")).is_error  # charged, then refunded
        assert (await _call(harness, BOB, "fortune")).is_error  # 250 < 300: payment_required
        await harness.credit(BOB, 50)

        # The bot is still running (its connection open): the reports read alongside it.
        code, out, err = await _report(capsys, data_dir, "--json", "stats")
        assert code == 0, err
        stats = json.loads(out)
        assert (stats["tips"], stats["tip_atoms"]) == (2, 1250)
        assert (stats["credits"], stats["credit_atoms"]) == (1, 50)
        assert (stats["charges"], stats["charged_atoms"]) == (3, 800)
        assert (stats["refunds"], stats["refunded_atoms"]) == (1, 200)
        assert {
            t["tool"]: (t["charges"], t["charged_atoms"], t["refunds"], t["net_atoms"])
            for t in stats["per_tool"]
        } == {
            "fortune": (2, 600, 0, 600),
            "broken": (1, 200, 1, 0),
        }
        ledger = {ALICE: await harness.balance(ALICE), BOB: await harness.balance(BOB)}
        assert ledger == {ALICE: 400, BOB: 300}
        assert stats["balance_atoms"] == sum(ledger.values()) == stats["movement_atoms"]
        assert stats["reconciles"] is True
        assert (
            stats["tip_atoms"] + stats["credit_atoms"] - stats["charged_atoms"] + stats["refunded_atoms"]
            == 700
        )

        code, out, err = await _report(capsys, data_dir, "--json", "balances")
        assert code == 0, err
        assert json.loads(out)["balances"] == [{"uid": ALICE, "atoms": 400}, {"uid": BOB, "atoms": 300}]

        code, out, err = await _report(capsys, data_dir, "--json", "statement", ALICE.upper())
        assert code == 0, err
        moves = json.loads(out)["movements"]
        assert [(m["kind"], m["atoms"], m["tool"], m["balance_after"]) for m in moves] == [
            ("tip", 1000, None, 1000),
            ("charge", -300, "fortune", 700),
            ("charge", -300, "fortune", 400),
            ("charge", -200, "broken", 200),
            ("refund", 200, "broken", 400),
        ]
        statement = await harness.statement(ALICE)
        assert [(e.kind, e.atoms, e.balance_after) for e in statement] == [
            (m["kind"], m["atoms"], m["balance_after"]) for m in moves
        ]

        code, out, _ = await _report(capsys, data_dir, "stats")
        assert code == 0
        assert (
            "reconciles with the ledger: yes (balances 700 = tips + credits - charges + refunds 700)" in out
        )
        assert "fortune" in out
        code, out, _ = await _report(capsys, data_dir, "balances")
        assert "2 caller(s), 700 atoms held in total" in out
        code, out, _ = await _report(capsys, data_dir, "statement", ALICE)
        assert "refund" in out
        assert "broken" in out
        # The bot keeps working after the reports.
        assert not (await _call(harness, BOB, "fortune")).is_error


def test_the_report_connection_is_read_only(tmp_path: Path) -> None:
    open_database(tmp_path).close()
    conn = open_readonly(tmp_path)
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("INSERT INTO balances (peer, atoms) VALUES ('x', 1)")
    conn.close()
    with pytest.raises(StoreError, match="no ledger at"):
        open_readonly(tmp_path / "elsewhere")


async def test_report_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = await _report(capsys, tmp_path, "balances")
    assert code == 1
    assert (
        err == f"brmcp-serve: no ledger at {tmp_path / DB_FILENAME} (has the bot run with this --datadir?)\n"
    )
    open_database(tmp_path).close()
    code, _, err = await _report(capsys, tmp_path, "statement", "nothex")
    assert code == 1
    assert "is not a Bison Relay uid" in err


def test_a_version_1_ledger_gains_the_tool_column(tmp_path: Path) -> None:
    conn = open_database(tmp_path)
    conn.execute(
        "INSERT INTO movements (ts, peer, kind, atoms, ref) VALUES (1, ?, 'charge', -5, 'charge:old')",
        (ALICE,),
    )
    conn.execute("INSERT INTO balances (peer, atoms) VALUES (?, 0)", (ALICE,))
    conn.execute(
        "INSERT INTO movements (ts, peer, kind, atoms, ref) VALUES (1, ?, 'tip', 5, 'tip:old')", (ALICE,)
    )
    conn.execute("ALTER TABLE movements DROP COLUMN tool")
    conn.execute("DROP TABLE held_tips")
    conn.execute("PRAGMA user_version=1")
    conn.close()
    old = open_readonly(tmp_path)  # a report on the old file works too
    assert ledger_stats(old).per_tool[0].tool == "(unknown)"
    assert (ledger_stats(old).held_tips, ledger_stats(old).held_atoms) == (0, 0)
    old.close()
    conn = open_database(tmp_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    assert "tool" in {row[1] for row in conn.execute("PRAGMA table_info(movements)")}
    assert "held_tips" in {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    stats = ledger_stats(open_readonly(tmp_path))
    assert stats.reconciles
    assert [(t.tool, t.charges, t.charged_atoms) for t in stats.per_tool] == [("(unknown)", 1, 5)]
