"""``brmcp-serve balances``, ``statement`` and ``stats``: read-only reports
on the bot's book while the bot runs, reconciled with it to the atom, on
either backend (the ``store`` of ``brmcp.json``): the same figures and the
same output from SQLite and from a PostgreSQL book, one snapshot per
report, a pool's shared book covered whole, and a PostgreSQL password in no
output."""

from __future__ import annotations

import json
import sqlite3
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from brmcp.protocol.receipts import ReceiptSigner
from brmcp.serve.cli import main as serve_main
from brmcp.serve.config import SERVE_CONFIG_FILE
from brmcp.server import CallContext, Harness, HarnessConfig
from brmcp.server.pool import PoolConfig
from brmcp.server.store import DB_FILENAME, StoreError, open_database
from brmcp.server.store.reports import balances, ledger_stats, open_book, open_readonly
from brmcp.server.store.url import DEFAULT_STORE

ALICE = "a" * 64
BOB = "b" * 64
CAROL = "c" * 64
#: The harness clock: every movement at this unix time, so two backends'
#: books hold the same rows.
NOW = 1_700_000_000.25
MEMBER_A = "1" * 64
MEMBER_B = "2" * 64


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    """The ``store`` of the bot under test: ``sqlite:``, or a fresh
    PostgreSQL database (skipped with the reason when none can be started)."""
    if request.param == "sqlite":
        return DEFAULT_STORE
    return str(request.getfixturevalue("postgres_url"))


def _write_config(data_dir: Path, store: str, **extra: Any) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    config = {"allowed_uids": [ALICE, BOB], "store": store, **extra}
    (data_dir / SERVE_CONFIG_FILE).write_text(json.dumps(config), encoding="utf-8")


def _harness(data_dir: Path, store: str = DEFAULT_STORE, **config: Any) -> Harness:
    harness = Harness(
        HarnessConfig(data_dir=data_dir, store=store, allowed_peers={ALICE, BOB}, clock=lambda: NOW, **config)
    )

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


async def _business(harness: Harness) -> None:
    """Tips (one floored, one from a sender not allowed: held), paid calls,
    a refund, a call refused for want of atoms and a credit."""
    assert await harness.credit_tip(ALICE, 1_000_500, 1) == 1000  # 1,000.5 atoms: floored
    assert await harness.credit_tip(BOB, 250_000, 2) == 250
    assert await harness.record_tip(CAROL, 9_000_000, 3) == (True, 0)  # not allowed: held
    assert not (await _call(harness, ALICE, "fortune")).is_error
    assert not (await _call(harness, ALICE, "fortune")).is_error
    assert (await _call(harness, ALICE, "broken")).is_error  # charged, then refunded
    assert (await _call(harness, BOB, "fortune")).is_error  # 250 < 300: payment_required
    await harness.credit(BOB, 50)


#: Every report, text and JSON: what :func:`_all_reports` collects.
REPORTS = [
    ("stats",),
    ("balances",),
    ("statement", ALICE),
    ("statement", CAROL),
    ("statement", "d" * 64),
]


