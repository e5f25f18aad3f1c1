"""What the harness hands on from tool output can never pass for one of its
own answers about money (WIRE.md §Payments, "Genuine refusals"; §Receipts).

* :func:`tool_output`: a result a handler (or, through brmcp/gateway, an
  upstream MCP server) produced, before the harness adds its receipt or
  refund keys: every result ``_meta`` key in the ``brmcp/`` namespace is
  removed and every text content item that would decode as a
  ``payment_required`` refusal is prefixed with
  :data:`~brmcp.protocol.payment.NOT_A_REFUSAL_PREFIX`, whatever ``isError`` says.
* :func:`tool_error`: a tool error the harness writes around a text it did
  not choose (an exception's message, a price function's failure, an output
  schema problem), defused the same way.
* :func:`recorded_outcome`: an outcome replayed for a callKey (from memory
  or from a journal an older version may have written): texts defused and
  the refusal marks removed, so a replay is never a refusal; receipts and
  refund keys, which the harness wrote, stay.
"""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult, TextContent

from brmcp.protocol.payment import (
    MARKS_REFUSALS_KEY,
    REFUSAL_KEY,
    RESERVED_META_PREFIX,
    decodes_as_refusal,
    defuse_refusal_text,
)

__all__ = ["recorded_outcome", "tool_error", "tool_output"]


def _defuse_content(result: CallToolResult) -> list[Any] | None:
    """The content list with refusal-shaped texts defused, or None when no
    item needed it (the result is then passed on as it is)."""
    changed = False
    content: list[Any] = []
    for item in result.content:
        if isinstance(item, TextContent) and decodes_as_refusal(item.text):
            item = item.model_copy(update={"text": defuse_refusal_text(item.text)})
            changed = True
        content.append(item)
    return content if changed else None


def _clean(result: CallToolResult, drop: Any) -> CallToolResult:
    update: dict[str, Any] = {}
    content = _defuse_content(result)
    if content is not None:
        update["content"] = content
    meta = result.meta
    if meta and any(drop(key) for key in meta):
        update["meta"] = {key: value for key, value in meta.items() if not drop(key)} or None
    return result.model_copy(update=update) if update else result


def tool_output(result: CallToolResult) -> CallToolResult:
    """``result`` (tool output) without ``brmcp/`` result ``_meta`` keys and
    with every text item that decodes as a refusal defused (see the module).
    Returns ``result`` itself when nothing needed changing."""
    return _clean(result, lambda key: isinstance(key, str) and key.startswith(RESERVED_META_PREFIX))


def tool_error(text: str) -> CallToolResult:
    """A tool error (``isError``) whose single text item is ``text``,
    defused when it would decode as a refusal."""
    return CallToolResult(content=[TextContent(type="text", text=defuse_refusal_text(text))], is_error=True)


def recorded_outcome(result: CallToolResult) -> CallToolResult:
    """A recorded outcome as it is replayed: without ``brmcp/refusal`` and
    ``brmcp/marksRefusals`` and with refusal-shaped texts defused (receipt
    and refund keys kept). Returns ``result`` itself when nothing changed."""
    return _clean(result, lambda key: key in (REFUSAL_KEY, MARKS_REFUSALS_KEY))
