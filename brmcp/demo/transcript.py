"""What ``brmcp demo`` prints: one readable line per MCP message that
crossed the relay (:class:`Trace`, a fabric tap reassembling the PMs), the
tools' advertised prices, a step's relay PMs, and how to connect other
agents when the demo keeps running."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from mcp.types import CallToolResult, TextContent, Tool

from .. import wire
from .._ops.progress import StepPrinter
from ..protocol.payment import CALL_KEY, PRICE_ATOMS_KEY, PRICING_KEY, parse_payment_required

__all__ = ["Trace", "price_text", "print_connect_help", "print_pms", "result_and_notes"]


def price_text(tool: Tool) -> str:
    """A listed tool's advertised price: ``free``, ``<n> atoms``, ``dynamic
    price`` or ``no price advertised`` (WIRE.md §Payments, the price keys)."""
    meta = tool.meta or {}
    if meta.get(PRICING_KEY) == "dynamic":
        return "dynamic price"
    price = meta.get(PRICE_ATOMS_KEY)
    if price == 0:
        return "free"
    if isinstance(price, int | float):
        return f"{int(price)} atoms"
    return "no price advertised"


def _text_of(result: CallToolResult) -> str:
    return "".join(item.text for item in result.content if isinstance(item, TextContent))


def result_and_notes(result: CallToolResult) -> tuple[str, list[str]]:
    """The tool's own text (the first text item) and any further text items
    (notes the bridge adds to what the bot answered, e.g. what it paid)."""
    texts = [item.text for item in result.content if isinstance(item, TextContent)]
    return (texts[0] if texts else ""), texts[1:]


class Trace:
    """Fabric tap (``(from_uid, to_uid, text)``): reassembles the MCP
    messages crossing the relay and keeps one readable line per message
    (with its PM count when it took more than one) for the transcript.
    ``nicks`` names the two users (uid → nick)."""

    def __init__(self, nicks: dict[str, str]) -> None:
        self._nicks = nicks
        self._assembler = wire.Assembler()
        self._methods: dict[tuple[str, str, Any], str] = {}
        self._parts: dict[tuple[str, str, str], int] = {}
        self.lines: list[str] = []

    def take(self) -> list[str]:
        """The lines since the last call (and forget them)."""
        lines, self.lines = self.lines, []
        return lines

    def __call__(self, from_uid: str, to_uid: str, text: str) -> None:
        who = f"{self._nicks.get(from_uid, from_uid[:8])} → {self._nicks.get(to_uid, to_uid[:8])}"
        lines = wire.split_batch(text)
        if lines is not None:
            # One PM carrying several parts (WIRE.md §Batches).
            self.lines.append(f"{who}  batch of {len(lines)} parts in one PM")
            for line in lines:
                self(from_uid, to_uid, line)
            return
        part = wire.parse(text)
        if part is None:
            self.lines.append(f"{who}  chat: {text[:40]!r}")
            return
        key = (from_uid, part.sid, part.mid)
        self._parts[key] = self._parts.get(key, 0) + 1
        try:
            payload = self._assembler.add(from_uid, part, time.time())
        except wire.WireError as exc:
            self.lines.append(f"{who}  dropped part: {exc}")
            return
        if payload is None:
            return
        pms = self._parts.pop(key, 1)
        try:
            message = json.loads(payload)
        except ValueError:
            self.lines.append(f"{who}  non-JSON payload of {len(payload)} bytes")
            return
        summary = self._summarize(from_uid, to_uid, part.sid, message)
        suffix = f"  [{pms} PMs]" if pms > 1 else ""
        self.lines.append(f"{who}  {summary}{suffix}")

    def _summarize(self, from_uid: str, to_uid: str, sid: str, message: Any) -> str:
        if not isinstance(message, dict):
            return "not a JSON-RPC object"
        method = message.get("method")
        raw_params = message.get("params")
        params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        if isinstance(method, str):
            if "id" in message:
                self._methods[(from_uid, sid, json.dumps(message["id"]))] = method
            if method == "initialize":
                return f"initialize (protocol {params.get('protocolVersion')})"
            if method == "tools/call":
                args = json.dumps(params.get("arguments") or {}, separators=(",", ":"))
                key = (params.get("_meta") or {}).get(CALL_KEY)
                return f"tools/call {params.get('name')} {_clip(args, 40)}" + (
                    f" callKey {key}" if key else ""
                )
            return method
        answered = self._methods.pop((to_uid, sid, json.dumps(message.get("id"))), "?")
        if "error" in message:
            error = message.get("error") or {}
            return f"error for {answered}: {error.get('code')} {_clip(str(error.get('message')), 60)}"
        result = message.get("result") or {}
        if answered == "tools/list":
            return f"tools/list result: {len(result.get('tools') or [])} tools with prices in _meta"
        if answered == "initialize":
            info = result.get("serverInfo") or {}
            return f"initialize result: {info.get('name')} {info.get('version')}"
        if answered == "tools/call":
            try:
                call = CallToolResult.model_validate(result)
            except ValueError:
                return "tools/call result (unreadable)"
            refusal = parse_payment_required(call)
            if refusal is not None:
                return (
                    f"payment_required: price {refusal.price_atoms}, balance {refusal.balance_atoms}, "
                    f"shortfall {refusal.shortfall_atoms} atoms"
                )
            kind = "tool error" if call.is_error else "result"
            return f"tools/call {kind}: {_clip(_text_of(call), 60)}"
        return f"{answered} result"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def print_pms(
    printer: StepPrinter, count: int, note: str, lines: list[str], *, extra: dict[str, str] | None = None
) -> None:
    """Print a step's relay PMs: the ``count`` with its ``note``, then one
    line per MCP message (``extra`` inserts a line after the first line
    containing its key; a key no line contains is shown last)."""
    printer.detail(f"relay PMs: {count} ({note})")
    inserts = dict(extra or {})
    for line in lines:
        printer.detail(f"  {line}")
        for marker, text in list(inserts.items()):
            if marker in line:
                printer.detail(f"  {text}")
                del inserts[marker]
    for text in inserts.values():
        printer.detail(f"  {text}")


def print_connect_help(
    printer: StepPrinter, url: str, token: str, name: str, mcp_json: dict[str, Any], bridge_dir: Path
) -> None:
    """How to connect other agents to the bridge that keeps running: the
    endpoint and token, Claude Code, ``.mcp.json``, the MCP Inspector CLI,
    and the bridge's commands against its data directory."""
    p = printer
    p.line()
    p.line("The network and the bridge keep running (Ctrl-C to stop). Connect any MCP agent:")
    p.line(f"  endpoint: {url}")
    p.line(f"  token:    {token}")
    p.line()
    p.line("  Claude Code:")
    p.line(f'    claude mcp add --transport http {name} {url} --header "Authorization: Bearer {token}"')
    p.line("  .mcp.json:")
    for text in json.dumps(mcp_json, indent=2).splitlines():
        p.line(f"    {text}")
    p.line("  MCP Inspector CLI (needs Node.js >= 22; -y lets npx install it without asking):")
    p.line(
        f"    npx -y @modelcontextprotocol/inspector@2.12.0 --cli {url} --transport http "
        f'--header "Authorization: Bearer {token}" --method tools/list'
    )
    p.line()
    p.line(f"  The bridge's data directory is {bridge_dir}; its commands work against it:")
    for command in ("spend", "settings", "approvals", "ui"):
        p.line(f"    brmcp-bridge --datadir {bridge_dir} {command}")
    p.line("  (the demo bridge pays without asking; 'settings set mode=approval' makes it ask, and")
    p.line("  'approvals' or the page from 'ui' then decide each payment)")
    p.line()
