"""Billing configuration: the built-in SQLite ledger or an operator's own
Billing store (the Go reference's ``Billing``, karamble/brmcp
``server/harness.go``, and ``server/billing_test.go`` TestLedgerOpensOnlyWithoutBilling)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from brmcp.server import Billing, Harness, HarnessConfig, HarnessError, InsufficientBalance
from tests.kit import is_internal_error
from tests.kit.harness import (
    ALICE,
    MALLORY,
    call,
    err_text,
    execute,
    names,
    ok_text,
    payment_required_json,
    query,
    served,
    standard_harness,
)

INTERRUPTED = "call interrupted by a server restart; the charge was refunded"


class MemoryBilling:
    """An operator's store: applies each ``ref`` at most once."""

    def __init__(self) -> None:
        self.balances: dict[str, int] = {}
        self.applied: list[tuple[str, str, int]] = []  # (ref, peer, signed atoms)

    def _seen(self, ref: str) -> bool:
        return any(r == ref for r, _, _ in self.applied)

    async def balance(self, peer: str) -> int:
        return self.balances.get(peer, 0)

    async def debit(self, peer: str, atoms: int, *, ref: str) -> None:
        if self._seen(ref):
            return
        if self.balances.get(peer, 0) < atoms:
            raise InsufficientBalance()
        self.balances[peer] = self.balances.get(peer, 0) - atoms
        self.applied.append((ref, peer, -atoms))

    async def credit(self, peer: str, atoms: int, *, ref: str) -> None:
        if self._seen(ref):
            return
        self.balances[peer] = self.balances.get(peer, 0) + atoms
        self.applied.append((ref, peer, atoms))


def test_memory_billing_satisfies_the_protocol() -> None:
    assert isinstance(MemoryBilling(), Billing)


def test_neither_billing_nor_data_dir_is_an_error() -> None:
    with pytest.raises(HarnessError, match="needs a data_dir for the built-in ledger or a Billing store"):
        Harness(HarnessConfig(allowed_peers={ALICE}))


async def test_custom_billing_without_data_dir_creates_no_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    billing = MemoryBilling()
    harness, runs = standard_harness(None, billing=billing)
    assert harness.database_path is None
    async with served(harness) as srv, srv.client(ALICE) as s:
        assert err_text(await call(s, "paid")) == payment_required_json("paid", 500, 0)
        billing.balances[ALICE] = 1200
        first = ok_text(await call(s, "paid", key="memory-key-001"))
        # callKey replay still works, in memory.
        assert ok_text(await call(s, "paid", key="memory-key-001")) == first
        assert is_internal_error("failing", err_text(await call(s, "failing")))
        assert await harness.balance(ALICE) == 700
        # Tips are de-duplicated in memory and credited through the store.
        assert await harness.credit_tip(ALICE, 3000, 9) == 3
        assert await harness.credit_tip(ALICE, 3000, 9) == 0
        assert await harness.credit_tip(MALLORY, 3000, 10) == 0
        assert await harness.statement(ALICE) == []
    assert runs.n == 2
    assert billing.balances[ALICE] == 703
    refs = [ref.split(":")[0] for ref, _, _ in billing.applied]
    assert refs == ["charge", "charge", "refund", "tip"]
    assert names(tmp_path) == []


async def test_custom_billing_with_data_dir_keeps_balances_outside(tmp_path: Path) -> None:
    billing = MemoryBilling()
    billing.balances[ALICE] = 600
    harness, runs = standard_harness(tmp_path, billing=billing)
    async with served(harness) as srv, srv.client(ALICE) as s:
        first = ok_text(await call(s, "paid", key="journal-key-01"))
        assert await harness.credit_tip(ALICE, 1000, 1) == 1
        statement = await harness.statement(ALICE)
        assert [(e.kind, e.atoms, e.balance_after) for e in statement] == [
            ("charge", -500, None),
            ("tip", 1, None),
        ]
    # The journal lives in SQLite; the balances do not.
    assert query(tmp_path, "SELECT count(*) FROM balances") == [(0,)]
    assert billing.balances[ALICE] == 101
    # The journal replays across a restart.
    harness, runs = standard_harness(tmp_path, billing=billing)
    async with served(harness) as srv, srv.client(ALICE) as s:
        assert ok_text(await call(s, "paid", key="journal-key-01")) == first
        assert await harness.credit_tip(ALICE, 1000, 1) == 0
    assert runs.n == 0
    assert billing.balances[ALICE] == 101


async def test_custom_billing_interrupted_calls_settled_once(tmp_path: Path) -> None:
    billing = MemoryBilling()
    billing.balances[ALICE] = 1000
    harness, _ = standard_harness(tmp_path, billing=billing)
    async with harness:
        pass
    # Crash 1: the debit landed (charge:c1 applied), completion never came.
    await billing.debit(ALICE, 500, ref="charge:c1")
    # Crash 2: journaled as 'charging'; the debit never reached the store.
    now = time.time()

    def script(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO calls (call_id, peer, call_key, tool, atoms, state, charged_at) "
            "VALUES ('c1', ?, 'ext-restart-key1', 'paid', 500, 'charged', ?)",
            (ALICE, now),
        )
        conn.execute(
            "INSERT INTO calls (call_id, peer, call_key, tool, atoms, state, charged_at) "
            "VALUES ('c2', ?, 'ext-restart-key2', 'paid', 300, 'charging', ?)",
            (ALICE, now),
        )

    execute(tmp_path, script)
    assert billing.balances[ALICE] == 500
    for _ in range(2):
        harness, runs = standard_harness(tmp_path, billing=billing)
        async with served(harness) as srv, srv.client(ALICE) as s:
            assert billing.balances[ALICE] == 1000
            # Retries of interrupted keys are answered, not executed again.
            assert err_text(await call(s, "paid", key="ext-restart-key1")) == INTERRUPTED
            assert err_text(await call(s, "paid", key="ext-restart-key2")) == INTERRUPTED
        assert runs.n == 0
    assert [ref for ref, _, _ in billing.applied] == ["charge:c1", "refund:c1", "charge:c2", "refund:c2"]
    assert query(tmp_path, "SELECT count(*) FROM calls WHERE state != 'done'") == [(0,)]


async def test_data_dir_alone_uses_the_builtin_ledger(tmp_path: Path) -> None:
    harness, _ = standard_harness(tmp_path)
    async with served(harness) as srv, srv.client(ALICE) as s:
        await harness.credit(ALICE, 700)
        assert json.loads(ok_text(await call(s, "paid"))) == {"n": 1}
    assert (tmp_path / "brmcp.sqlite3").is_file()
    assert query(tmp_path, "SELECT peer, atoms FROM balances") == [(ALICE, 200)]
