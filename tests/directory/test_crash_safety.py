"""Crash safety of the directory: a Directory with four providers and a peer
directory under a workload of registrations, tips, paid verification tests,
approvals, renewals, spot checks and snapshot purchases runs in a child
process (tests/directory/crash_worker.py) that is killed with SIGKILL at
seeded random points and restarted on the same data. After every kill the
data is opened once more (each harness's start-up reconciliation runs) and
the books must agree with what durably happened (docs/directory.md §Money,
brmcp/directory/db/_store.py):

* at the directory, per provider: tips credited == listing fees + test
  spends + balance; every test debit is either in the spend journal or
  refunded, and a registration's ``paid_atoms`` is the journal's sum for its
  callKey;
* every payment the payer made (its durable log) pays a journal row that
  existed before the money moved; a row without a payment is only ever in
  doubt (``launched``), and no callKey has two rows (never paid twice);
* at each provider (and the peer): each callKey ran at most once and was
  charged at most once, each kept charge has its execution, interrupted
  calls are refunded exactly once (a second start-up moves nothing), and the
  tips credited from the directory are payments the payer logged;
* no atom is created or lost: what providers tipped equals the directory's
  balances + fees + journal rows in doubt + payments in transit + the
  providers' balances for the directory + their kept charges, and the
  snapshot purchases out of the directory's pocket balance the same way;
* a test resumed after a kill runs under the callKey stored before the kill.

A last run that lets every verification finish must leave nothing in transit.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp.server import Harness, HarnessConfig
from tests.kit.harness import db_path
from tests.server.test_crash_safety import Zygote

from .crash_worker import (
    DIRECTORY,
    FEE,
    PEER_DIR,
    PRICES,
    PROVIDERS,
    SNAPSHOT_PRICE,
    directory_data,
    peer_data,
    provider_data,
    read_lines,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(os, "fork"), reason="the worker zygote forks one child per run"),
]

SEED = 20261202
KILLS = 32
ROOT = Path(__file__).resolve().parents[2]
DIR_KINDS = {"tip", "directory_fee", "directory_test", "directory_refund"}
PAYEE_KINDS = {"tip", "charge", "refund", "recovery_refund"}


class DirectoryZygote(Zygote):
    """tests/server/test_crash_safety.py's zygote, running this directory's worker."""

    def __init__(self, data_dir: Path, log_dir: Path) -> None:
        self._stderr = (log_dir / "worker.stderr").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.directory.crash_worker", str(data_dir), str(log_dir)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._buffer = b""
        assert self.expect("zygote", 60) == ["zygote", "ready"]


def rows(data_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    """``sql`` on the database in ``data_dir``; no rows when the database or
    the table it reads does not exist yet (a kill before the first start-up)."""
    path = db_path(data_dir)
    if not path.exists():
        return []
    conn = sqlite3.connect(path)
    try:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    finally:
        conn.close()


def payees(data_dir: Path) -> dict[str, tuple[Path, int]]:
    """Everyone the directory pays: uid -> (data directory, price of what it sells)."""
    out = {p: (provider_data(data_dir, i), PRICES[i]) for i, p in enumerate(PROVIDERS)}
    out[PEER_DIR] = (peer_data(data_dir), SNAPSHOT_PRICE)
    return out


@dataclass
class Observation:
    """What a kill left, read before the next start-up."""

    registrations: list[tuple[str, str, str, str]]
    launched: set[str]
    #: Per payee: its calls between debit and completion, and its newest movement id.
    interrupted: dict[str, dict[str, tuple[str, str | None, int]]]
    last_ids: dict[str, int]


def observe(data_dir: Path) -> Observation:
    dd = directory_data(data_dir)
    regs = [
        (str(r[0]), str(r[1]), str(r[2]), str(r[3]))
        for r in rows(dd, "SELECT uid, reg_id, state, call_key FROM dir_registrations")
    ]
    launched = {str(r[0]) for r in rows(dd, "SELECT ref FROM dir_spend WHERE state = 'launched'")}
    interrupted: dict[str, dict[str, tuple[str, str | None, int]]] = {}
    last_ids: dict[str, int] = {}
    for payee, (path, _price) in payees(data_dir).items():
        interrupted[payee] = {
            str(r[0]): (str(r[1]), None if r[2] is None else str(r[2]), int(r[3]))
            for r in rows(path, "SELECT call_id, peer, call_key, atoms FROM calls WHERE state != 'done'")
        }
        ((last,),) = rows(path, "SELECT coalesce(max(id), 0) FROM movements") or [(0,)]
        last_ids[payee] = int(last)
    return Observation(regs, launched, interrupted, last_ids)


async def restart(data_dir: Path) -> None:
    """Open every harness on its data once (start-up reconciliation)."""
    paths = [directory_data(data_dir)] + [path for path, _ in payees(data_dir).values()]
    for path in paths:
        if db_path(path).exists():
            async with Harness(HarnessConfig(data_dir=path, allow=lambda _peer: True)):
                pass


@dataclass
class Totals:
    kills: int = 0
    states_at_kill: Counter[str] = field(default_factory=Counter)
    launched_at_kill: set[str] = field(default_factory=set)
    payee_interrupted: int = 0
    resumed: dict[str, str] = field(default_factory=dict)  # reg_id -> callKey, seen testing at a kill
    keys: dict[str, str] = field(default_factory=dict)  # reg_id -> callKey, every observation
    payments: int = 0
    snapshots: int = 0
    in_doubt: int = 0
    refunded_spends: int = 0
    executions: int = 0
    tips_credited: int = 0
    tips_redelivered: int = 0
    fees: int = 0

    def record(self, obs: Observation) -> None:
        self.kills += 1
        self.launched_at_kill |= obs.launched
        self.payee_interrupted += sum(len(v) for v in obs.interrupted.values())
        for _uid, reg_id, state, key in obs.registrations:
            self.states_at_kill[state] += 1
            if key:
                assert self.keys.setdefault(reg_id, key) == key, f"registration {reg_id} changed its callKey"
            if state == "testing" and key:
                self.resumed[reg_id] = key


Row = tuple[Any, ...]
MOVEMENTS = "SELECT id, peer, kind, atoms, ref, balance_after, call_key FROM movements ORDER BY id"


def chain(movements: list[Row], balances: dict[str, int]) -> None:
    """Per peer: every ``balance_after`` is the running sum of the peer's
    movements (id, peer, kind, atoms, ref, balance_after, call_key), which
    ends at its balance and never goes below zero."""
    running: dict[str, int] = {}
    for m in movements:
        peer = str(m[1])
        running[peer] = running.get(peer, 0) + int(m[3])
        assert m[5] == running[peer], f"balance_after chain broken at movement {m[0]}"
        assert running[peer] >= 0
    for peer in set(running) | set(balances):
        assert balances.get(peer, 0) == running.get(peer, 0), peer


@dataclass
class PayeeBooks:
    in_transit: int  # atoms the payer sent that the payee has not credited yet
    balance: int  # the directory's balance at the payee
    charged: int  # the payee's kept charges of the directory


def payee_books(
    path: Path,
    payee: str,
    price: int,
    payments: list[list[str]],
    executions: list[list[str]] | None,
    obs: Observation,
    totals: Totals,
) -> PayeeBooks:
    """The ledger of one payee (a provider, or the peer directory selling
    snapshots) after its start-up; ``executions`` are a provider's records."""
    assert rows(path, "SELECT count(*) FROM calls WHERE state != 'done'") in ([(0,)], [])
    moves = rows(path, MOVEMENTS)
    assert {str(m[2]) for m in moves} <= PAYEE_KINDS
    assert {str(m[1]) for m in moves} <= {DIRECTORY}
    balances = {str(p): int(a) for p, a in rows(path, "SELECT peer, atoms FROM balances")}
    chain(moves, balances)
    # The start-up refunded exactly the calls the kill interrupted.
    new = [m for m in moves if int(m[0]) > obs.last_ids[payee]]
    assert all(m[2] == "recovery_refund" for m in new), "start-up moved money for something else"
    assert {str(m[4]): (str(m[1]), m[6], -int(m[3])) for m in new} == {
        f"refund:{cid}": (peer, key, -atoms) for cid, (peer, key, atoms) in obs.interrupted[payee].items()
    }
    # Tips: only payments the payer logged, each credited once and whole.
    mine = {p[0]: p for p in payments if p[1] == payee}
    tip_rows = rows(path, "SELECT sequence_id, peer, amount_matoms, credited FROM tips")
    for seq, peer, matoms, credited in tip_rows:
        assert peer == DIRECTORY, "a tip from someone else"
        assert str(seq) in mine, "a tip the payer never sent"
        assert int(matoms) == int(mine[str(seq)][2]) * 1000 == int(credited) * 1000
    landed = {str(r[0]) for r in tip_rows}
    in_transit = sum(int(p[2]) for seq, p in mine.items() if seq not in landed)
    # Charges: once per callKey, every one keyed.
    charges = {str(m[4]).removeprefix("charge:"): m for m in moves if m[2] == "charge"}
    refunds = {str(m[4]).removeprefix("refund:"): m for m in moves if m[2] in ("refund", "recovery_refund")}
    assert set(refunds) <= set(charges), "a refund without a charge"
    kept = {cid: m for cid, m in charges.items() if cid not in refunds}
    assert all(int(m[3]) == -price for m in charges.values())
    charged_keys = Counter(str(m[6]) for m in charges.values())
    assert "None" not in charged_keys, "an unkeyed call from the directory"
    assert all(n == 1 for n in charged_keys.values()), "a callKey charged twice"
    if executions is not None:
        mine_exec = [e for e in executions if e[0] == payee]
        ran = Counter(e[2] for e in mine_exec)
        assert all(n == 1 for n in ran.values()), f"a callKey executed twice: {ran.most_common(1)}"
        outcome = {e[2]: e[5] for e in mine_exec}
        for e in mine_exec:
            assert e[1] == DIRECTORY, e
            assert e[4] == "1", f"execution not under the stored callKey: {e}"
            assert e[2] in charged_keys, f"execution {e[2]} without a charge"
            if e[3] in totals.resumed:
                assert e[2] == totals.resumed[e[3]], f"resumed test {e[3]} ran under a new callKey"
        for cid, m in kept.items():
            assert outcome.get(str(m[6])) == "ok", f"kept charge {cid} without a successful execution"
        for cid, m in refunds.items():
            if m[2] == "refund":
                assert outcome.get(str(charges[cid][6])) == "fail", f"handler refund {cid} without a failure"
    return PayeeBooks(in_transit, balances.get(DIRECTORY, 0), price * len(kept))


