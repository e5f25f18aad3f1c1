"""brmcp: Model Context Protocol over Bison Relay private messages.

The public surface is small and re-exported here:

* :func:`is_envelope` tells MCP traffic from human chat (WIRE.md §Parsing);
* :class:`Router` demultiplexes PMs into MCP sessions (:class:`Conn`), sending
  through the host's :class:`PMSender`;
* :func:`parse_payment_required` and the ``_meta`` key constants describe
  paid tools (WIRE.md §Payments);
* the wire codec lives in :mod:`brmcp.wire`, the transport in
  :mod:`brmcp.transport`, the shared ``_meta`` vocabulary in
  :mod:`brmcp.protocol`, test helpers in :mod:`brmcp.testing`
  (docs/architecture.md has the whole map).
"""

from . import _compat
from ._ops.clock import Clock, ManualClock, SystemClock
from .protocol.payment import (
    CALL_KEY,
    PRICE_ATOMS_KEY,
    PRICING_KEY,
    PaymentRequired,
    parse_payment_required,
    payment_required_text,
)
from .transport.conn import Conn
from .transport.router import AcceptFunc, AllowFunc, Router, RouterOptions, RouterStats
from .transport.sender import PMSender, SenderFunc, SendError
from .wire import is_envelope

__all__ = [
    "CALL_KEY",
    "PRICE_ATOMS_KEY",
    "PRICING_KEY",
    "AcceptFunc",
    "AllowFunc",
    "Clock",
    "Conn",
    "ManualClock",
    "PMSender",
    "PaymentRequired",
    "Router",
    "RouterOptions",
    "RouterStats",
    "SendError",
    "SenderFunc",
    "SystemClock",
    "is_envelope",
    "parse_payment_required",
    "payment_required_text",
]
__version__ = "0.1.0"

_compat.install()
