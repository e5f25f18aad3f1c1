"""The bridge's own MCP endpoint for agents, ``/mcp/discover`` (BRIDGE.md
§Finding bots through directories, "Agents discover, users decide").

Served by the bridge itself (never relayed to a bot) with the MCP SDK's
low-level server and streamable-HTTP session manager, behind the same gate
as ``/mcp/<bot uid>`` (:mod:`.http`: loopback Host and Origin, the agents'
bearer token, methods, content type, body limit, no batches). Its tools:

``find_tools`` ``{query, tags?, maxPriceAtoms?}``
    every configured directory's ``search``, merged: the
    :meth:`~.discovery.FindResult.to_dict` object of
    :meth:`~.discovery.Discovery.find`. A priced search is an ordinary paid
    call through the bot path, under the caps and approval mode, exactly as
    ``brmcp-bridge find``.
``provider_details`` ``{uid}``
    each configured directory's ``get_provider`` answer for ``uid``, shown as
    that directory's claims (:meth:`~.discovery.Discovery.provider_details`).
``request_bot`` ``{uid, reason?, via?}``
    parks an add-bot request for the user (:mod:`.botrequests`) and waits
    for the decision: approved, denied or timed out (text plus
    ``structuredContent`` :meth:`~.botrequests.BotRequestAnswer.to_dict`).

Arguments are checked here: a key a tool does not take, a uid that is not 64
hex, a reason over :data:`~.botrequests.MAX_REASON_CHARS` characters or with
characters that do not print, or a value of the wrong type is refused with
a one-line tool error naming what to fix. Nothing an agent sends here can
change a setting other than through the user's approval of one uid.

An agent whose ``request_bot`` POST connection closes before its answer was
written withdraws its wait at once (this endpoint does not resume streams);
so does one that cancels the call or ends its session.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

import anyio
import anyio.abc
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)
from starlette.types import Message, Receive, Scope, Send

from brmcp.bridge.base import header_values, is_uid
from brmcp.bridge.find import (
    MAX_REASON_CHARS,
    BotRequestQueue,
    BotRequestRefused,
    Discovery,
    DiscoveryError,
    find_args,
)
from brmcp.bridge.links import agent_session_id
from brmcp.protocol.toolerrors import internal_error_text, peer_error_text

__all__ = ["DISCOVER_PATH", "MAX_GONE", "AgentDiscovery", "AgentDiscoveryHost", "discovery_tools"]

log = logging.getLogger("brmcp.bridge")

#: The endpoint's path.
DISCOVER_PATH = "/mcp/discover"
#: Calls remembered as gone before their handler started (oldest forgotten first).
MAX_GONE = 256
#: Seconds an idle agent session of this endpoint is kept.
SESSION_IDLE_TIMEOUT = 3600.0

_USER_DECIDES = (
    " Nothing here adds a bot or changes a spending cap: only the bridge's user decides, with "
    "their own tools."
)


def discovery_tools() -> list[Tool]:
    """The three tools of ``/mcp/discover`` with their input schemas."""
    uid = {"type": "string", "pattern": "^[0-9a-fA-F]{64}$", "description": "a 64-hex Bison Relay uid"}
    return [
        Tool(
            name="find_tools",
            description=(
                "Search the tool directories the user configured for bots offering tools. Answers each "
                "hit with the directories that listed it (their claims: price, tags, when they last "
                "verified it). A directory that charges for search is paid within the user's spending "
                "caps, and in approval mode only after the user approves." + _USER_DECIDES
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "query": {"type": "string", "maxLength": 256},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 16},
                    "maxPriceAtoms": {"type": "integer", "minimum": 0},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        ),
        Tool(
            name="provider_details",
            description=(
                "What each configured directory says about one provider bot: its description, tags, "
                "catalog and verification times. These are the directories' claims; the bot's own "
                "tool list and prices bind once the user added it." + _USER_DECIDES
            ),
            input_schema={
                "type": "object",
                "properties": {"uid": uid},
                "required": ["uid"],
                "additionalProperties": False,
            },
        ),
        Tool(
            name="request_bot",
            description=(
                "Ask the user to let you call one bot through this bridge. The user decides: the call "
                "waits for their decision (up to the bridge's approval timeout) and answers approved, "
                "denied or timed out. Approval adds only that bot; it never raises a spending cap. "
                "Give a short reason (at most 200 characters) the user will read."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "uid": uid,
                    "reason": {"type": "string", "maxLength": MAX_REASON_CHARS},
                    "via": {**uid, "description": "the directory that should introduce the bot"},
                },
                "required": ["uid"],
                "additionalProperties": False,
            },
        ),
    ]


class AgentDiscoveryHost(Protocol):
    """What the endpoint needs from the bridge (the :class:`~brmcp.bridge.Bridge`)."""

    @property
    def discovery(self) -> Discovery: ...

    @property
    def bot_requests(self) -> BotRequestQueue: ...

    def _task_group(self) -> anyio.abc.TaskGroup: ...


class _Refused(Exception):
    """A tool call refused before it did anything (one line for the agent)."""


def _error(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def _answer(value: dict[str, Any], text: str | None = None) -> CallToolResult:
    body = text if text is not None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return CallToolResult(content=[TextContent(type="text", text=body)], structured_content=value)


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True)[:80]


def _only(tool: str, arguments: dict[str, Any], keys: set[str]) -> None:
    unknown = sorted(set(arguments) - keys)
    if unknown:
        raise _Refused(f"{tool}: unknown key {unknown[0][:40]!r}; keys: {', '.join(sorted(keys))}")


def _uid(tool: str, arguments: dict[str, Any], key: str, *, optional: bool = False) -> str | None:
    value = arguments.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not is_uid(value):
        raise _Refused(f"{tool}: {key} {_shown(value)} is not a 64-hex Bison Relay uid")
    return value.lower()


def _reason(arguments: dict[str, Any]) -> str:
    value = arguments.get("reason")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Refused(f"request_bot: reason {_shown(value)} must be a string")
    if len(value) > MAX_REASON_CHARS:
        raise _Refused(f"request_bot: reason has {len(value)} characters; at most {MAX_REASON_CHARS}")
    if not all(ch.isprintable() for ch in value):
        raise _Refused("request_bot: reason holds control or other non-printing characters; send plain text")
    return value


def _agent_name(ctx: ServerRequestContext[Any]) -> str:
    params = ctx.session.client_params
    info = getattr(params, "client_info", None)
    name = getattr(info, "name", "")
    version = getattr(info, "version", "")
    text = f"{name} {version}".strip() if isinstance(name, str) and isinstance(version, str) else ""
    return text


def _call_key(session: str | None, request_id: Any) -> tuple[str, str]:
    return (session or "", json.dumps(request_id))


class AgentDiscovery:
    """The ``/mcp/discover`` endpoint of one bridge (``host``): an SDK
    server (:attr:`server`) and its session manager, started on first use in
    the bridge's task group. ``max_body_bytes`` is the request body limit
    (the gate checked it already; the SDK checks it again)."""

    def __init__(self, host: AgentDiscoveryHost, *, max_body_bytes: int) -> None:
        self._host = host
        self._max_body = max_body_bytes
        self.server: Server[Any] = Server(
            "brmcp-discover",
            version="1",
            instructions=(
                "Find bots through the user's tool directories and ask the user to add one. The user "
                "decides every addition; spending caps are theirs alone."
            ),
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
        )
        self._manager: StreamableHTTPSessionManager | None = None
        self._stop = anyio.Event()
        self._lock = anyio.Lock()
        #: (agent session, JSON request id) → the cancel scope of a waiting request_bot.
        self._waits: dict[tuple[str, str], anyio.CancelScope] = {}
        #: Calls whose connection closed before their handler registered.
        self._gone: dict[tuple[str, str], None] = {}

    # -- tools ---------------------------------------------------------------------

    async def _on_list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=discovery_tools())

    async def _on_call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        arguments = dict(params.arguments or {})
        try:
            if params.name == "find_tools":
                return await self._find(arguments)
            if params.name == "provider_details":
                _only("provider_details", arguments, {"uid"})
                uid = _uid("provider_details", arguments, "uid")
                assert uid is not None
                details = await self._host.discovery.provider_details(uid)
                return _answer(details)
            if params.name == "request_bot":
                return await self._request_bot(ctx, arguments)
        except _Refused as exc:
            return _error(str(exc))
        except DiscoveryError as exc:
            return _error(str(exc))
        except Exception as exc:
            # The SDK would send str(exc); an agent gets the short text, the
            # operator's log the traceback (WIRE.md §Errors).
            return _error(internal_error_text(params.name[:64], exc, log))
        return _error(f'unknown tool "{params.name[:64]}"; tools: find_tools, provider_details, request_bot')

    async def _find(self, arguments: dict[str, Any]) -> CallToolResult:
        if "query" not in arguments:
            raise _Refused("find_tools: query is required (words to look for in tool names and descriptions)")
        query, tags, price = find_args(arguments)
        found = await self._host.discovery.find(query, tags=tags, max_price_atoms=price)
        return _answer(found.to_dict())

    async def _request_bot(self, ctx: ServerRequestContext[Any], arguments: dict[str, Any]) -> CallToolResult:
        _only("request_bot", arguments, {"uid", "reason", "via"})
        uid = _uid("request_bot", arguments, "uid")
        assert uid is not None
        reason = _reason(arguments)
        via = _uid("request_bot", arguments, "via", optional=True)
        key = _call_key(agent_session_id(ctx), ctx.request_id)
        if self._gone.pop(key, "live") is None:
            return _error("request_bot: the agent's connection closed; nothing was asked")
        with anyio.CancelScope() as scope:
            self._waits[key] = scope
            try:
                answer = await self._host.bot_requests.request(
                    uid, reason=reason, via=via, agent=_agent_name(ctx)
                )
            except BotRequestRefused as exc:
                return _error(f"request_bot: {exc}")
            except ValueError as exc:
                return _error(f"request_bot: {peer_error_text('request_bot', exc, log)}")
            finally:
                self._waits.pop(key, None)
            return _answer(answer.to_dict(), answer.text)
        return _error("request_bot: the agent went away; its wait was withdrawn")

    # -- HTTP ---------------------------------------------------------------------

    async def _ensure(self) -> StreamableHTTPSessionManager:
        if self._manager is not None:
            return self._manager
        async with self._lock:
            if self._manager is None:
                manager = StreamableHTTPSessionManager(
                    self.server,
                    json_response=False,
                    stateless=False,
                    session_idle_timeout=SESSION_IDLE_TIMEOUT,
                    max_request_body_size=self._max_body,
                )
                stop = anyio.Event()
                await self._host._task_group().start(self._run, manager, stop)
                self._manager, self._stop = manager, stop
            return self._manager

    @staticmethod
    async def _run(
        manager: StreamableHTTPSessionManager, stop: anyio.Event, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        started = False
        try:
            async with manager.run():
                task_status.started()
                started = True
                await stop.wait()
        except Exception:
            if not started:
                raise
            log.exception("bridge: the discovery endpoint's session manager failed")

    def drop(self) -> None:
        """End every agent session of the endpoint (token rotated, bridge
        disabled or closing); the next request starts afresh."""
        self._manager = None
        self._stop.set()

    async def handle(
        self, scope: Scope, receive: Receive, send: Send, message: dict[str, Any] | None
    ) -> None:
        """Serve one request the gate let through (``message``: the parsed
        POST body, None for GET and DELETE). A ``tools/call`` whose
        connection closes before its answer was written withdraws its wait."""
        manager = await self._ensure()
        if scope.get("method") != "POST" or message is None or message.get("method") != "tools/call":
            await manager.handle_request(scope, receive, send)
            return
        finished = False

        async def watch(event: Message) -> None:
            nonlocal finished
            if event["type"] == "http.response.body" and not event.get("more_body", False):
                finished = True
            await send(event)

        try:
            await manager.handle_request(scope, receive, watch)
        finally:
            sessions = header_values(scope, b"mcp-session-id")
            if not finished and "id" in message:
                key = _call_key(sessions[0].decode("latin-1") if len(sessions) == 1 else None, message["id"])
                wait = self._waits.get(key)
                if wait is not None:
                    log.info("agent connection closed during request_bot: its wait is withdrawn")
                    wait.cancel()
                else:
                    self._gone[key] = None
                    while len(self._gone) > MAX_GONE:
                        self._gone.pop(next(iter(self._gone)))
