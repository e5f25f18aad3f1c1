"""What a peer is told when a tool fails (WIRE.md §Errors, "Internal
errors"): a deliberate refusal keeps its own text; any other exception is an
internal error, answered with a short fixed text naming the tool and a ref,
while the operator's log gets one line with the same ref and the traceback.

Python's own exception text (paths, SQL, library internals) never reaches a
peer: it helps no caller and tells an attacker how the server is built.
"""

from __future__ import annotations

import logging
import secrets

from mcp.shared.exceptions import MCPError

log = logging.getLogger("brmcp.server")


class ToolRefusal(ValueError):
    """Raised by a tool handler to refuse a call with ``str(exc)`` as the
    peer-visible text (a documented, deliberate answer, not a fault)."""


def is_deliberate(exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal its raiser meant the peer to read:
    :class:`ToolRefusal`, an :class:`~mcp.shared.exceptions.MCPError`, a
    plain ``ValueError`` (the handlers' refusal idiom), or a ``ValueError``
    subclass brmcp defines. Python's own ``ValueError`` subclasses
    (``UnicodeError``, ``json.JSONDecodeError``, ``binascii.Error``) and every
    other exception are unexpected."""
    if isinstance(exc, (ToolRefusal, MCPError)) or type(exc) is ValueError:
        return True
    return isinstance(exc, ValueError) and type(exc).__module__.startswith("brmcp.")


def internal_error_text(tool: str, exc: BaseException, logger: logging.Logger | None = None) -> str:
    """Log ``exc`` once (level error, with its traceback and a fresh 8-hex
    ref) on ``logger`` (default ``brmcp.server``) and return the text a peer
    gets instead: ``internal error in tool <tool>; the operator's log has the
    details (ref <ref>)``."""
    ref = secrets.token_hex(4)
    (logger or log).error("internal error in tool %s (ref %s)", tool, ref, exc_info=exc)
    return f"internal error in tool {tool}; the operator's log has the details (ref {ref})"


def peer_error_text(tool: str, exc: BaseException, logger: logging.Logger | None = None) -> str:
    """The text a peer gets for ``exc`` raised by ``tool``: its own text
    (or its class name when empty) when :func:`is_deliberate`, else
    :func:`internal_error_text`."""
    if is_deliberate(exc):
        if isinstance(exc, MCPError):
            return exc.error.message
        return str(exc) or type(exc).__name__
    return internal_error_text(tool, exc, logger)
