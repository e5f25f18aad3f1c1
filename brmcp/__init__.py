"""brmcp: Model Context Protocol over Bison Relay private messages.

The public surface is small and re-exported here:

* :func:`is_envelope` tells MCP traffic from human chat (WIRE.md §Parsing);
* :class:`Router` demultiplexes PMs into MCP sessions (:class:`Conn`), sending
  through the host's :class:`PMSender`;
* the wire codec lives in :mod:`brmcp.wire`, test helpers in
  :mod:`brmcp.testing`.
"""

from .conn import Conn
from .router import AcceptFunc, AllowFunc, Router, RouterOptions, RouterStats
from .sender import PMSender, SenderFunc, SendError
from .wire import is_envelope

__all__ = [
    "AcceptFunc",
    "AllowFunc",
    "Conn",
    "PMSender",
    "Router",
    "RouterOptions",
    "RouterStats",
    "SendError",
    "SenderFunc",
    "is_envelope",
]
__version__ = "0.1.0"