async def _all_reports(capsys: pytest.CaptureFixture[str], data_dir: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for args in REPORTS:
        for flags in ((), ("--json",)):
            code, text, err = await _report(capsys, data_dir, *flags, *args)
            assert code == 0, err
            assert err == ""
            out[" ".join((*flags, *args))] = text
    return out


async def test_reports_while_the_bot_runs_reconcile_with_the_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], store_url: str
) -> None:
    data_dir = tmp_path / "bot"
    _write_config(data_dir, store_url)
    async with _harness(data_dir, store_url) as harness:
        await _business(harness)

        # The bot is still running (its connection open): the reports read alongside it.
        code, out, err = await _report(capsys, data_dir, "--json", "stats")
        assert code == 0, err
        stats = json.loads(out)
        assert (stats["tips"], stats["tip_atoms"]) == (2, 1250)
        assert (stats["credits"], stats["credit_atoms"]) == (1, 50)
        assert (stats["charges"], stats["charged_atoms"]) == (3, 800)
        assert (stats["refunds"], stats["refunded_atoms"]) == (1, 200)
        assert (stats["held_tips"], stats["held_atoms"], stats["received_atoms"]) == (1, 9000, 10250)
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
        assert json.loads(out) == {
            "balances": [{"uid": ALICE, "atoms": 400}, {"uid": BOB, "atoms": 300}],
            "held_tips": [{"uid": CAROL, "tips": 1, "atoms": 9000}],
        }

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
        assert {m["ts"] for m in moves} == {NOW}
        statement_ = await harness.statement(ALICE)
        assert [(e.kind, e.atoms, e.balance_after) for e in statement_] == [
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
        assert "1 sender(s), 9,000 atoms waiting for the allowlist" in out
        code, out, _ = await _report(capsys, data_dir, "statement", ALICE)
        assert "refund" in out
        assert "broken" in out
        # The bot keeps working after the reports.
        assert not (await _call(harness, BOB, "fortune")).is_error
        code, out, _ = await _report(capsys, data_dir, "--json", "balances")
        assert json.loads(out)["balances"] == [{"uid": ALICE, "atoms": 400}, {"uid": BOB, "atoms": 0}]


def _collate_by_locale(url: str) -> None:
    """Give the uid columns of the PostgreSQL book a locale's collation
    (ICU ``en-US``, when the server has it), as a database created with a
    locale has by default: it sorts ``_`` < ``a`` < ``B``, bytes ``B`` <
    ``_`` < ``a``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_collation WHERE collname = 'en-US-x-icu'").fetchone() is None:
            return
        for table in ("balances", "held_tips"):
            conn.execute(f'ALTER TABLE {table} ALTER COLUMN peer TYPE TEXT COLLATE "en-US-x-icu"')


async def test_both_backends_print_the_same_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], postgres_url: str
) -> None:
    printed: dict[str, dict[str, str]] = {}
    for name, store in (("sqlite", DEFAULT_STORE), ("postgresql", postgres_url)):
        data_dir = tmp_path / name
        _write_config(data_dir, store)
        async with _harness(data_dir, store) as harness:
            if name == "postgresql":
                _collate_by_locale(store)
            await _business(harness)
            # Callers whose uids sort differently by locale than by bytes,
            # with equal balances (the order is then by uid).
            for peer in ("0" * 63 + "a", "0" * 63 + "B", "0" * 63 + "_"):
                harness.set_allowed_peers({ALICE, BOB, peer})
                await harness.credit(peer, 77)
            printed[name] = await _all_reports(capsys, data_dir)
    assert printed["sqlite"] == printed["postgresql"]
    uids = [row["uid"] for row in json.loads(printed["sqlite"]["--json balances"])["balances"]]
    assert uids[:2] == [ALICE, BOB]
    assert uids[2:] == sorted(uids[2:])  # byte order, "B" < "_" < "a"
    assert "reconciles with the ledger: yes" in printed["postgresql"]["stats"]


async def test_a_pool_report_covers_every_member(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], postgres_url: str
) -> None:
    pool = PoolConfig(id="fortunes", members=(MEMBER_A, MEMBER_B))
    key = Ed25519PrivateKey.generate()
    dirs = {me: tmp_path / me[:4] for me in pool.members}
    for data_dir in dirs.values():
        _write_config(data_dir, postgres_url, pool=pool.to_json())
    async with AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(
                _harness(dirs[me], postgres_url, pool=pool, receipt_signer=ReceiptSigner(key, bot=me))
            )
            for me in pool.members
        ]
        assert await a.record_tip(ALICE, 1_000_000, 1) == (True, 1000)
        assert await b.record_tip(BOB, 600_000, 1) == (True, 600)  # same sequence id, other member
        assert not (await _call(a, ALICE, "fortune")).is_error
        assert not (await _call(b, ALICE, "fortune")).is_error
        assert not (await _call(b, BOB, "fortune")).is_error
        seen = {me: await _all_reports(capsys, data_dir) for me, data_dir in dirs.items()}
    assert seen[MEMBER_A] == seen[MEMBER_B]  # one book, whichever member's data directory
    stats = json.loads(seen[MEMBER_A]["--json stats"])
    assert (stats["tips"], stats["tip_atoms"]) == (2, 1600)
    assert (stats["charges"], stats["charged_atoms"]) == (3, 900)
    assert stats["balance_atoms"] == stats["movement_atoms"] == 700
    assert json.loads(seen[MEMBER_A]["--json balances"])["balances"] == [
        {"uid": ALICE, "atoms": 400},
        {"uid": BOB, "atoms": 300},
    ]


async def test_a_report_reads_one_snapshot(tmp_path: Path, store_url: str) -> None:
    data_dir = tmp_path / "bot"
    async with _harness(data_dir, store_url) as harness:
        await harness.credit(ALICE, 100)
        book = open_book(data_dir, store_url)
        try:
            with book.snapshot():
                assert balances(book) == [(ALICE, 100)]
                await harness.credit(ALICE, 5)  # the bot commits meanwhile
                await harness.credit(BOB, 7)
                assert balances(book) == [(ALICE, 100)]
                stats = ledger_stats(book)  # joins the snapshot
                assert (stats.balance_atoms, stats.movement_atoms, stats.callers) == (100, 100, 1)
            assert balances(book) == [(ALICE, 105), (BOB, 7)]
            assert ledger_stats(book).reconciles
        finally:
            book.close()


async def test_the_report_connection_writes_nothing(tmp_path: Path, store_url: str) -> None:
    data_dir = tmp_path / "bot"
    async with _harness(data_dir, store_url) as harness:
        await harness.credit(ALICE, 100)
        book = open_book(data_dir, store_url)
        try:
            with pytest.raises(Exception, match=r"(?i)read-?only"):
                book.execute("INSERT INTO balances (peer, atoms) VALUES ('x', 1)")
            with pytest.raises(Exception, match=r"(?i)read-?only"), book.snapshot():
                book.execute("UPDATE balances SET atoms = 0")
            assert balances(book) == [(ALICE, 100)]
        finally:
            book.close()
        assert await harness.balance(ALICE) == 100


async def test_postgresql_report_errors_are_one_line_without_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], postgres_url: str
) -> None:
    secret = "s3cret-pw"
    data_dir = tmp_path / "bot"
    # An empty database: refused, and left empty (nothing is created).
    _write_config(data_dir, f"{postgres_url}&password={secret}")
    code, out, err = await _report(capsys, data_dir, "balances")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert "is not a brmcp ledger" in err
    assert secret not in err
    assert "password=[redacted]" in err
    with pytest.raises(StoreError, match="is not a brmcp ledger"):
        open_book(data_dir, postgres_url)
    # A database that does not exist.
    missing = postgres_url.replace("///", "///no_such_db_", 1)
    _write_config(data_dir, f"{missing}&password={secret}")
    code, _, err = await _report(capsys, data_dir, "stats")
    assert code == 1
    assert err.startswith("brmcp-serve: cannot connect to PostgreSQL store postgresql:///no_such_db_")
    assert err.count("\n") == 1
    assert secret not in err


async def test_a_bad_brmcp_json_is_one_line_naming_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    open_database(tmp_path).close()
    config = tmp_path / SERVE_CONFIG_FILE
    config.write_text('{"store": "mysql://u:hunter2@db/book"}', encoding="utf-8")
    code, out, err = await _report(capsys, tmp_path, "balances")
    assert (code, out) == (1, "")
    assert err.startswith(f"brmcp-serve: {config}: store: ")
    assert err.count("\n") == 1
    assert "hunter2" not in err
    config.write_text("{not json", encoding="utf-8")
    code, _, err = await _report(capsys, tmp_path, "stats")
    assert code == 1
    assert err.startswith(f"brmcp-serve: {config}: not valid JSON")
    config.write_text(json.dumps({"store": "sqlite:"}), encoding="utf-8")
    code, out, err = await _report(capsys, tmp_path, "--json", "balances")
    assert code == 0, err
    assert json.loads(out) == {"balances": [], "held_tips": []}


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
