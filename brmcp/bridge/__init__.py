"""The client bridge: stock MCP agents reach paid bots over Bison Relay.

An agent connects to ``http://127.0.0.1:PORT/mcp/<bot uid>`` with a bearer
token; the bridge relays over BR PMs and pays for tools under the user's
policy (caps, approval or autopay). Behaviour and file formats follow the Go
reference (karamble/brmcp, ``bridge/``); see BRIDGE.md, and its §Differences
from the Go reference.

* :class:`Bridge` / :class:`BridgeConfig`: the bridge and what the host
  supplies; :class:`Payer` is the host's way to move money;
* :class:`Settings`: the policy in ``mcpclient.json``;
* :class:`SpendEntry` / :class:`SpendSummary`: the spend log ``mcpspend.json``;
* :class:`PendingPayment`: a payment waiting for approval;
* :class:`TipMatcher`: correlate tips with terminal tip-progress events;
* :class:`BridgeDaemon` / :class:`TipPayer`: the ``brmcp-bridge`` daemon on a
  brclient (clientrpc), as an async API;
* :class:`ListenerLimits`: the owned listener's timeouts and connection cap;
* :class:`RetryPolicy`: re-send timing toward bots;
* :class:`Clock`, :class:`SystemClock`, :class:`ManualClock`, :func:`go_duration`.

The names are loaded on first use (PEP 562), so that ``brmcp-bridge
--version`` and the commands that only talk to a running daemon do not import
the MCP SDK and the whole bridge through :mod:`brmcp.bridge.cli`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from brmcp._ops.clock import Clock, ManualClock, SystemClock, go_duration
    from brmcp._ops.listener import ListenerLimits
    from brmcp.bridge._bridge import Bridge, BridgeConfig
    from brmcp.bridge.admin import ConfigSnippet
    from brmcp.bridge.base import (
        ADMIN_TOKEN_FILE,
        DEFAULT_LISTEN,
        MODE_APPROVAL,
        MODE_AUTOPAY,
        SETTINGS_FILE,
        BridgeError,
        Settings,
        SettingsError,
        SettingsFileBroken,
    )
    from brmcp.bridge.daemon import BridgeDaemon
    from brmcp.bridge.links import RetryPolicy
    from brmcp.bridge.pay import SPEND_FILE, Payer, PendingPayment, SpendEntry, SpendSummary
    from brmcp.clientrpc.tipmatcher import TipMatcher, TipWaiter
    from brmcp.clientrpc.tippayer import TipPayer, TipPaymentError

__all__ = [
    "ADMIN_TOKEN_FILE",
    "DEFAULT_LISTEN",
    "MODE_APPROVAL",
    "MODE_AUTOPAY",
    "SETTINGS_FILE",
    "SPEND_FILE",
    "Bridge",
    "BridgeConfig",
    "BridgeDaemon",
    "BridgeError",
    "Clock",
    "ConfigSnippet",
    "ListenerLimits",
    "ManualClock",
    "Payer",
    "PendingPayment",
    "RetryPolicy",
    "Settings",
    "SettingsError",
    "SettingsFileBroken",
    "SpendEntry",
    "SpendSummary",
    "SystemClock",
    "TipMatcher",
    "TipPayer",
    "TipPaymentError",
    "TipWaiter",
    "go_duration",
]

#: Exported name → the module that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("ListenerLimits",), "brmcp._ops.listener"),
    **dict.fromkeys(("Bridge", "BridgeConfig"), "brmcp.bridge._bridge"),
    **dict.fromkeys(("ConfigSnippet",), "brmcp.bridge.admin"),
    **dict.fromkeys(
        (
            "ADMIN_TOKEN_FILE",
            "DEFAULT_LISTEN",
            "MODE_APPROVAL",
            "MODE_AUTOPAY",
            "SETTINGS_FILE",
            "BridgeError",
            "Settings",
            "SettingsError",
            "SettingsFileBroken",
        ),
        "brmcp.bridge.base",
    ),
    **dict.fromkeys(("BridgeDaemon",), "brmcp.bridge.daemon"),
    **dict.fromkeys(("RetryPolicy",), "brmcp.bridge.links"),
    **dict.fromkeys(
        ("SPEND_FILE", "Payer", "PendingPayment", "SpendEntry", "SpendSummary"), "brmcp.bridge.pay"
    ),
    **dict.fromkeys(("TipMatcher", "TipWaiter"), "brmcp.clientrpc.tipmatcher"),
    **dict.fromkeys(("TipPayer", "TipPaymentError"), "brmcp.clientrpc.tippayer"),
    **dict.fromkeys(("Clock", "ManualClock", "SystemClock", "go_duration"), "brmcp._ops.clock"),
}


def __getattr__(name: str) -> Any:
    """Import the module defining ``name`` on first use (PEP 562); raises
    AttributeError for a name this package does not export."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
