"""The bridge's local approvals page (BRIDGE.md "Approvals page").

Served on the bridge's listener under ``/ui/`` next to the admin surface,
behind the admin token: ``brmcp-bridge ui`` asks the running daemon for a
one-time login link; opening it sets a session cookie for this browser.
Server-rendered HTML; a small script (``/ui/app.js``) updates the page
without reloads and decides approvals in one click. Without the script the
same forms work as plain HTML posts. The page also shows agents' add-bot
requests (approve or deny) and a "Find tools" search of the configured
directories whose Add acts only on the user's confirmation.

* :class:`UISessions`: one-time login tickets and browser sessions;
* :func:`ui_handler`: the ASGI handler for ``/ui/…``;
* :class:`UIHost`: what the handler needs from the bridge;
* :class:`NickBook`, :class:`NickSource`: brclient's nicks for the bots shown.
"""

from brmcp.clientrpc.nicks import NickBook, NickSource

from .._sessions import SESSION_TTL, TICKET_TTL, UISessions
from ._app import UIHandler, UIHost, ui_handler
from ._botrequests import BOT_REQUEST_ROWS, MAX_REQUEST_TEXT, bot_requests_from_json, render_bot_requests
from ._html import time_left
from ._pagehttp import UI_PREFIX
from ._pages import PageState, render_page

__all__ = [
    "BOT_REQUEST_ROWS",
    "MAX_REQUEST_TEXT",
    "SESSION_TTL",
    "TICKET_TTL",
    "UI_PREFIX",
    "NickBook",
    "NickSource",
    "PageState",
    "UIHandler",
    "UIHost",
    "UISessions",
    "bot_requests_from_json",
    "render_bot_requests",
    "render_page",
    "time_left",
    "ui_handler",
]
