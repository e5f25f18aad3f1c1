"""The local admin API the ``brmcp-bridge`` subcommands talk to (BRIDGE.md
§Admin surface), the browser sessions both it and the approvals page use
(``UISessions``: the API mints login tickets, the page redeems them), and the
approvals page under ``ui``. Imports base, pay and find; ``ui`` imports this
package (the page answers its "Find tools" calls through the admin routes),
never the other way."""

from __future__ import annotations

from ._routes import (
    AdminHost,
    ConfigSnippet,
    admin_handler,
    config_snippet,
)
from ._sessions import SESSION_TTL, TICKET_TTL, UISession, UISessions

__all__ = [
    "SESSION_TTL",
    "TICKET_TTL",
    "AdminHost",
    "ConfigSnippet",
    "UISession",
    "UISessions",
    "admin_handler",
    "config_snippet",
]
