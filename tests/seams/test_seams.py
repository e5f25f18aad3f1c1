"""One fault per paid call, over the real stack as processes (tests/seams/README.md).

``BRMCP_SEAMS_SEED`` picks the seed (printed), ``BRMCP_SEAMS_RUNS`` the runs
of the long test (skipped without it), ``BRMCP_SEAMS_REPORT`` a path for the
JSON totals (``<path>.<backend>.json`` per backend, also written on failure),
``BRMCP_SEAMS_DIR`` a directory to keep the stack's files and process logs in
(``<dir>/<backend>-<pid>/logs``) instead of pytest's temporary directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tests.kit.postgres import postgres_server as postgres_server  # the session fixture
from tests.seams.runs import FAULTS, POINTS, Plan, Totals, run_once
from tests.seams.stack import Stack, running_stack

SEED = int(os.environ.get("BRMCP_SEAMS_SEED", "20261207"))
CI_RUNS = 50
LONG_RUNS = int(os.environ.get("BRMCP_SEAMS_RUNS", "0"))


@dataclass
class Seams:
    """One long-lived stack on its own event loop, and the totals of its runs."""

    portal: BlockingPortal
    stack: Stack
    totals: Totals

    def run(self, plan: Plan) -> None:
        print(f"seams run {self.totals.runs + 1} (seed {SEED}): {plan}")
        outcome = self.portal.call(run_once, self.stack, plan)
        credit = self.portal.call(anyio.to_thread.run_sync, self.stack.ledger).balance
        self.totals.add(outcome, credit)
        assert not outcome.problems, (
            f"seed {SEED}, run {self.totals.runs}: {asdict(plan)}: {outcome.problems}"
        )


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def seams(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seams]:
    backend: str = request.param
    store = "sqlite:"
    if backend == "postgres":
        server = request.getfixturevalue("postgres_server")
        store = server.create_database("seams")
    keep = os.environ.get("BRMCP_SEAMS_DIR")
    root = Path(keep) / f"{backend}-{os.getpid()}" if keep else tmp_path_factory.mktemp(f"seams-{backend}")
    totals = Totals(backend, SEED)
    try:
        with (
            start_blocking_portal() as portal,
            portal.wrap_async_context_manager(running_stack(root, store)) as stack,
        ):
            yield Seams(portal, stack, totals)
    finally:
        summary = json.dumps(totals.to_dict(), indent=2)
        print(f"seams totals ({backend}): {summary}")
        report = os.environ.get("BRMCP_SEAMS_REPORT")
        if report:
            Path(f"{report}.{backend}.json").write_text(summary)


def plans(backend: str) -> st.SearchStrategy[Plan]:
    faults = [f for f in FAULTS if backend == "postgres" or f != "pg"]
    return st.builds(
        Plan,
        fault=st.sampled_from(faults),
        point=st.none() | st.sampled_from(POINTS),
        fraction=st.floats(0.0, 1.0),
        span=st.just(3.0),
        tip_delay=st.sampled_from([0.0, 0.3, 1.5]),
        down=st.sampled_from([0.0, 0.5, 2.0]),
        attempts=st.integers(3, 5),
        timeout=st.sampled_from([6.0, 15.0, 30.0]),
        pause=st.sampled_from([0.0, 0.5, 1.0]),
    )


def _drive(seams: Seams, runs: int) -> None:
    @settings(
        max_examples=runs,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @seed(SEED)
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        seams.run(data.draw(plans(seams.totals.backend), label="plan"))

    one()


@pytest.mark.slow
def test_one_fault_per_paid_call_keeps_the_books(seams: Seams) -> None:
    _drive(seams, CI_RUNS)
    assert seams.totals.runs == CI_RUNS


@pytest.mark.slow
@pytest.mark.skipif(LONG_RUNS == 0, reason="the long run: set BRMCP_SEAMS_RUNS (e.g. 500)")
def test_long_run_one_fault_per_paid_call_keeps_the_books(seams: Seams) -> None:
    _drive(seams, LONG_RUNS)
    assert seams.totals.runs == LONG_RUNS
