"""Real-network tests: a real Bison Relay relay and real clients (brnet, built
from bisonrelay with Go). Skipped with the reason when Go is absent."""

from __future__ import annotations

from brmcp.testing.brnet.fixtures import brnet, brnet_exe, brnet_factory

__all__ = ["brnet", "brnet_exe", "brnet_factory"]
