"""Crash safety of the harness: a harness under paid keyed load in
a child process (tests/server/crash_worker.py) is killed with SIGKILL at seeded
random points, restarted on the same data_dir, and after every restart the
ledger must agree with what durably happened:

* per peer, balance = tips credited - completed charges, and every audit
  row's ``balance_after`` is the running sum of the peer's movements;
* no (peer, callKey) was executed twice, across all runs;
* every call interrupted between its debit and completion is refunded
  exactly once (no 'charged' journal row survives start-up; the new
  ``recovery_refund`` rows match the interrupted charges one to one);
* a redelivered tip is credited once; only allowed peers with >= 1000
  milliatoms are credited, floored to atoms.

The child is forked from a pre-imported zygote, so a restart costs
milliseconds; the kill delays come from ``random.Random(SEED)``.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from brmcp.server import Harness, HarnessConfig
from brmcp.testing import uid
from tests.kit.harness import query

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(os, "fork"), reason="the worker zygote forks one child per run"),
]

SEED = 20260704
KILLS = 32
PRICE = 7
ALLOWED = {uid(2), uid(3), uid(4)}
WORKER = Path(__file__).with_name("crash_worker.py")


class Zygote:
    """The worker zygote and a line reader with deadlines."""

    def __init__(self, data_dir: Path, log_dir: Path) -> None:
        self._stderr = (log_dir / "worker.stderr").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(data_dir), str(log_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._buffer = b""
        assert self.expect("zygote", 60) == ["zygote", "ready"]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def expect(self, word: str, timeout: float) -> list[str]:
        """The next stdout line starting with ``word`` (an ``error`` line fails)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                words = line.decode().split()
                if words and words[0] == "error":
                    raise AssertionError(f"worker failed: {line.decode()}")
                if words and words[0] == word:
                    return words
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"worker did not say {word!r} within {timeout}s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"worker exited before saying {word!r}")
                self._buffer += chunk

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._stderr.close()


@dataclass
class Totals:
    kills: int = 0
    interrupted: int = 0
    executions: int = 0
    kept_charges: int = 0
    redelivered_tips: int = 0
    credited_tips: int = 0
    runs_with_interruptions: int = 0


async def restart(data_dir: Path) -> None:
    """Construct the harness on the data_dir (start-up reconciliation)."""
    harness = Harness(HarnessConfig(data_dir=data_dir, allowed_peers=ALLOWED))
    async with harness:
        pass


Interrupted = dict[str, tuple[str, str | None, int]]


def check(data_dir: Path, log_dir: Path, interrupted: Interrupted, last_id: int, totals: Totals) -> None:
    """The invariants, after a start-up; ``interrupted`` and ``last_id`` (the
    newest movement id) were read just before it."""
    # 1. No journal row is left between debit and completion.
    assert query(data_dir, "SELECT count(*) FROM calls WHERE state != 'done'") == [(0,)]

    movements = query(
        data_dir, "SELECT id, peer, kind, atoms, call_key, ref, balance_after FROM movements ORDER BY id"
    )
    kinds = Counter(str(m[2]) for m in movements)
    assert set(kinds) <= {"tip", "charge", "refund", "recovery_refund"}, kinds

    # 2. The refunds made by this start-up match the interrupted charges one to one.
    new = [m for m in movements if int(str(m[0])) > last_id]
    new_refunds = {str(m[5]): (str(m[1]), m[4], int(str(m[3]))) for m in new if m[2] == "recovery_refund"}
    expected = {f"refund:{cid}": row for cid, row in interrupted.items()}
    assert new_refunds == expected
    assert all(m[2] == "recovery_refund" for m in new), "start-up moved money for something else"

    charges = {str(m[5]).removeprefix("charge:"): m for m in movements if m[2] == "charge"}
    refunds = {
        str(m[5]).removeprefix("refund:"): m for m in movements if m[2] in ("refund", "recovery_refund")
    }
    assert set(refunds) <= set(charges), "a refund without a charge"
    for call_id, refund in refunds.items():
        assert refund[3] == -int(str(charges[call_id][3])) == PRICE
        assert refund[1] == charges[call_id][1]
        assert refund[4] == charges[call_id][4]
    kept = {cid: m for cid, m in charges.items() if cid not in refunds}

    # 3. Per peer: the audit chain is consistent and the balance is tips - kept charges.
    balances = dict(query(data_dir, "SELECT peer, atoms FROM balances"))
    peers = {str(m[1]) for m in movements} | {str(p) for p in balances}
    for peer in peers:
        running = 0
        for m in movements:
            if m[1] == peer:
                running += int(str(m[3]))
                assert m[6] == running, f"balance_after chain broken at movement {m[0]}"
        tips_in = sum(int(str(m[3])) for m in movements if m[1] == peer and m[2] == "tip")
        spent = sum(PRICE for m in kept.values() if m[1] == peer)
        assert balances.get(peer, 0) == running == tips_in - spent, peer
        assert running >= 0

    # 4. Executions: at most once per (peer, key) across all runs, each one charged first.
    lines = (log_dir / "executions.log").read_text().splitlines()
    executions = [tuple(line.split()) for line in lines]
    assert all(len(e) == 3 for e in executions), "torn execution record"
    keyed = Counter((e[0], e[1]) for e in executions if e[1] != "-")
    twice = [k for k, n in keyed.items() if n > 1]
    assert not twice, f"executed more than once: {twice[:5]}"
    outcome = {(e[0], e[1]): e[2] for e in executions if e[1] != "-"}
    charged_keys = Counter((str(m[1]), str(m[4])) for m in charges.values() if m[4] is not None)
    assert all(n == 1 for n in charged_keys.values()), "a key was charged twice"
    for cid, m in charges.items():
        key = (str(m[1]), str(m[4]))
        if m[4] is None:
            continue
        if cid in kept:
            assert outcome.get(key) == "ok", f"kept charge {key} without a successful execution"
        elif refunds[cid][2] == "refund":
            assert outcome.get(key) == "fail", f"handler refund {key} without a failed execution"
    for key in outcome:
        assert key in charged_keys, f"execution {key} without a charge"
    unkeyed = Counter(e[2] for e in executions if e[1] == "-")
    unkeyed_kept = sum(1 for m in kept.values() if m[4] is None)
    unkeyed_failed = sum(1 for cid, r in refunds.items() if r[2] == "refund" and charges[cid][4] is None)
    assert unkeyed_kept <= unkeyed["ok"]
    assert unkeyed_failed <= unkeyed["fail"]

    # 5. Tips: credited once, only what the rules allow, only what was offered.
    offered = Counter(tuple(line.split()) for line in (log_dir / "tips.log").read_text().splitlines())
    tip_rows = query(data_dir, "SELECT sequence_id, peer, amount_matoms, credited FROM tips")
    tip_moves = Counter(str(m[5]) for m in movements if m[2] == "tip")
    assert all(n == 1 for n in tip_moves.values())
    for seq, peer, matoms, credited in tip_rows:
        assert (str(seq), str(peer), str(matoms)) in offered, "a tip nobody sent"
        amount = int(matoms)
        rule = amount // 1000 if peer in ALLOWED and amount > 0 else 0
        assert credited == rule
        assert tip_moves.get(f"tip:{seq}:{peer}:{matoms}", 0) == (1 if rule > 0 else 0)
    for ref in tip_moves:
        _, seq_text, peer_text, matoms_text = ref.split(":")
        assert (seq_text, peer_text, matoms_text) in offered
    totals.redelivered_tips = sum(1 for n in offered.values() if n > 1)
    totals.credited_tips = len(tip_moves)
    totals.executions = len(executions)
    totals.kept_charges = len(kept)


