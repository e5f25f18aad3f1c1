"""Test support: an in-memory PM fabric, and in :mod:`brmcp.testing.fakebr` a
fake relay with fake brclients (clientrpc over TLS), so everything runs without
a relay."""

from .fabric import Fabric, FabricStats, Faults, LinkDownError, LinkStats, PMTooLargeError, uid
from .hostile import HostileBot as HostileBot

__all__ = ["Fabric", "FabricStats", "Faults", "LinkDownError", "LinkStats", "PMTooLargeError", "uid"]
