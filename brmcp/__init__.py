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

The names are loaded on first use (PEP 562): every ``brmcp.*`` import runs
this file first, and the console commands' ``--version`` and ``--help`` must
not pay for the MCP SDK that :mod:`brmcp.protocol` and :mod:`brmcp.transport`
import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _compat

if TYPE_CHECKING:
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

#: Exported name → the module that defines it (relative to this package).
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Clock", "ManualClock", "SystemClock"), "._ops.clock"),
    **dict.fromkeys(
        (
            "CALL_KEY",
            "PRICE_ATOMS_KEY",
            "PRICING_KEY",
            "PaymentRequired",
            "parse_payment_required",
            "payment_required_text",
        ),
        ".protocol.payment",
    ),
    "Conn": ".transport.conn",
    **dict.fromkeys(
        ("AcceptFunc", "AllowFunc", "Router", "RouterOptions", "RouterStats"), ".transport.router"
    ),
    **dict.fromkeys(("PMSender", "SenderFunc", "SendError"), ".transport.sender"),
    "is_envelope": ".wire",
}


def __getattr__(name: str) -> Any:
    """Import the module defining ``name`` on first use (PEP 562); raises
    AttributeError for a name this package does not export."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


_compat.install()