def snapshot(data_dir: Path) -> tuple[Interrupted, int]:
    """Before start-up: the journal rows a crash left between debit and
    completion, and the newest movement id."""
    rows = query(data_dir, "SELECT call_id, peer, call_key, atoms FROM calls WHERE state != 'done'")
    interrupted = {str(r[0]): (str(r[1]), None if r[2] is None else str(r[2]), int(str(r[3]))) for r in rows}
    ((last_id,),) = query(data_dir, "SELECT coalesce(max(id), 0) FROM movements")
    return interrupted, int(str(last_id))


def test_sigkill_under_paid_keyed_load_keeps_the_ledger_exact(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    log_dir = tmp_path / "logs"
    data_dir.mkdir()
    log_dir.mkdir()
    rng = random.Random(SEED)
    totals = Totals()
    zygote = Zygote(data_dir, log_dir)
    try:
        for run in range(KILLS):
            zygote.send(f"run {run} {SEED}")
            pid = int(zygote.expect("child", 30)[2])
            zygote.expect("ready", 60)
            time.sleep(rng.uniform(0.01, 0.4))
            os.kill(pid, signal.SIGKILL)
            status = int(zygote.expect("exit", 30)[2])
            assert os.WIFSIGNALED(status), status
            assert os.WTERMSIG(status) == signal.SIGKILL
            totals.kills += 1
            interrupted, last_id = snapshot(data_dir)
            totals.interrupted += len(interrupted)
            totals.runs_with_interruptions += bool(interrupted)
            anyio.run(restart, data_dir)
            check(data_dir, log_dir, interrupted, last_id, totals)
            # A second start-up refunds nothing more.
            interrupted, last_id = snapshot(data_dir)
            assert interrupted == {}
            anyio.run(restart, data_dir)
            check(data_dir, log_dir, {}, last_id, totals)
        # A last run that ends cleanly, retrying keys of the killed runs.
        zygote.send(f"finish {KILLS} {SEED} 400")
        pid = int(zygote.expect("child", 30)[2])
        assert int(zygote.expect("exit", 120)[2]) == 0
        interrupted, last_id = snapshot(data_dir)
        assert interrupted == {}
        anyio.run(restart, data_dir)
        check(data_dir, log_dir, {}, last_id, totals)
    finally:
        zygote.close()
    print(
        f"\ncrash test: {totals.kills} kills, {totals.interrupted} interrupted charges refunded "
        f"(in {totals.runs_with_interruptions} runs), {totals.executions} executions, "
        f"{totals.kept_charges} kept charges, {totals.credited_tips} tips credited, "
        f"{totals.redelivered_tips} tips redelivered"
    )
    assert totals.kills >= 30
    # The kills did land inside paid calls (the load keeps several in flight).
    assert totals.interrupted >= 1
    assert totals.redelivered_tips >= 1
