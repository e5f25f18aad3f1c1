"""Finding bots (BRIDGE.md §Finding bots through directories): the
directories' client side, add-bot requests, the receipt book (§Signed
receipts) and rating bots with a receipt. Imports only
:mod:`brmcp.bridge.base` of the bridge."""

from __future__ import annotations

from ._answers import (
    MAX_QUERY_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_TEXT_CHARS,
    Introduction,
)
from ._botrequests import (
    MAX_PENDING,
    MAX_REASON_CHARS,
    BotRequestQueue,
    BotRequestRefused,
    RequestEnded,
    UnknownRequest,
)
from ._contacts import (
    ClientrpcContacts,
    Contacts,
    ContactsUnavailable,
)
from ._discovery import (
    FIND_TIMEOUT,
    KX_TIMEOUT,
    MAX_KX_TIMEOUT,
    Discovery,
    DiscoveryError,
)
from ._rating import (
    MAX_COMMENT_CHARS,
    RATE_TIMEOUT,
    rate_handler,
)
from ._receipts import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    MAX_RECEIPTS_PER_BOT,
    RECEIPTS_FILE,
    ReceiptBook,
    ReceiptCall,
    StoredReceipt,
    receipts_handler,
    record_receipt,
)
from ._requests import (
    find_args,
    read_json_object,
)

__all__ = [
    "DEFAULT_LIST_LIMIT",
    "FIND_TIMEOUT",
    "KX_TIMEOUT",
    "MAX_COMMENT_CHARS",
    "MAX_KX_TIMEOUT",
    "MAX_LIST_LIMIT",
    "MAX_PENDING",
    "MAX_QUERY_CHARS",
    "MAX_REASON_CHARS",
    "MAX_RECEIPTS_PER_BOT",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
    "MAX_TEXT_CHARS",
    "RATE_TIMEOUT",
    "RECEIPTS_FILE",
    "BotRequestQueue",
    "BotRequestRefused",
    "ClientrpcContacts",
    "Contacts",
    "ContactsUnavailable",
    "Discovery",
    "DiscoveryError",
    "Introduction",
    "ReceiptBook",
    "ReceiptCall",
    "RequestEnded",
    "StoredReceipt",
    "UnknownRequest",
    "find_args",
    "rate_handler",
    "read_json_object",
    "receipts_handler",
    "record_receipt",
]
