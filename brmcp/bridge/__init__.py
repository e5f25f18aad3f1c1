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
"""

from .._ops.clock import Clock, ManualClock, SystemClock, go_duration
from .admin import ConfigSnippet
from .approvals import PendingPayment
from .bridge import ADMIN_TOKEN_FILE, DEFAULT_LISTEN, Bridge, BridgeConfig
from .daemon import BridgeDaemon
from .errors import BridgeError, SettingsError, SettingsFileBroken
from .listener import ListenerLimits
from .retry import RetryPolicy
from .settings import MODE_APPROVAL, MODE_AUTOPAY, SETTINGS_FILE, Settings
from .settle import Payer
from .spend import SPEND_FILE, SpendEntry, SpendSummary
from .tipmatcher import TipMatcher, TipWaiter
from .tippayer import TipPayer, TipPaymentError

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
