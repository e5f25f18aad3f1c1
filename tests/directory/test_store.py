"""The directory's tables in the harness's database
(brmcp/directory/db/_store.py): round trips across a reopen, the fee debit and
the move to crawling in one transaction applied once, escrowed spends and
their refund on a definitive failure."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from brmcp.directory.db import (
    KIND_FEE,
    KIND_REFUND,
    KIND_TEST,
    LEAD_CONVERTED,
    LEAD_NEW,
    DirectoryStore,
    Lead,
    Peer,
    Registration,
)
from brmcp.directory.model import STATE_AWAITING_FUNDING, STATE_CRAWLING, TestSpec
from brmcp.server import Harness, HarnessConfig

U = "c" * 64
P = "d" * 64


def reg(**kw: object) -> Registration:
    base: dict[str, object] = {
        "uid": U,
        "reg_id": "r1",
        "state": STATE_AWAITING_FUNDING,
        "description": "desc",
        "tags": ("a", "b"),
        "test": TestSpec(tool="t", args={"x": [1, "y"]}, max_atoms=300),
        "fee_atoms": 100,
        "budget_atoms": 300,
        "renewal": False,
        "created_at": 5,
    }
    base.update(kw)
    return Registration(**base)  # type: ignore[arg-type]


async def test_round_trip_and_fee_once(tmp_path: Path) -> None:
    async with Harness(HarnessConfig(data_dir=tmp_path)) as harness:
        store = DirectoryStore(harness)
        await store.open()
        assert await store.register(reg())
        assert not await store.start_if_funded(U, 10)  # nothing credited yet
        await harness.credit(U, 399)
        assert not await store.start_if_funded(U, 10)  # one atom short
        await harness.credit(U, 1)
        assert await store.start_if_funded(U, 10)
        assert not await store.start_if_funded(U, 11)  # already crawling: no second fee
        assert await harness.balance(U) == 300
        # A register while crawling changes nothing.
        assert not await store.register(reg(description="other"))
        moved = await store.to_testing(U, "r1", '[{"name":"t"}]', "k" * 32)
        assert moved is not None
        assert moved.call_key == "k" * 32

        spend = await store.launch_spend(
            uid=U, tool="t", atoms=200, call_key="k" * 32, ts=12, escrow_reg="r1"
        )
        assert spend is not None
        assert (
            await store.launch_spend(uid=U, tool="t", atoms=101, call_key="k" * 32, ts=12, escrow_reg="r1")
            is None
        )
        assert await harness.balance(U) == 100
        await store.spend_failed(spend.id, 13)
        assert await harness.balance(U) == 300
        assert await store.spends() == []
        kept = await store.launch_spend(
            uid=P, tool="get_snapshot", atoms=9, call_key="s" * 16, ts=14, escrow_reg=None
        )
        assert kept is not None
        await store.spend_paid(kept.id)
        await store.put_peer(Peer(P, "ab" * 32, 3))
        assert await store.add_leads([Lead(U, P, LEAD_NEW, 1, 1), Lead(P + "", P, LEAD_NEW, 1, 1)]) == 1

    async with Harness(HarnessConfig(data_dir=tmp_path)) as harness:
        store = DirectoryStore(harness)
        await store.open()
        got = await store.registration(U)
        assert got is not None
        assert got.state == "testing"
        assert got.test == TestSpec(tool="t", args={"x": [1, "y"]}, max_atoms=300)
        assert got.tags == ("a", "b")
        assert got.paid_atoms == 0
        [entry] = await store.spends()
        assert (entry.uid, entry.atoms, entry.state, entry.escrow) == (P, 9, "paid", False)
        assert await store.peers() == [Peer(P, "ab" * 32, 3)]
        kinds = [(e.kind, e.atoms) for e in await harness.statement(U)]
        assert kinds == [
            ("credit", 399),
            ("credit", 1),
            (KIND_FEE, -100),
            (KIND_TEST, -200),
            (KIND_REFUND, 200),
        ]


async def test_register_converts_a_lead(tmp_path: Path) -> None:
    async with Harness(HarnessConfig(data_dir=tmp_path)) as harness:
        store = DirectoryStore(harness)
        await store.open()
        await store.put_peer(Peer(P, "ab" * 32, 3))
        assert await store.add_leads([Lead(U, P, LEAD_NEW, 1, 1, description="x")]) == 1
        assert await store.register(reg(state=STATE_CRAWLING))
        lead = await store.lead(U)
        assert lead is not None
        assert lead.state == LEAD_CONVERTED
        assert lead.to_json() == {
            "providerUid": U,
            "peerUid": P,
            "description": "x",
            "state": LEAD_CONVERTED,
            "createdAt": 1,
            "updatedAt": 5,
        }


async def test_tables_share_the_harness_database(tmp_path: Path) -> None:
    async with Harness(HarnessConfig(data_dir=tmp_path)) as harness:
        await DirectoryStore(harness).open()
    conn = sqlite3.connect(tmp_path / "brmcp.sqlite3")
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert {"dir_registrations", "dir_listings", "dir_spend", "dir_leads", "dir_peers", "balances"} <= names
    # The harness still opens the file with the extra tables in it.
    async with Harness(HarnessConfig(data_dir=tmp_path)):
        pass


async def test_transact_applies_a_ref_once_and_needs_the_built_in_ledger(tmp_path: Path) -> None:
    from brmcp.server import HarnessError
    from brmcp.server import store as ledger

    def fee(conn: sqlite3.Connection) -> None:
        ledger.add_balance(conn, U, -10)
        ledger.record_movement(conn, ts=1, peer=U, kind=KIND_FEE, atoms=-10, ref="dirfee:once")

    async with Harness(HarnessConfig(data_dir=tmp_path)) as harness:
        await harness.credit(U, 25)
        await harness.transact(fee)
        with pytest.raises(sqlite3.IntegrityError):
            await harness.transact(fee)
        # The failed second op rolled back entirely: one fee only.
        assert await harness.balance(U) == 15

    class Books:
        async def balance(self, peer: str) -> int:
            return 0

        async def credit(self, peer: str, atoms: int, *, ref: str) -> None:
            return None

        async def debit(self, peer: str, atoms: int, *, ref: str) -> None:
            return None

    async with Harness(HarnessConfig(data_dir=tmp_path / "ext", billing=Books())) as external:
        with pytest.raises(HarnessError, match="built-in ledger"):
            await external.transact(fee)
