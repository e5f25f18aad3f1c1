"""The paid-call soak: at least 200 paid calls from 8 concurrent agents through
the bridge over a fabric that drops 5 %, duplicates 5 % and reorders PMs,
with the bot offline at random and impatient agents that time out and
retry. Afterwards, to the atom: payments = results received x price +
credit left at the bot; every execution was received by an agent (except one
the bot ran before the agent gave up on that attempt: its answer crossed the
give-up, BRIDGE.md §Resumability), none ran twice; every logical call was
answered.

``BRMCP_SOAK_SEED`` picks the seed (default 1); ``BRMCP_SOAK_CALLS`` the
number of calls (default 200). ``bench/paidcall_soak_bench.py`` runs several
seeds and reports throughput.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from tests.kit.soak import run_soak


@pytest.mark.slow
async def test_paid_call_soak(tmp_path: Path) -> None:
    seed = int(os.environ.get("BRMCP_SOAK_SEED", "1"))
    calls = int(os.environ.get("BRMCP_SOAK_CALLS", "200"))
    with anyio.fail_after(240):
        tally = await run_soak(tmp_path, seed=seed, calls=calls, agents=8)
    print(tally.line())
    print("errors seen:", tally.errors_seen)
    assert tally.problems() == []
    assert tally.payments >= tally.answered
    assert tally.pms_dropped > 0
    assert tally.pms_duplicated > 0
