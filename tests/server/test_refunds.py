"""A refunded paid call says so (WIRE.md §Receipts): its result ``_meta``
carries ``brmcp/refundedAtoms`` (the price credited back) and
``brmcp/balanceAtoms`` (the balance that refund left), computed in the
transaction that refunds it, and the outcome replayed for its callKey,
from memory or from the journal after a restart, is that same result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio

from brmcp.protocol.payment import BALANCE_ATOMS_KEY, CHARGED_ATOMS_KEY, REFUNDED_ATOMS_KEY
from brmcp.server import CallContext, Harness, HarnessConfig, InsufficientBalance
from brmcp.server.calls import OUTCOME_CAP
from tests.kit import until
from tests.kit.harness import ALICE, query, standard_harness


async def _call(harness: Harness, name: str, key: str | None = None) -> Any:
    spec = next(t for t in harness.tools() if t.name == name)
    return await harness.call(ALICE, spec, {}, {}, key)


class Ledger:
    """An operator's Billing store that applies each ref once."""

    def __init__(self) -> None:
        self.balances: dict[str, int] = {}
        self.refs: set[str] = set()

    async def balance(self, peer: str) -> int:
        return self.balances.get(peer, 0)

    async def debit(self, peer: str, atoms: int, *, ref: str) -> None:
        if ref in self.refs:
            return
        if self.balances.get(peer, 0) < atoms:
            raise InsufficientBalance()
        self.refs.add(ref)
        self.balances[peer] = self.balances.get(peer, 0) - atoms

    async def credit(self, peer: str, atoms: int, *, ref: str) -> None:
        if ref in self.refs:
            return
        self.refs.add(ref)
        self.balances[peer] = self.balances.get(peer, 0) + atoms


async def test_a_refund_carries_the_price_and_the_balance_after_it(tmp_path: Path) -> None:
    harness, runs = standard_harness(tmp_path)
    async with harness:
        await harness.credit(ALICE, 1200)
        failed = await _call(harness, "failing", "f" * 32)
        assert failed.is_error
        assert failed.meta == {REFUNDED_ATOMS_KEY: 500, BALANCE_ATOMS_KEY: 1200}
        unkeyed = await _call(harness, "failing")
        assert unkeyed.meta == {REFUNDED_ATOMS_KEY: 500, BALANCE_ATOMS_KEY: 1200}
        ok = await _call(harness, "paid")
        assert ok.meta == {CHARGED_ATOMS_KEY: 500, BALANCE_ATOMS_KEY: 700}
        # The duplicate replays the refunded outcome (the balance then), not a new one.
        again = await _call(harness, "failing", "f" * 32)
        assert again == failed
        assert runs.n == 3
        assert await harness.balance(ALICE) == 700
        moves = [(e.kind, e.atoms, e.balance_after) for e in await harness.statement(ALICE)]
        assert moves == [
            ("credit", 1200, 1200),
            ("charge", -500, 700),
            ("refund", 500, 1200),
            ("charge", -500, 700),
            ("refund", 500, 1200),
            ("charge", -500, 700),
        ]
    # The journal kept the result the caller got, refund keys included.
    (kept,) = query(tmp_path, "SELECT outcome FROM calls WHERE call_key = ?", ("f" * 32,))
    assert json.loads(kept[0])["_meta"] == {REFUNDED_ATOMS_KEY: 500, BALANCE_ATOMS_KEY: 1200}
    harness, runs = standard_harness(tmp_path)
    async with harness:
        replayed = await _call(harness, "failing", "f" * 32)
        assert replayed.meta == {REFUNDED_ATOMS_KEY: 500, BALANCE_ATOMS_KEY: 1200}
        assert runs.n == 0
        assert await harness.balance(ALICE) == 700


async def test_the_balance_named_is_the_one_the_refund_left(tmp_path: Path) -> None:
    """Calls refunded while other money moves: each names the balance right
    after its own refund, and the last one names the final balance."""
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))
    release = anyio.Event()

    @harness.tool(price_atoms=100)
    async def slow_fail(ctx: CallContext) -> dict[str, Any]:
        await release.wait()
        raise RuntimeError("no")

    async with harness:
        await harness.credit(ALICE, 1000)
        results: list[Any] = []
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(lambda: _collect(harness, results))
            await until(lambda: harness.executions >= 5)
            assert await harness.balance(ALICE) == 500
            await harness.credit(ALICE, 7)
            release.set()
        balances = sorted(r.meta[BALANCE_ATOMS_KEY] for r in results)
        assert balances == [607, 707, 807, 907, 1007]
        assert all(r.meta[REFUNDED_ATOMS_KEY] == 100 for r in results)
        assert await harness.balance(ALICE) == 1007
        afters = [e.balance_after for e in await harness.statement(ALICE) if e.kind == "refund"]
        assert sorted(a for a in afters if a is not None) == balances == sorted(balances)
        assert len(afters) == 5


async def _collect(harness: Harness, results: list[Any]) -> None:
    results.append(await _call(harness, "slow_fail"))


async def test_an_external_billing_refund_names_the_store_balance(tmp_path: Path) -> None:
    for data_dir in (tmp_path, None):
        ledger = Ledger()
        ledger.balances[ALICE] = 900
        harness, _ = standard_harness(data_dir, billing=ledger)
        async with harness:
            failed = await _call(harness, "failing", "e" * 32)
            assert failed.meta == {REFUNDED_ATOMS_KEY: 500, BALANCE_ATOMS_KEY: 900}
            assert ledger.balances[ALICE] == 900
            assert any(ref.startswith("refund:") for ref in ledger.refs)


async def test_a_large_refunded_outcome_is_refunded_and_marked_but_not_journaled(tmp_path: Path) -> None:
    harness = Harness(HarnessConfig(data_dir=tmp_path, allowed_peers={ALICE}))

    @harness.tool(price_atoms=50)
    async def big_fail(ctx: CallContext) -> Any:
        raise ValueError("x" * OUTCOME_CAP)

    async with harness:
        await harness.credit(ALICE, 50)
        failed = await _call(harness, "big_fail", "b" * 32)
        assert failed.meta == {REFUNDED_ATOMS_KEY: 50, BALANCE_ATOMS_KEY: 50}
        assert await harness.balance(ALICE) == 50
    assert query(tmp_path, "SELECT kept, outcome FROM calls") == [(0, None)]
