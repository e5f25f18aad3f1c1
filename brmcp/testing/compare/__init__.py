"""The fake brclient proven against the real thing: the same clientrpc probes
run on :mod:`brmcp.testing.fakebr` and on brnet (real bisonrelay clients),
reduced to observations and compared key by key. ``python -m
brmcp.testing.compare`` prints the differences (exit status 1 when any)."""

from .probes import PROBES, Observation
from .runner import Comparison, Difference, compare_networks, diff_observations
from .targets import FakeTarget, RealTarget, Target, fake_target, real_target

__all__ = [
    "PROBES",
    "Comparison",
    "Difference",
    "FakeTarget",
    "Observation",
    "RealTarget",
    "Target",
    "compare_networks",
    "diff_observations",
    "fake_target",
    "real_target",
]
