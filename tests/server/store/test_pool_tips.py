"""Tips in a pool (WIRE.md §Pools, "Tips"; brmcp/server/pool.py
``member_sequence_id``): every member's brclient numbers its own tips, so
two members see the same sequence ids for different tips. On one shared
PostgreSQL book each tip is still credited exactly once: two different
tips with equal sequence id, sender and amount at two members are two
credits, a redelivery to its member none, and a tip waits (is not
recorded) while the member does not know its own uid."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brmcp.protocol.receipts import ReceiptSigner
from brmcp.server import Harness, HarnessConfig
from brmcp.server.pool import PoolConfig, member_sequence_id
from brmcp.testing import uid
from tests.kit import ALICE, BOB

A, B, C = uid(11), uid(12), uid(13)
POOL = PoolConfig(id="fortunes", members=(A, B, C))


def member(url: str, me: str, key: Ed25519PrivateKey, *, known: bool = True) -> Harness:
    signer = ReceiptSigner(key, bot=me if known else "")
    return Harness(HarnessConfig(store=url, allowed_peers={ALICE, BOB}, receipt_signer=signer, pool=POOL))


def balances(url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url) as conn:
        return {str(p): int(a) for p, a in conn.execute("SELECT peer, atoms FROM balances").fetchall()}


def test_member_sequence_ids_are_per_member_and_in_range() -> None:
    assert member_sequence_id(A, 7) == member_sequence_id(A.upper(), 7)
    assert member_sequence_id(A, 7) != member_sequence_id(B, 7)
    assert member_sequence_id(A, 7) != member_sequence_id(A, 8)
    for seq in (0, 1, 2**63 - 1):
        assert 0 <= member_sequence_id(C, seq) < 2**63


async def test_equal_sequence_ids_at_two_members_are_two_tips(postgres_url: str) -> None:
    key = Ed25519PrivateKey.generate()
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(member(postgres_url, A, key))
        b = await stack.enter_async_context(member(postgres_url, B, key))
        assert await a.record_tip(ALICE, 500_000, 7) == (True, 500)
        assert await b.record_tip(ALICE, 500_000, 7) == (True, 500)  # another tip, same numbers
        assert await a.record_tip(ALICE, 500_000, 7) == (False, 0)  # a redelivery
        assert await b.record_tip(ALICE, 500_000, 7) == (False, 0)
        assert await a.balance(ALICE) == await b.balance(ALICE) == 1000
    assert balances(postgres_url) == {ALICE: 1000}


async def test_a_member_that_does_not_know_its_uid_records_no_tip(postgres_url: str) -> None:
    key = Ed25519PrivateKey.generate()
    async with member(postgres_url, A, key, known=False) as harness:
        with pytest.raises(RuntimeError, match="own uid is not known yet"):
            await harness.record_tip(ALICE, 500_000, 1)
        assert await harness.balance(ALICE) == 0
        signer = harness.config.receipt_signer
        assert signer is not None
        signer.bot = A  # brclient named it: the retried tip is credited once
        assert await harness.record_tip(ALICE, 500_000, 1) == (True, 500)
        assert await harness.record_tip(ALICE, 500_000, 1) == (False, 0)


tips = st.lists(
    st.tuples(
        st.sampled_from([A, B, C]), st.sampled_from([ALICE, BOB]), st.integers(0, 3), st.sampled_from([1, 2])
    ),
    max_size=24,
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(deliveries=tips)
def test_every_distinct_tip_is_credited_once_whatever_the_redeliveries(
    postgres_url: str, deliveries: list[tuple[str, str, int, int]]
) -> None:
    """Deliveries of (member, sender, sequence id, atoms), with repeats: the
    books credit each distinct tuple once and nothing else."""
    import anyio
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS balances, calls, tips, movements, held_tips, leases, brmcp_schema")

    async def run() -> dict[str, int]:
        key = Ed25519PrivateKey.generate()
        async with AsyncExitStack() as stack:
            members: dict[str, Any] = {}
            for me in (A, B, C):
                members[me] = await stack.enter_async_context(member(postgres_url, me, key))
            for me, sender, seq, atoms in deliveries:
                await members[me].record_tip(sender, atoms * 1000, seq)
        return balances(postgres_url)

    got = anyio.run(run)
    want: dict[str, int] = {}
    for _me, sender, _seq, atoms in set(deliveries):
        want[sender] = want.get(sender, 0) + atoms
    assert {p: a for p, a in got.items() if a} == want
