"""Nicks for the bots the approvals page shows, from brclient's address book.

brclient knows the nick of each contact (``ChatService.UserNick {hexUid}``
answers ``{nick}``, or fails with ``user <uid> not found`` for a stranger).
A nick is chosen by the other side, so it is only a label: the page shows
it next to the uid, never instead of it, and shows it as text (escaped),
with characters that do not print removed and at most
:data:`MAX_NICK_CHARS` characters.

* :class:`NickSource`: something that can ask brclient (the daemon's PM
  sender is one); a bridge without one (the in-memory fabric of the tests,
  an embedding host) shows uid prefixes only;
* :func:`clientrpc_user_nick`: the ``ChatService.UserNick`` call over a
  :class:`~brmcp.clientrpc.Client`;
* :class:`NickBook`: a bounded cache in front of a source.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import anyio

from brmcp.clientrpc.errors import ClientrpcNotConnected, ClientrpcProtocolError

__all__ = [
    "LOOKUP_BUDGET_SECS",
    "LOOKUP_TIMEOUT_SECS",
    "MAX_LOOKUPS",
    "MAX_NICKS",
    "MAX_NICK_CHARS",
    "NICK_RETRY_SECS",
    "NICK_TTL_SECS",
    "USER_NICK",
    "NickBook",
    "NickSource",
    "clientrpc_user_nick",
    "display_nick",
]

log = logging.getLogger("brmcp.bridge")

#: The clientrpc method that names a contact.
USER_NICK = "ChatService.UserNick"
#: Nicks (and failed look-ups) cached, the least recently used dropped first.
MAX_NICKS = 512
#: Seconds a nick is trusted before it is asked again (contacts can be renamed).
NICK_TTL_SECS = 600.0
#: Seconds before a failed look-up (a stranger, brclient away) is tried again.
NICK_RETRY_SECS = 60.0
#: Longest nick shown, in characters (longer ones end with "…").
MAX_NICK_CHARS = 40
#: Most look-ups made for one rendering of the page.
MAX_LOOKUPS = 16
#: Seconds one look-up may take.
LOOKUP_TIMEOUT_SECS = 2.0
#: Seconds all look-ups for one rendering may take together.
LOOKUP_BUDGET_SECS = 3.0


@runtime_checkable
class NickSource(Protocol):
    """Names brclient's contacts."""

    async def user_nick(self, uid: str) -> str:
        """The nick of contact ``uid`` (64 lowercase hex); raises any
        exception when it is not known (not a contact, brclient away)."""
        ...


class _Caller(Protocol):
    @property
    def connected(self) -> bool: ...

    async def call(self, method: str, params: Mapping[str, Any]) -> Any: ...


async def clientrpc_user_nick(client: _Caller, uid: str) -> str:
    """``ChatService.UserNick`` for ``uid`` (64 hex) over ``client`` (a
    :class:`~brmcp.clientrpc.Client`): the nick, ``""`` when brclient has an
    empty one. Does not wait for a connection that is down
    (:class:`~brmcp.clientrpc.ClientrpcNotConnected`); brclient's errors are
    :class:`~brmcp.clientrpc.RPCError` (``user <uid> not found`` for a uid
    that is not a contact); a result that is not ``{nick}`` is
    :class:`~brmcp.clientrpc.ClientrpcProtocolError`."""
    if not client.connected:
        raise ClientrpcNotConnected()
    result = await client.call(USER_NICK, {"hexUid": uid})
    if not isinstance(result, dict):
        raise ClientrpcProtocolError(f"{USER_NICK}: malformed result from brclient: not an object")
    nick = result.get("nick", "")
    if not isinstance(nick, str):
        raise ClientrpcProtocolError(f"{USER_NICK}: malformed result from brclient: nick is not a string")
    return nick


def display_nick(raw: str) -> str | None:
    """``raw`` as the page may show it: characters that do not print (control,
    format and bidi characters) dropped, other spaces made plain and
    collapsed, at most :data:`MAX_NICK_CHARS` characters; None when nothing
    is left. Still attacker-chosen text: escape it."""
    kept = "".join(ch if ch.isprintable() else " " if ch.isspace() else "" for ch in raw)
    text = " ".join(kept.split())
    if not text:
        return None
    return text if len(text) <= MAX_NICK_CHARS else text[: MAX_NICK_CHARS - 1] + "…"


class NickBook:
    """Cached nicks of bots (lowercase uid → :func:`display_nick`), at most
    :data:`MAX_NICKS` entries. ``source`` None: no nicks, every look-up
    misses. ``now`` is a monotonic clock in seconds."""

    def __init__(
        self,
        source: NickSource | None,
        *,
        now: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_NICKS,
    ) -> None:
        self._source = source
        self._now = now
        self._max = max_entries
        #: uid → (nick or None for a failed look-up, when to ask again).
        self._entries: OrderedDict[str, tuple[str | None, float]] = OrderedDict()

    @property
    def source(self) -> NickSource | None:
        """Where nicks come from (None: nowhere)."""
        return self._source

    def nick(self, uid: str) -> str | None:
        """The cached nick of ``uid`` (None: not known)."""
        entry = self._entries.get(uid.lower())
        return entry[0] if entry is not None else None

    def known(self, uids: Iterable[str]) -> dict[str, str]:
        """The cached nicks of those of ``uids`` that have one (lowercase keys)."""
        out: dict[str, str] = {}
        for uid in uids:
            nick = self.nick(uid)
            if nick is not None:
                out[uid.lower()] = nick
        return out

    def _due(self, uid: str, now: float) -> bool:
        entry = self._entries.get(uid)
        return entry is None or entry[1] <= now

    async def refresh(self, uids: Iterable[str], *, budget: float = LOOKUP_BUDGET_SECS) -> None:
        """Ask the source for those of ``uids`` (64 hex) not cached or due
        again: at most :data:`MAX_LOOKUPS`, each within
        :data:`LOOKUP_TIMEOUT_SECS`, all within ``budget`` seconds; what is
        not reached is asked next time. A failed look-up is cached as no
        nick for :data:`NICK_RETRY_SECS`. Never raises for the source's
        failures."""
        if self._source is None:
            return
        now = self._now()
        wanted: list[str] = []
        for uid in uids:
            key = uid.lower()
            if len(key) == 64 and all(c in "0123456789abcdef" for c in key) and key not in wanted:
                if self._due(key, now):
                    wanted.append(key)
                elif key in self._entries:
                    self._entries.move_to_end(key)
        with anyio.move_on_after(budget):
            for uid in wanted[:MAX_LOOKUPS]:
                await self._lookup(uid)

    async def _lookup(self, uid: str) -> None:
        assert self._source is not None
        nick: str | None = None
        try:
            with anyio.fail_after(LOOKUP_TIMEOUT_SECS):
                nick = display_nick(await self._source.user_nick(uid))
        except Exception as exc:
            log.debug("no nick for %s: %s", uid[:16], exc)
            self._store(uid, None, self._now() + NICK_RETRY_SECS)
            return
        self._store(uid, nick, self._now() + (NICK_TTL_SECS if nick is not None else NICK_RETRY_SECS))

    def _store(self, uid: str, nick: str | None, due: float) -> None:
        self._entries[uid] = (nick, due)
        self._entries.move_to_end(uid)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
