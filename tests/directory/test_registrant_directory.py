"""The Registrant against the real directory (brmcp/directory/_service.py) on
the in-memory fabric: a proactive registration funds the invoice exactly
once, the directory's paid test runs once, and after approval a second
registration leaves the listing alone (docs/directory.md, "The provider
side")."""

from __future__ import annotations

import itertools
from pathlib import Path

from brmcp import ManualClock
from brmcp.directory.model import STATE_LISTED, STATE_PENDING_REVIEW, TestSpec
from brmcp.directory.provider import FUND_FILE, AutoFund, Registrant, RegistrantConfig
from tests.kit import until

from .stack import ADMIN, BUDGET, DIRECTORY, FEE, PROVIDER, START, directory_stack, provider_harness


async def test_registrant_lists_a_provider_at_the_real_directory(tmp_path: Path) -> None:
    async with directory_stack(tmp_path) as st:
        harness, runs = provider_harness(tmp_path / "prov")
        await st.add_provider(PROVIDER, harness)
        paid: list[int] = []
        sequence = itertools.count(100)

        class Tips:
            """Pays as the provider's confirmed tip credits the directory."""

            async def pay(self, payee_uid: str, atoms: int) -> None:
                assert payee_uid == DIRECTORY
                paid.append(atoms)
                await st.directory.credit_tip(PROVIDER, atoms * 1000, next(sequence))

        config = RegistrantConfig(
            description="fortunes on demand",
            tags=("fun",),
            test=TestSpec(tool="fortune", args={"topic": "tests"}, max_atoms=BUDGET),
            auto_fund=AutoFund(True, FEE + BUDGET, 10 * (FEE + BUDGET)),
        )
        registrant = Registrant(
            config,
            payer=Tips(),
            data_dir=tmp_path / "registrant",
            router=st.router_of(PROVIDER),
            clock=ManualClock(START),
        )
        await registrant.register(DIRECTORY)
        assert paid == [FEE + BUDGET]
        assert registrant.history.total_since(0) == FEE + BUDGET
        assert (tmp_path / "registrant" / FUND_FILE).exists()

        async def parked() -> bool:
            return (await st.directory.pipeline.status(PROVIDER)).state == STATE_PENDING_REVIEW

        await until(parked)
        assert len(runs) == 1  # the directory's one paid test call
        await st.ok(ADMIN, "approve", {"uid": PROVIDER})

        # A restart's registration finds the fresh listing and pays nothing.
        status = await registrant.register(DIRECTORY)
        assert status.state == STATE_LISTED
        assert status.expires_at > START
        assert paid == [FEE + BUDGET]
        assert len(runs) == 1
