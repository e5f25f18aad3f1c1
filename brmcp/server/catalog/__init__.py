"""What a harness offers: tool registration (schemas, argument checks,
prices), free resources, resource templates, prompts and completions, and
the contexts their handlers receive. Imports nothing else of the server
but its rate limiter."""

from __future__ import annotations

from ._catalog import (
    MAX_SUBSCRIBED_URI_BYTES,
    MAX_SUBSCRIPTIONS,
    Catalog,
    SessionState,
)
from ._completions import (
    MAX_COMPLETION_VALUES,
    Completer,
    CompletionFields,
    CompletionSpec,
)
from ._context import (
    CallContext,
    PeerContext,
    peer_of,
)
from ._facade import (
    CatalogMethods,
)
from ._prompts import (
    PromptFields,
    PromptHandler,
    PromptSpec,
)
from ._resources import (
    ResourceFields,
    ResourceHandler,
    ResourceSpec,
    ResourceTemplateFields,
    ResourceTemplateSpec,
    TemplateHandler,
)
from ._tools import (
    Handler,
    ToolArgumentError,
    ToolFields,
    ToolSpec,
    to_result,
)
from ._toolset import (
    Toolset,
)

__all__ = [
    "MAX_COMPLETION_VALUES",
    "MAX_SUBSCRIBED_URI_BYTES",
    "MAX_SUBSCRIPTIONS",
    "CallContext",
    "Catalog",
    "CatalogMethods",
    "Completer",
    "CompletionFields",
    "CompletionSpec",
    "Handler",
    "PeerContext",
    "PromptFields",
    "PromptHandler",
    "PromptSpec",
    "ResourceFields",
    "ResourceHandler",
    "ResourceSpec",
    "ResourceTemplateFields",
    "ResourceTemplateSpec",
    "SessionState",
    "TemplateHandler",
    "ToolArgumentError",
    "ToolFields",
    "ToolSpec",
    "Toolset",
    "peer_of",
    "to_result",
]
