"""The ``brmcp/pool`` announcement as a caller reads it (WIRE.md §Pools).

A member of a bot pool names its pool in the ``_meta`` of its ``tools/list``
answers (and of a marked ``initialize`` answer)::

    {"brmcp/pool": {"id": "fortunes", "members": ["<64 hex uid>", ...], "key": "<64 hex>"}}

:func:`pool_from_meta` parses it into a :class:`PoolAnnouncement`, or None
when absent or malformed in any way (a caller ignores a bad announcement:
the bot is then an ordinary bot). The server side writes it
(:mod:`brmcp.server.pool`). Pure parsing, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .receipts import is_receipt_key

__all__ = [
    "MAX_MEMBERS",
    "MIN_MEMBERS",
    "POOL_ID_MAX",
    "POOL_META_KEY",
    "STILL_RUNNING_ELSEWHERE",
    "PoolAnnouncement",
    "pool_from_meta",
]

#: The ``_meta`` key of the announcement (WIRE.md §Pools).
POOL_META_KEY = "brmcp/pool"
#: Bounds on a pool's members (uids, the announcing bot's own among them).
MIN_MEMBERS = 2
MAX_MEMBERS = 16
#: Longest pool id in characters (ASCII letters, digits, ``.``, ``_``, ``-``).
POOL_ID_MAX = 64
#: How a member answers a duplicate whose original still runs at another
#: member after it waited for it (WIRE.md §Pools, the money rule, case 2):
#: a tool error, uncharged; a retry with the same callKey asks again.
STILL_RUNNING_ELSEWHERE = (
    "duplicate call: the original call with this callKey is still running at another member of the pool"
)

_UID = re.compile(r"[0-9a-f]{64}")
_POOL_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{POOL_ID_MAX - 1}}}")


@dataclass(frozen=True, slots=True)
class PoolAnnouncement:
    """One bot's ``brmcp/pool``: ``id`` (1..64 of ``A-Za-z0-9._-``),
    ``members`` (2..16 distinct lowercase 64-hex uids, as announced) and
    ``key`` (the pool's receipt key, 64 lowercase hex). Two announcements
    name one pool when their ``id`` and ``key`` are equal; the same id
    under another key is another pool."""

    id: str
    members: tuple[str, ...]
    key: str

    @property
    def pool(self) -> tuple[str, str]:
        """``(id, key)``: what identifies the pool."""
        return (self.id, self.key)

    def lists(self, uid: str) -> bool:
        """True when ``uid`` (any case) is among :attr:`members`."""
        return uid.lower() in self.members


def pool_from_meta(meta: Any) -> PoolAnnouncement | None:
    """The announcement under :data:`POOL_META_KEY` in a ``_meta`` mapping,
    or None when absent or malformed: not an object; an ``id`` outside the
    grammar; ``members`` not a list of 2..16 distinct 64-hex uids (upper
    case is accepted and lowered); a ``key`` that is not 64 lowercase hex;
    any other key in the object. Never raises."""
    if not isinstance(meta, Mapping):
        return None
    value = meta.get(POOL_META_KEY)
    if not isinstance(value, Mapping) or set(value) != {"id", "members", "key"}:
        return None
    pool_id, members, key = value.get("id"), value.get("members"), value.get("key")
    if not isinstance(pool_id, str) or not _POOL_ID.fullmatch(pool_id) or not is_receipt_key(key):
        return None
    if not isinstance(members, list) or not MIN_MEMBERS <= len(members) <= MAX_MEMBERS:
        return None
    uids: list[str] = []
    for member in members:
        if not isinstance(member, str) or not _UID.fullmatch(member.lower()) or member.lower() in uids:
            return None
        uids.append(member.lower())
    assert isinstance(key, str)
    return PoolAnnouncement(pool_id, tuple(uids), key)
