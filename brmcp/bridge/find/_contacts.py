"""Whether this bridge's brclient has a key exchange with a user
(BRIDGE.md §Finding bots through directories): the :class:`Contacts` source
discovery asks before it calls a directory or waits for an introduction, and
the daemon's :class:`ClientrpcContacts` over brclient's clientrpc.

``ChatService.UserNick`` answers ``user <uid> not found`` for anyone who is
not a contact, and ``ChatService.KXStream`` reports each completed exchange.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import anyio

from brmcp.clientrpc import ClientrpcError, KXCompleted, RPCError

__all__ = ["ClientrpcContacts", "Contacts", "ContactsUnavailable"]


class ContactsUnavailable(Exception):
    """brclient cannot tell now whether a user is a contact (not connected,
    or an unexpected answer)."""


class Contacts(Protocol):
    """Whether this brclient has a key exchange with a user."""

    async def is_contact(self, uid: str) -> bool:
        """True when ``uid`` (64 lowercase hex) is a contact. Raises
        :class:`ContactsUnavailable` when brclient cannot tell now."""
        ...

    async def wait_kx(self, uid: str, wait_secs: float) -> bool:
        """Wait up to ``wait_secs`` wall seconds until ``uid`` is a contact;
        True at once when it already is, False when the time ran out.
        Raises :class:`ContactsUnavailable`."""
        ...


class _KXClient(Protocol):
    @property
    def connected(self) -> bool: ...

    async def call(self, method: str, params: Mapping[str, Any]) -> Any: ...

    def kx_stream(self, unacked_from: int = 0) -> AsyncIterator[KXCompleted]: ...


class ClientrpcContacts:
    """:class:`Contacts` over a :class:`~brmcp.clientrpc.Client` (the daemon's
    brclient connection): ``ChatService.UserNick`` tells a contact (brclient
    answers ``user <uid> not found`` for anyone else), ``ChatService.KXStream``
    each exchange that completes. The stream is opened only while a wait runs
    and its events are not acked: the kx log stays as brclient keeps it."""

    def __init__(self, client: _KXClient) -> None:
        self._client = client

    async def is_contact(self, uid: str) -> bool:
        # Imported here: the approvals page's nick look-up is the same call.
        from brmcp.clientrpc.nicks import clientrpc_user_nick

        try:
            await clientrpc_user_nick(self._client, uid.lower())
        except RPCError as exc:
            if "not found" in str(exc):
                return False
            raise ContactsUnavailable(f"brclient's UserNick failed: {exc}") from None
        except ClientrpcError as exc:
            raise ContactsUnavailable(f"brclient cannot tell: {exc or type(exc).__name__}") from None
        return True

    async def wait_kx(self, uid: str, wait_secs: float) -> bool:
        wanted = uid.lower()
        events = self._client.kx_stream()
        try:
            with anyio.move_on_after(wait_secs):
                # Opened before the check: an exchange completing in between
                # is in the stream (brclient replays its unacked log).
                if await self.is_contact(wanted):
                    return True
                async for event in events:
                    if event.uid.lower() == wanted:
                        return True
            return False
        finally:
            close = getattr(events, "close", None)
            if callable(close):
                close()
