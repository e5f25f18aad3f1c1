"""Run every probe on the fake and on brnet and list the differences."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .probes import PROBES, Observation
from .targets import fake_target, real_target

__all__ = ["Comparison", "Difference", "compare_networks", "diff_observations"]


@dataclass(frozen=True, slots=True)
class Difference:
    """One probe key whose observation differs: ``fake`` and ``real`` values."""

    probe: str
    key: str
    fake: Any
    real: Any

    def line(self) -> str:
        return f"{self.probe}.{self.key}: fake {json.dumps(self.fake)} / real {json.dumps(self.real)}"


@dataclass(slots=True)
class Comparison:
    """Observations per probe for each network, and their differences."""

    fake: dict[str, Observation] = field(default_factory=dict)
    real: dict[str, Observation] = field(default_factory=dict)
    differences: list[Difference] = field(default_factory=list)

    def report(self) -> str:
        lines = [f"{len(self.fake)} probes; {len(self.differences)} differences"]
        lines += ["  " + d.line() for d in self.differences]
        return "\n".join(lines)


def diff_observations(probe: str, fake: Observation, real: Observation) -> list[Difference]:
    """Key-by-key differences (a key missing on one side counts)."""
    out = []
    for key in sorted(set(fake) | set(real)):
        if fake.get(key, "<missing>") != real.get(key, "<missing>"):
            out.append(Difference(probe, key, fake.get(key, "<missing>"), real.get(key, "<missing>")))
    return out


async def _run_on(
    make: Callable[..., contextlib.AbstractAsyncContextManager[Any]],
    root: Path,
    names: list[str],
    **kwargs: Any,
) -> dict[str, Observation]:
    out: dict[str, Observation] = {}
    plain = [n for n in names if not PROBES[n][1]]
    nowallet = [n for n in names if PROBES[n][1]]
    for group, extra in ((plain, {}), (nowallet, {"nowallet": ("bob",)})):
        if not group:
            continue
        sub = root / ("nowallet" if extra else "plain")
        async with make(sub, **extra, **kwargs) as target:
            for name in group:
                try:
                    out[name] = await PROBES[name][0](target)
                except Exception as exc:  # a probe that cannot run is itself an observation
                    out[name] = {"probe_failed": f"{type(exc).__name__}: {exc}"[:200]}
    return out


async def compare_networks(
    root: Path,
    *,
    probes: list[str] | None = None,
    binary: Any = None,
    realistic_fake: bool = True,
    tip_restart_delay: float = 2.0,
) -> Comparison:
    """Run ``probes`` (default: all) on the fake and on brnet under ``root``."""
    names = list(probes or PROBES)
    result = Comparison()
    result.fake = await _run_on(
        fake_target, root / "fake", names, realistic=realistic_fake, tip_restart_delay=tip_restart_delay
    )
    result.real = await _run_on(
        real_target, root / "real", names, binary=binary, tip_restart_delay=tip_restart_delay
    )
    for name in names:
        result.differences += diff_observations(name, result.fake[name], result.real[name])
    return result
