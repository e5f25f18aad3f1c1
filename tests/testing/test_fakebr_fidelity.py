"""The fake brclient against recorded real behaviour: every comparison probe
(brmcp/testing/compare) run on the fake, with its speed options set as a real
brclient has them, gives exactly the observations recorded on brnet (real
bisonrelay clients, tests/vectors/brnet_observations.json). Runs without Go;
tests/realnet/test_fake_vs_real.py repeats it live where Go is present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brmcp.testing.compare import PROBES, diff_observations, fake_target
from tests.kit.paths import VECTORS

RECORDED = json.loads((VECTORS / "brnet_observations.json").read_text())["observations"]

pytestmark = pytest.mark.slow


async def test_recording_covers_every_probe() -> None:
    assert set(RECORDED) == set(PROBES)


@pytest.mark.parametrize("name", sorted(PROBES))
async def test_fake_matches_the_real_client(name: str, tmp_path: Path) -> None:
    probe, nowallet = PROBES[name]
    async with fake_target(tmp_path, nowallet=("bob",) if nowallet else ()) as target:
        observed = await probe(target)
    differences = diff_observations(name, observed, RECORDED[name])
    assert differences == [], "\n".join(d.line() for d in differences)


@pytest.mark.parametrize(
    ("name", "key"),
    [("pacing", "paced"), ("tip_serialization", "one_at_a_time"), ("tipuser_after_start", "blocks")],
)
async def test_speed_options_are_the_only_differences_when_off(name: str, key: str, tmp_path: Path) -> None:
    """Unit tests run the fake fast (no PM pacing, no TipUser block after
    start): exactly these observations then differ, nothing else."""
    probe, _ = PROBES[name]
    async with fake_target(tmp_path, realistic=False) as target:
        observed = await probe(target)
    differences = diff_observations(name, observed, RECORDED[name])
    assert [(d.key, d.fake, d.real) for d in differences] == [(key, False, True)]
