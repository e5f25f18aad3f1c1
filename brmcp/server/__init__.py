"""The operator's side: serve priced MCP tools to allowed BR peers.

* :class:`Harness` / :class:`HarnessConfig`: tools, the per-call pipeline,
  the durable ledger and paid-call journal (go-brmcp.md §3);
* :class:`CallContext`: what a handler learns about its call;
* :class:`Billing`: plug in external accounting;
* :class:`StatementEntry`: one audited money movement;
* :func:`run_bot`: serve a harness through a running brclient (clientrpc).
"""

from .billing import Billing, InsufficientBalance
from .bot import run_bot
from .callkeys import REPLAY_WINDOW
from .context import CallContext
from .harness import OUTCOME_CAP, RATE_LIMITED_TEXT, Harness, HarnessConfig, HarnessError, valid_call_key
from .store import StatementEntry
from .tools import ToolSpec

__all__ = [
    "OUTCOME_CAP",
    "RATE_LIMITED_TEXT",
    "REPLAY_WINDOW",
    "Billing",
    "CallContext",
    "Harness",
    "HarnessConfig",
    "HarnessError",
    "InsufficientBalance",
    "StatementEntry",
    "ToolSpec",
    "run_bot",
    "valid_call_key",
]
