"""The transport: MCP sessions over Bison Relay PMs, the thin async shell
around the sans-I/O codec :mod:`brmcp.wire` (WIRE.md §Sessions).

* :class:`Router` demultiplexes a host's inbound PMs into one session per
  ``(peer, sid)`` and owns their tasks; :class:`RouterOptions` tunes it and
  :class:`RouterStats` counts what it did;
* :class:`Conn` is one session, the read and write streams the MCP SDK's
  ``ClientSession`` and server run on;
* :class:`PMSender` is what the host gives the router to send one PM
  (:class:`SendError` when it cannot).
"""

from .conn import Conn, SendReceipt, send_deadline, send_receipt
from .router import AcceptFunc, AllowFunc, Router, RouterOptions, RouterStats
from .sender import PMSender, SenderFunc, SendError

__all__ = [
    "AcceptFunc",
    "AllowFunc",
    "Conn",
    "PMSender",
    "Router",
    "RouterOptions",
    "RouterStats",
    "SendError",
    "SendReceipt",
    "SenderFunc",
    "send_deadline",
    "send_receipt",
]
