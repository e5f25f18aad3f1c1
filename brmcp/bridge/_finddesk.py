"""Finding bots and keeping their receipts, as the bridge offers them
(BRIDGE.md §Finding bots through directories, §Signed receipts): the receipt
book each signed result goes to, discovery through the directories, agents'
add-bot requests, and this bridge's own uid named to its links."""

from __future__ import annotations

from typing import Any

import anyio.abc

from brmcp.bridge.find import (
    BotRequestQueue,
    Contacts,
    Discovery,
    Introduction,
    ReceiptBook,
    ReceiptCall,
    record_receipt,
)
from brmcp.bridge.links import BotLink
from brmcp.protocol.receipts import SIGNED_RECEIPT_KEY

__all__ = ["FindDesk"]


class FindDesk:
    """The receipt book (``_receipts``), discovery and add-bot requests of
    one bridge, and the links (``_links``) its own uid is named to."""

    _tg: anyio.abc.TaskGroup | None
    _closed: bool
    _own_uid: str | None
    _links: dict[str, BotLink]
    _receipts: ReceiptBook
    _discovery: Discovery
    _bot_requests: BotRequestQueue
    #: Receipts that could not be written to the book (each logged).
    receipt_failures: int

    def _on_result(self, link: BotLink, arguments: dict[str, Any] | None, key: str, meta: Any) -> None:
        """A result of ``link``'s bot went to its agent: keep its signed
        receipt, if any, in the book in the background
        (BRIDGE.md §Signed receipts); a failure is logged and counted, never the agent's."""
        tg = self._tg
        if tg is None or self._closed or not isinstance(meta, dict) or SIGNED_RECEIPT_KEY not in meta:
            return

        def expected() -> ReceiptCall:
            return ReceiptCall.of(
                announced=link.receipt_key, caller=link.own_uid, arguments=arguments, call_key=key, meta=meta
            )

        async def keep() -> None:
            if not await record_receipt(self._receipts, link.uid, meta, expected):
                self.receipt_failures += 1

        tg.start_soon(keep)

    @property
    def receipts(self) -> ReceiptBook:
        """The receipt book (:mod:`.receipts`; blocking: call it off the event loop)."""
        return self._receipts

    def set_own_uid(self, uid: str) -> None:
        """Name this bridge's own BR uid (64 hex, as brclient reported it) in
        the hint an agent gets from a bot that does not answer (BRIDGE.md
        §Deadlines and re-sends, "Unanswered bots"), for links built now and
        later; a daemon calls it once connected to brclient."""
        self._own_uid = uid
        for link in self._links.values():
            link.own_uid = uid

    @property
    def discovery(self) -> Discovery:
        """Find and introductions through the configured directories
        (:mod:`.discovery`; BRIDGE.md §Finding bots through directories)."""
        return self._discovery

    @property
    def bot_requests(self) -> BotRequestQueue:
        """Add-bot requests of agents waiting for the user (:mod:`.botrequests`)."""
        return self._bot_requests

    async def bot_contact(self, uid: str) -> bool | None:
        """Whether this bridge's brclient has a key exchange with ``uid``
        (:meth:`.Discovery.contact`)."""
        return await self._discovery.contact(uid)

    async def introduce_bot(self, uid: str, via: str | None) -> Introduction:
        """A directory's introduction toward ``uid`` (:meth:`.Discovery.introduce`)."""
        return await self._discovery.introduce(uid, via)

    def use_contacts(self, contacts: Contacts | None) -> None:
        """Tell discovery how to learn whether a user is a contact of this
        bridge's brclient (the daemon passes
        :class:`~.discovery.ClientrpcContacts`); None: it cannot tell."""
        self._discovery.contacts = contacts
