"""The local admin API the ``brmcp-bridge`` subcommands talk to (BRIDGE.md
§Admin surface) and the approvals page under ``ui``. Imports base, pay and
find."""

from __future__ import annotations

from ._routes import (
    AdminHost,
    ConfigSnippet,
    admin_handler,
    config_snippet,
)

__all__ = [
    "AdminHost",
    "ConfigSnippet",
    "admin_handler",
    "config_snippet",
]
