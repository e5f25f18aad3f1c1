"""Test support: an in-memory PM fabric (and, later, a fake brclient) so
everything runs without a relay."""

from .fabric import Fabric, FabricStats, Faults, LinkDownError, LinkStats, PMTooLargeError, uid

__all__ = ["Fabric", "FabricStats", "Faults", "LinkDownError", "LinkStats", "PMTooLargeError", "uid"]
