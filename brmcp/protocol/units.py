"""Bison Relay's units (docs/clientrpc.md §Units): 1 DCR = 10**8 atoms =
10**11 milliatoms. Tips arrive in milliatoms; brmcp's books are in whole
atoms, and a tip is credited as its milliatoms floored to atoms (WIRE.md
§Payments; the Go reference does the same)."""

from __future__ import annotations

__all__ = ["ATOMS_PER_DCR", "MILLIATOMS_PER_ATOM", "atoms_from_milliatoms", "milliatoms_from_atoms"]

#: Atoms in one DCR.
ATOMS_PER_DCR = 100_000_000
#: Milliatoms in one atom.
MILLIATOMS_PER_ATOM = 1_000


def atoms_from_milliatoms(milliatoms: int) -> int:
    """Whole atoms in ``milliatoms`` (floored); 0 for an amount ≤ 0, which
    credits nothing."""
    return milliatoms // MILLIATOMS_PER_ATOM if milliatoms > 0 else 0


def milliatoms_from_atoms(atoms: int) -> int:
    """``atoms`` in milliatoms (exact)."""
    return atoms * MILLIATOMS_PER_ATOM
