"""The operator's side: serve priced MCP tools to allowed BR peers.

* :class:`Harness` / :class:`HarnessConfig`: tools, the per-call pipeline,
  the durable ledger and paid-call journal (WIRE.md §Payments, §callKey), plus free
  resources, resource templates, prompts and completions;
* :class:`CallContext`: what a tool handler learns about its call;
  :class:`PeerContext`: what a resource, prompt or completion handler learns;
* :class:`Billing`: plug in external accounting;
* :class:`StatementEntry`: one audited money movement; :class:`HeldTip`: a
  tip held for a sender not allowed (WIRE.md §Payments);
* :func:`run_bot`: serve a harness through a running brclient (clientrpc);
  :func:`lock_brclient`: its one-harness-per-brclient lock;
* :func:`call_key_from_meta`: the callKey a ``tools/call`` ``_meta`` carries
  (``valid_call_key`` is its former name, deprecated).
"""

from __future__ import annotations

import warnings
from typing import Any

from brmcp.server.calls import REPLAY_WINDOW, call_key_from_meta
from brmcp.server.catalog import (
    CallContext,
    CompletionSpec,
    PeerContext,
    PromptSpec,
    ResourceSpec,
    ResourceTemplateSpec,
    ToolSpec,
)

from ..protocol.toolerrors import ToolRefusal
from .billing import Billing, InsufficientBalance
from .bot import lock_brclient, run_bot
from .harness import OUTCOME_CAP, RATE_LIMITED_TEXT, Harness, HarnessConfig, HarnessError
from .store import HeldTip, StatementEntry

__all__ = [
    "OUTCOME_CAP",
    "RATE_LIMITED_TEXT",
    "REPLAY_WINDOW",
    "Billing",
    "CallContext",
    "CompletionSpec",
    "Harness",
    "HarnessConfig",
    "HarnessError",
    "HeldTip",
    "InsufficientBalance",
    "PeerContext",
    "PromptSpec",
    "ResourceSpec",
    "ResourceTemplateSpec",
    "StatementEntry",
    "ToolRefusal",
    "ToolSpec",
    "call_key_from_meta",
    "lock_brclient",
    "run_bot",
    "valid_call_key",
]


def valid_call_key(meta: Any) -> str | None:
    """Deprecated: the former name of :func:`call_key_from_meta` (the
    callKey of a request's ``_meta``, or None), kept for one release; warns
    with a DeprecationWarning. Not to be confused with
    :func:`brmcp.protocol.payment.valid_call_key`, which says whether a
    value is a valid callKey."""
    warnings.warn(
        "brmcp.server.valid_call_key is now brmcp.server.call_key_from_meta; "
        "the old name goes away in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return call_key_from_meta(meta)