def check(data_dir: Path, log_dir: Path, obs: Observation, totals: Totals, *, final: bool = False) -> None:
    """The invariants, after a start-up; ``obs`` was read just before it."""
    dd = directory_data(data_dir)
    offered = Counter(tuple(w) for w in read_lines(log_dir / "tips.log"))
    payments = read_lines(log_dir / "payments.log")
    executions = read_lines(log_dir / "executions.log")

    # -- the directory's ledger: tips in, fees and test debits out ---------------------------
    movements = rows(dd, MOVEMENTS)
    assert {str(m[2]) for m in movements} <= DIR_KINDS, Counter(str(m[2]) for m in movements)
    balances = {str(p): int(a) for p, a in rows(dd, "SELECT peer, atoms FROM balances")}
    chain(movements, balances)
    assert set(balances) <= set(PROVIDERS), "a balance for someone who never tipped"
    tip_moves = Counter(str(m[4]) for m in movements if m[2] == "tip")
    assert all(n == 1 for n in tip_moves.values()), "a tip credited twice"
    for seq, peer, matoms, credited in rows(
        dd, "SELECT sequence_id, peer, amount_matoms, credited FROM tips"
    ):
        assert (str(seq), str(peer), str(matoms)) in offered, "a tip nobody sent"
        assert credited == (int(matoms) // 1000 if int(matoms) >= 1000 else 0)
        assert tip_moves.get(f"tip:{seq}:{peer}:{matoms}", 0) == (1 if credited else 0)
    fees = [m for m in movements if m[2] == "directory_fee"]
    for m in fees:
        assert int(m[3]) == -FEE
        assert str(m[4]).startswith(f"dirfee:{m[1]}:")

    # -- the spend journal: each test debit journaled or refunded ------------------------------
    spend = {
        str(r[4]): r
        for r in rows(dd, "SELECT id, uid, tool, atoms, ref, call_key, escrow, state FROM dir_spend")
    }
    escrow = {ref: r for ref, r in spend.items() if r[6]}
    pocket = {ref: r for ref, r in spend.items() if not r[6]}
    assert {r[1] for r in escrow.values()} <= set(PROVIDERS)
    assert {(r[1], r[2]) for r in pocket.values()} <= {
        (PEER_DIR, "get_snapshot"),
        (PEER_DIR, "get_snapshot_manifest"),
    }
    tests = {str(m[4]): m for m in movements if m[2] == "directory_test"}
    refunds = {str(m[4]).removeprefix("dirrefund:"): m for m in movements if m[2] == "directory_refund"}
    assert set(refunds) <= set(tests), "a refund of a test debit that never happened"
    kept = {ref: m for ref, m in tests.items() if ref not in refunds}
    assert set(kept) == set(escrow), "a test debit neither journaled nor refunded, or a row without its debit"
    for ref, m in kept.items():
        assert -int(m[3]) == int(escrow[ref][3]), ref
        assert m[1] == escrow[ref][1], ref
    for ref, m in refunds.items():
        assert int(m[3]) == -int(tests[ref][3]), ref
        assert m[1] == tests[ref][1], ref
    per_key = Counter(str(r[5]) for r in spend.values())
    assert all(n == 1 for n in per_key.values()), f"a callKey journaled twice: {per_key.most_common(2)}"
    for reg_uid, reg_id, key, paid, budget in rows(
        dd, "SELECT uid, reg_id, call_key, paid_atoms, budget_atoms FROM dir_registrations"
    ):
        journaled = sum(int(r[3]) for r in escrow.values() if r[1] == reg_uid and key and r[5] == key)
        assert paid == journaled, f"paid_atoms {paid} of {reg_id} but {journaled} journaled"
        assert paid <= budget

    # -- the payer's log: every payment pays a row written before it, once --------------------
    paid_refs = Counter(p[3] for p in payments)
    assert "-" not in paid_refs, "a payment made without a journal row"
    assert all(n == 1 for n in paid_refs.values()), "a journal row paid twice"
    assert len({p[0] for p in payments}) == len(payments), "a payment sequence id reused"
    for seq, payee, atoms, ref, key in payments:
        assert ref in spend, f"payment {seq} of a row that is gone"
        row = spend[ref]
        assert (row[1], int(row[3]), row[5]) == (payee, int(atoms), key), seq
    unpaid = {ref: r for ref, r in spend.items() if ref not in paid_refs}
    assert all(r[7] == "launched" for r in unpaid.values()), "a row marked paid without a payment"

    # -- the payees ---------------------------------------------------------------------------------
    books = {
        payee: payee_books(
            path, payee, price, payments, None if payee == PEER_DIR else executions, obs, totals
        )
        for payee, (path, price) in payees(data_dir).items()
    }
    in_transit = sum(b.in_transit for b in books.values())
    if final:
        assert in_transit == 0, "a payment still in transit after the clean run"

    # -- no atom created or lost ----------------------------------------------------------------
    def paid_to(uids: set[str]) -> int:
        return sum(int(p[2]) for p in payments if p[1] in uids)

    def doubt(rows_: dict[str, Row]) -> int:
        return sum(int(r[3]) for ref, r in rows_.items() if ref in unpaid)

    def landed(uids: set[str]) -> int:
        return sum(books[u].balance + books[u].charged + books[u].in_transit for u in uids)

    providers = set(PROVIDERS)
    tips_in = sum(int(m[3]) for m in movements if m[2] == "tip")
    fees_taken = -sum(int(m[3]) for m in fees)
    escrowed = sum(int(r[3]) for r in escrow.values())
    assert tips_in == sum(balances.values()) + fees_taken + escrowed
    assert escrowed == paid_to(providers) + doubt(escrow)
    assert paid_to(providers) == landed(providers), "provider atoms created or lost"
    # Snapshot purchases come out of the directory's own pocket.
    assert sum(int(r[3]) for r in pocket.values()) == paid_to({PEER_DIR}) + doubt(pocket)
    assert paid_to({PEER_DIR}) == landed({PEER_DIR}), "snapshot atoms created or lost"

    totals.payments = len(payments)
    totals.snapshots = len(pocket)
    totals.in_doubt = len(unpaid)
    totals.refunded_spends = len(refunds)
    totals.executions = len(executions)
    totals.tips_credited = len(tip_moves)
    totals.tips_redelivered = sum(1 for n in offered.values() if n > 1)
    totals.fees = len(fees)


def test_sigkill_during_verification_keeps_the_books_exact(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    log_dir = tmp_path / "logs"
    data_dir.mkdir()
    log_dir.mkdir()
    rng = random.Random(SEED)
    totals = Totals()
    zygote = DirectoryZygote(data_dir, log_dir)
    started = time.monotonic()
    try:
        for run in range(KILLS):
            zygote.send(f"run {run} {SEED}")
            pid = int(zygote.expect("child", 30)[2])
            if rng.random() < 0.2:
                time.sleep(rng.uniform(0.0, 0.3))  # during start-up: resumes and redeliveries
            else:
                zygote.expect("ready", 60)
                time.sleep(rng.uniform(0.02, 0.6))
            os.kill(pid, signal.SIGKILL)
            status = int(zygote.expect("exit", 30)[2])
            assert os.WIFSIGNALED(status), status
            assert os.WTERMSIG(status) == signal.SIGKILL, status
            obs = observe(data_dir)
            totals.record(obs)
            anyio.run(restart, data_dir)
            check(data_dir, log_dir, obs, totals)
            # A second start-up moves nothing more.
            obs = observe(data_dir)
            assert not any(obs.interrupted.values())
            anyio.run(restart, data_dir)
            check(data_dir, log_dir, obs, totals)
        zygote.send(f"finish {KILLS} {SEED}")
        zygote.expect("child", 30)
        assert int(zygote.expect("exit", 60)[2]) == 0
        obs = observe(data_dir)
        assert not any(obs.interrupted.values())
        anyio.run(restart, data_dir)
        check(data_dir, log_dir, obs, totals, final=True)
        left = [r for r in obs.registrations if r[2] in ("crawling", "testing")]
        assert not left, left
    finally:
        zygote.close()
    listed = rows(directory_data(data_dir), "SELECT count(*) FROM dir_listings")
    states = ", ".join(f"{n} {s}" for s, n in sorted(totals.states_at_kill.items()))
    print(
        f"\ndirectory crash test: {totals.kills} kills in {time.monotonic() - started:.1f}s; "
        f"registrations at kill: {states}; {len(totals.launched_at_kill)} payments unconfirmed at a kill, "
        f"{totals.payee_interrupted} payee calls cut by kills, {len(totals.resumed)} tests resumed; "
        f"{totals.fees} fees, {totals.payments} payments ({totals.snapshots} snapshot purchases), "
        f"{totals.in_doubt} journal rows in doubt, {totals.refunded_spends} refunded, "
        f"{totals.executions} executions, {totals.tips_credited} tips credited, "
        f"{totals.tips_redelivered} redelivered, {listed[0][0] if listed else 0} listed at the end"
    )
    assert totals.kills == KILLS
    # The kills landed inside verification runs (counted over all of them).
    assert totals.states_at_kill["crawling"] + totals.states_at_kill["testing"] >= 1
    assert len(totals.resumed) >= 1
    assert totals.payments >= 1
    assert totals.snapshots >= 1
    assert totals.tips_redelivered >= 1
