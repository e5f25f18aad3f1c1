"""The comparison, live: the same probes on the fake and on brnet, no
difference when the fake runs with a real brclient's timings; with its speed
options off, only the documented timing observations differ."""

from __future__ import annotations

from pathlib import Path

import pytest

from brmcp.testing.compare import compare_networks

pytestmark = [pytest.mark.realnet, pytest.mark.slow]

SPEED_ONLY = {("pacing", "paced"), ("tip_serialization", "one_at_a_time"), ("tipuser_after_start", "blocks")}


async def test_fake_and_real_do_not_differ(brnet_exe: Path, tmp_path: Path) -> None:
    result = await compare_networks(tmp_path, binary=brnet_exe)
    assert result.differences == [], result.report()


async def test_fast_fake_differs_only_in_its_speed_options(brnet_exe: Path, tmp_path: Path) -> None:
    result = await compare_networks(
        tmp_path, binary=brnet_exe, realistic_fake=False, probes=sorted(name for name, _ in SPEED_ONLY)
    )
    assert {(d.probe, d.key) for d in result.differences} == SPEED_ONLY, result.report()
