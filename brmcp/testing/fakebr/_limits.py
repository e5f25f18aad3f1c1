"""bisonrelay's size and amount rules, as a brclient applies them.

* A PM is composed as a routed message, zlib-compressed at brclient's
  ``compresslevel`` (4 by default), and refused at the sender when the
  estimate of its wire size, the base64 length of the compressed message plus
  512 bytes (``rpc.EstimateRoutedRMWireSize``), exceeds the relay's max
  message size (:data:`MAX_MSG_SIZE`, v0 policy). The recipient decompresses
  with a reader limited to that size, so a compressible PM that passed the
  sender but is larger uncompressed is dropped there without a word.
* ``TipUser`` turns its DCR amount into whole atoms (``dcrutil.NewAmount``:
  rounded half away from zero) and then into milliatoms.
"""

from __future__ import annotations

import json
import math
import zlib

from ...protocol.units import ATOMS_PER_DCR, milliatoms_from_atoms

__all__ = ["COMPRESS_LEVEL", "MAX_MSG_SIZE", "RM_OVERHEAD", "estimated_wire_size", "whole_atoms_matoms"]

#: The relay's max message size (bytes), v0 policy.
MAX_MSG_SIZE = 1_887_437
#: brclient's default ``compresslevel``.
COMPRESS_LEVEL = 4
#: Bytes of routed-message framing around a PM's text (header, JSON keys, signature).
RM_OVERHEAD = 256
_WIRE_OVERHEAD = 512


def estimated_wire_size(text: str, level: int = COMPRESS_LEVEL) -> int:
    """The sender's estimate of a PM's wire size in bytes (base64 of the
    compressed routed message plus 512)."""
    payload = json.dumps({"mode": 0, "message": text}).encode("utf-8")
    compressed = len(zlib.compress(payload, level)) + RM_OVERHEAD
    return 4 * ((compressed + 2) // 3) + _WIRE_OVERHEAD


def whole_atoms_matoms(dcr_amount: float) -> int:
    """Milliatoms of a DCR amount rounded to whole atoms (half away from zero,
    as Go's ``math.Round`` in ``dcrutil.NewAmount``)."""
    atoms = dcr_amount * ATOMS_PER_DCR
    rounded = math.floor(atoms + 0.5) if atoms >= 0 else -math.floor(-atoms + 0.5)
    return milliatoms_from_atoms(int(rounded))
