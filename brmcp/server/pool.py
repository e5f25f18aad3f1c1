"""A bot pool (WIRE.md §Pools): several bot identities, each its own
brmcp-serve process and Bison Relay uid, serving the same tools on one
PostgreSQL book (balances, journal, callKeys shared), all signing receipts
with one receipt key (``receiptkey.json`` copied to each member).

* :class:`PoolConfig` -- the ``pool`` block of ``brmcp.json``
  (``{"id": "<name>", "members": ["<uid>", ...]}``), parsed and validated by
  :func:`parse_pool`;
* :func:`pool_meta` -- the ``brmcp/pool`` announcement a member puts in the
  ``_meta`` of its ``tools/list`` answers and of a marked ``initialize``
  answer: ``{"id", "members", "key"}``.

The announcement proves one thing only: the bot sending it, over its own
BR identity, holds the pool's receipt key. A caller treats as members only
the bots that themselves announce the same ``id`` and ``key``; the list of
other uids proves nothing about them (WIRE.md §Pools).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from ..protocol.pool import MAX_MEMBERS, MIN_MEMBERS, POOL_ID_MAX, POOL_META_KEY

__all__ = [
    "MAX_MEMBERS",
    "MIN_MEMBERS",
    "POOL_ID_MAX",
    "POOL_META_KEY",
    "PoolConfig",
    "member_sequence_id",
    "parse_pool",
    "pool_meta",
]

_UID = re.compile(r"[0-9a-f]{64}")
_POOL_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{POOL_ID_MAX - 1}}}")


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """A pool: ``id`` (1..64 of ``A-Za-z0-9._-``, starting with a letter or
    digit) and ``members`` (2..16 distinct lowercase 64-hex BR uids, in
    file order)."""

    id: str
    members: tuple[str, ...]

    def check_member(self, uid: str) -> None:
        """Raise :class:`ValueError` unless ``uid`` (this bot's own, once
        brclient told it) is one of :attr:`members`."""
        if uid.lower() not in self.members:
            raise ValueError(
                f"pool {self.id!r}: this bot's uid {uid.lower()} is not among pool.members; "
                "add it to the members of every pool member's brmcp.json"
            )

    def to_json(self) -> dict[str, Any]:
        """The ``pool`` block as ``brmcp.json`` holds it."""
        return {"id": self.id, "members": list(self.members)}


def parse_pool(value: Any) -> PoolConfig | None:
    """The ``pool`` block of ``brmcp.json``: None when absent (None), else a
    :class:`PoolConfig`. Raises :class:`ValueError` with a one-line message
    naming what to fix: not an object, an unknown key, a bad ``id``, a
    ``members`` that is not a list of 2..16 distinct 64-hex uids."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError('must be an object {"id": "<name>", "members": ["<uid>", ...]}')
    unknown = sorted(set(value) - {"id", "members"})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}: a pool has only id and members")
    pool_id = value.get("id")
    if not isinstance(pool_id, str) or not _POOL_ID.fullmatch(pool_id):
        raise ValueError(
            f"id must be 1..{POOL_ID_MAX} of A-Z a-z 0-9 . _ - starting with a letter or digit, got "
            f"{_shown(pool_id)}"
        )
    members = value.get("members")
    if not isinstance(members, list):
        raise ValueError(
            f"members must be a list of {MIN_MEMBERS}..{MAX_MEMBERS} uids, got {_shown(members)}"
        )
    uids: list[str] = []
    for index, member in enumerate(members):
        if not isinstance(member, str) or not _UID.fullmatch(member.lower()):
            raise ValueError(f"members[{index}] must be a 64-hex Bison Relay uid, got {_shown(member)}")
        uid = member.lower()
        if uid in uids:
            raise ValueError(f"members[{index}] repeats uid {uid}")
        uids.append(uid)
    if not MIN_MEMBERS <= len(uids) <= MAX_MEMBERS:
        raise ValueError(f"members must hold {MIN_MEMBERS}..{MAX_MEMBERS} uids, got {len(uids)}")
    return PoolConfig(pool_id, tuple(uids))


def pool_meta(pool: PoolConfig, key_hex: str) -> dict[str, Any]:
    """``{"brmcp/pool": {"id", "members", "key"}}``: the announcement with
    ``key`` the pool's receipt key (the Ed25519 public key, hex, as
    ``brmcp/receiptKey`` carries it; WIRE.md §Signed receipts)."""
    return {POOL_META_KEY: {"id": pool.id, "members": list(pool.members), "key": key_hex}}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def member_sequence_id(member: str, sequence_id: int) -> int:
    """The key under which a pool member records the tip with BR sequence id
    ``sequence_id`` that it, ``member`` (its own uid), received: the first 8
    bytes of SHA-256 of ``"<member>:<sequence id>"`` as a big-endian
    integer, shifted right one bit (0 to 2**63 - 1, the ledger's type).

    Each member's brclient numbers its own tips, so two members see the same
    sequence ids for different tips; the book is shared, and a tip is
    recorded once per (sequence id, sender, amount) (WIRE.md §Payments).
    Keyed on the receiving member as well, two different tips never look
    like one (a collision needs two SHA-256 prefixes to agree, about one
    chance in 2**63 per pair), and a redelivery of one tip to its member
    maps to the same key (WIRE.md §Pools, "Tips")."""
    digest = hashlib.sha256(f"{member.lower()}:{int(sequence_id)}".encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big") >> 1
