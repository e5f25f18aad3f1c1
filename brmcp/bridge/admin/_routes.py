"""The local admin surface of the bridge (the daemon's CLI talks to it).

Served by the bridge's HTTP app under ``/admin/`` and gated by the *admin*
token (``<data_dir>/mcpadmin.token``), not by the agents' token: agents hold
the bearer token, and must not be able to raise their own caps or approve
their own payments. All bodies are JSON.

| Method and path | Does |
|---|---|
| ``GET /admin/settings`` | the settings object (``mcpclient.json`` keys) |
| ``PUT`` or ``POST /admin/settings`` | apply a JSON object of changed keys; answers the new settings |
| ``GET /admin/approvals`` | ``{"pending": [PendingPayment…]}`` |
| ``POST /admin/approvals/<id>/approve`` or ``…/deny`` | decide; 404: unknown id, 409: withdrawn |
| ``GET /admin/spend`` | ``{"entries": [SpendEntry…], "day_total_atoms": n}`` |
| ``GET /admin/config-snippet/<uid>`` | the agent configuration for one bot |
| ``POST /admin/ui-login`` | ``{"url", "expires_in"}``: a one-time login link to the approvals page |
| ``POST /admin/find``, ``GET /admin/contact/<uid>`` | discovery through directories (:mod:`.discovery`) |
| ``POST /admin/introduce``, ``POST /admin/wait-kx`` | the same: introductions and key exchanges |
| ``GET /admin/receipts?bot=<uid>&limit=N``, ``GET …/<receiptId>`` | signed receipts (:mod:`.receipts`) |
| ``GET /admin/bot-requests``, ``POST …/<id>`` | add-bot requests of agents (:mod:`._botrequestroutes`) |
| ``POST /admin/rate`` | rate a bot at the directories with a kept receipt (:mod:`.rating`) |

A settings change may also carry ``add_allowed_bots`` (uids appended to
``allowed_bots`` unless there, against the list in force when it commits).
Changes compose: each is applied to the settings in force under the
bridge's one settings lock, so two at the same moment both hold.

A ``mode`` other than ``"approval"`` or ``"autopay"`` is refused here (400),
although loading ``mcpclient.json`` reads any other value as approval (Go's
rule). Errors are ``{"error": "<reason>"}`` with status 400 (bad input), 404
(unknown path or id), 405 (wrong method), 409 (a decision for a payment
withdrawn because its agent went away: ``payment <id> was withdrawn: the
agent went away; nothing was paid``; a change of the settings while
``mcpclient.json`` fails to load, which is not overwritten), 413 (body too
large) or 500 (state could not be written).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from starlette.types import Receive, Scope, Send

from brmcp.bridge.base import (
    MAX_ADMIN_BODY_BYTES,
    MODE_APPROVAL,
    MODE_AUTOPAY,
    BridgeError,
    PathHandler,
    Settings,
    SettingsError,
    SettingsFileBroken,
    check_new_token,
    is_uid,
    read_body,
    send_json,
    setting_names,
    settings_from_json,
    unknown_setting_hint,
    with_allowed,
)
from brmcp.bridge.find import BotRequestQueue, Discovery, ReceiptBook, rate_handler, receipts_handler
from brmcp.bridge.pay import PendingPayment, SpendSummary

from ._botrequestroutes import bot_request_handler
from ._discoveryroutes import discovery_handler
from ._sessions import TICKET_TTL, UISessions

if TYPE_CHECKING:
    from brmcp.bridge.pay import Settler

__all__ = [
    "ADD_ALLOWED_BOTS",
    "MAX_ADMIN_BODY_BYTES",
    "AdminHost",
    "ConfigSnippet",
    "admin_handler",
    "config_snippet",
]

#: The settings change's key that appends uids to ``allowed_bots`` (those not
#: on it yet) against the list in force when the change commits, instead of
#: replacing the list with one read earlier (``brmcp-bridge add`` sends it).
ADD_ALLOWED_BOTS = "add_allowed_bots"


class AdminHost(Protocol):
    """What the admin surface needs from the bridge (the :class:`~brmcp.bridge.Bridge`)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def ui_sessions(self) -> UISessions: ...

    @property
    def discovery(self) -> Discovery: ...

    @property
    def receipts(self) -> ReceiptBook: ...

    @property
    def bot_requests(self) -> BotRequestQueue: ...

    def pending_payments(self) -> list[PendingPayment]: ...

    def resolve_payment(self, payment_id: str, approve: bool) -> bool: ...

    def spend_log(self) -> SpendSummary: ...

    @property
    def _settler(self) -> Settler:
        """Its payments (the approval queue remembers withdrawn ids)."""
        ...

    def config_snippet(self, uid: str, base_url: str | None = None) -> ConfigSnippet: ...

    async def _commit_settings(self, change: Callable[[Settings], Settings], *, source: str) -> Settings:
        """Apply ``change`` to the settings in force under the one settings
        lock and commit the result (:meth:`~brmcp.bridge.Bridge.update_settings`)."""
        ...

    def _schedule_reconcile(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ConfigSnippet:
    """How an agent reaches one bot through the bridge: the MCP server
    ``name`` (``brmcp-<first 8 hex>``), the endpoint ``url`` and the bearer
    ``token``."""

    name: str
    url: str
    token: str

    @property
    def mcp_json(self) -> dict[str, Any]:
        """An ``.mcp.json`` document (Claude Code, Cursor and others)."""
        return {
            "mcpServers": {
                self.name: {
                    "type": "http",
                    "url": self.url,
                    "headers": {"Authorization": f"Bearer {self.token}"},
                }
            }
        }

    @property
    def claude_command(self) -> str:
        """The equivalent ``claude mcp add`` command line."""
        return (
            f"claude mcp add --transport http {self.name} {self.url} "
            f'--header "Authorization: Bearer {self.token}"'
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "mcp_json": self.mcp_json,
            "claude_command": self.claude_command,
        }


def config_snippet(uid: str, base_url: str, token: str) -> ConfigSnippet:
    """The snippet for bot ``uid`` (64 hex, lowercased) on a bridge reached
    at ``base_url`` (e.g. ``http://127.0.0.1:8891``). Raises ValueError for
    a malformed uid."""
    if not is_uid(uid):
        raise ValueError(f"bot uid {uid!r} is not 64 hex characters")
    uid = uid.lower()
    return ConfigSnippet(name=f"brmcp-{uid[:8]}", url=f"{base_url.rstrip('/')}/mcp/{uid}", token=token)


def _base_url(scope: Scope) -> str:
    host = "127.0.0.1"
    for key, value in scope.get("headers", ()):
        if key.lower() == b"host":
            host = value.decode("latin-1")
            break
    scheme = scope.get("scheme", "http")
    root = scope.get("root_path", "")
    return f"{scheme}://{host}{root}"


def admin_handler(bridge: AdminHost) -> PathHandler:
    """The ASGI handler for ``/admin/…`` bound to ``bridge`` (the gate has
    already checked the admin token)."""

    async def handle(scope: Scope, receive: Receive, send: Send, path: str) -> None:
        method = scope.get("method", "")
        parts = [p for p in path.split("/") if p][1:]  # drop "admin"
        route = parts[0] if parts else ""
        if route == "settings" and len(parts) == 1:
            if method == "GET":
                await send_json(send, 200, bridge.settings.to_dict())
                return
            if method in ("PUT", "POST"):
                await _set_settings(bridge, receive, send)
                return
            await send_json(send, 405, {"error": "use GET, PUT or POST"})
            return
        if route == "approvals":
            if len(parts) == 1 and method == "GET":
                await send_json(send, 200, {"pending": [p.to_dict() for p in bridge.pending_payments()]})
                return
            if len(parts) == 3 and parts[2] in ("approve", "deny"):
                if method != "POST":
                    await send_json(send, 405, {"error": "use POST"})
                    return
                approve = parts[2] == "approve"
                if not bridge.resolve_payment(parts[1], approve):
                    withdrawn = bridge._settler.approvals.withdrawn(parts[1])
                    if withdrawn is not None:
                        await send_json(send, 409, {"error": withdrawn})
                        return
                    await send_json(send, 404, {"error": "unknown payment"})
                    return
                await send_json(send, 200, {"id": parts[1], "approved": approve})
                return
        if route == "spend" and len(parts) == 1:
            if method != "GET":
                await send_json(send, 405, {"error": "use GET"})
                return
            await send_json(send, 200, bridge.spend_log().to_dict())
            return
        if route == "config-snippet" and len(parts) == 2:
            if method != "GET":
                await send_json(send, 405, {"error": "use GET"})
                return
            try:
                snippet = bridge.config_snippet(parts[1], _base_url(scope))
            except ValueError as exc:
                await send_json(send, 400, {"error": str(exc)})
                return
            await send_json(send, 200, {**snippet.to_dict(), "allowed": bridge.settings.allows(parts[1])})
            return
        if await discovery_handler(bridge.discovery, route, parts, method, receive, send):
            return
        if route == "receipts" and await receipts_handler(
            bridge.receipts, parts, method, scope.get("query_string", b""), send
        ):
            return
        if await bot_request_handler(bridge.bot_requests, parts, method, receive, send):
            return
        if route == "rate" and await rate_handler(
            bridge.discovery, bridge.receipts, parts, method, receive, send
        ):
            return
        if route == "ui-login" and len(parts) == 1:
            if method != "POST":
                await send_json(send, 405, {"error": "use POST"})
                return
            ticket = bridge.ui_sessions.mint_ticket()
            url = f"{_base_url(scope)}/ui/login?ticket={ticket}"
            await send_json(send, 200, {"url": url, "expires_in": int(TICKET_TTL)})
            return
        await send_json(send, 404, {"error": "not found"})

    return handle


async def _set_settings(bridge: AdminHost, receive: Receive, send: Send) -> None:
    body, extra = await read_body(receive, MAX_ADMIN_BODY_BYTES)
    if body is None:
        if not extra:
            await send_json(send, 413, {"error": "request body too large"})
        return
    try:
        changes = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        await send_json(send, 400, {"error": "body is not JSON"})
        return
    if not isinstance(changes, dict):
        await send_json(send, 400, {"error": "body must be a JSON object of settings"})
        return
    unknown = sorted(set(changes) - set(setting_names()) - {ADD_ALLOWED_BOTS})
    if unknown:
        await send_json(send, 400, {"error": unknown_setting_hint(unknown[0])})
        return
    adds = changes.get(ADD_ALLOWED_BOTS, [])
    if not isinstance(adds, list) or not all(isinstance(uid, str) and is_uid(uid) for uid in adds):
        await send_json(send, 400, {"error": f"{ADD_ALLOWED_BOTS} must be a list of 64-hex uids"})
        return

    def change(current: Settings) -> Settings:
        # Applied to the settings in force under the settings lock, so this
        # change composes with an approval or a reload at the same moment
        # (the extra key is ignored by the decoder, as unknown keys are).
        candidate = with_allowed(settings_from_json(body, base=current), adds)
        if changes.get("mode") is not None and candidate.mode not in (MODE_APPROVAL, MODE_AUTOPAY):
            # Loading a file keeps Go's rule (anything else means approval);
            # a change made here is refused instead of silently meaning approval.
            raise SettingsError(
                f'mode must be "{MODE_APPROVAL}" or "{MODE_AUTOPAY}", not {json.dumps(candidate.mode)}'
            )
        return candidate

    try:
        check_new_token(changes.get("token"))
        applied = await bridge._commit_settings(change, source="admin API")
    except SettingsError as exc:
        await send_json(send, 400, {"error": str(exc)})
        return
    except SettingsFileBroken as exc:
        await send_json(send, 409, {"error": str(exc)})
        return
    except BridgeError as exc:
        await send_json(send, 500, {"error": str(exc)})
        return
    await send_json(send, 200, applied.to_dict())
    # The listener may have to restart (token rotated) or stop (disabled);
    # that must not cut this very response, so it happens afterwards.
    bridge._schedule_reconcile()
