"""The MCP SDK's OpenTelemetry span per inbound message, only where it can
be seen.

The SDK wraps every request and notification in a span
(``OpenTelemetryMiddleware``, the first entry of ``Server.middleware``). With
no tracer provider configured its tracer is OpenTelemetry's no-op one, whose
span for a message without a W3C trace context in ``_meta`` is the ambient
span itself: entering it changes nothing a handler or an outbound request can
observe, yet it costs a context switch, an attribute dict and a span name per
message. :class:`SpanWhenTraced` runs the SDK's middleware whenever a span
could matter (a configured tracer provider, or a trace context sent by the
caller) and skips it otherwise, so traces are exactly what they were.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerMiddleware, ServerRequestContext
from mcp.server.lowlevel.server import Server
from opentelemetry.trace import ProxyTracerProvider, get_tracer_provider

try:  # private SDK names (mcp 2.3): when they move, the SDK's own path stays
    from mcp.server._otel import OpenTelemetryMiddleware
    from mcp.shared._otel import extract_trace_context
except ImportError:  # pragma: no cover - depends on the installed SDK
    OpenTelemetryMiddleware = None  # type: ignore[assignment,misc]
    extract_trace_context = None  # type: ignore[assignment]

__all__ = ["SpanWhenTraced", "span_only_when_traced"]


def _tracing_configured() -> bool:
    """True when a tracer provider is set (in code, or by the
    ``OTEL_PYTHON_TRACER_PROVIDER`` environment variable, which this loads
    as OpenTelemetry would): the SDK's tracer then records spans."""
    return not isinstance(get_tracer_provider(), ProxyTracerProvider)


class SpanWhenTraced:
    """A context-tier middleware running ``inner`` (the SDK's OpenTelemetry
    middleware) when a tracer provider is configured or the message's
    ``_meta`` carries a valid trace context, and going straight to the rest
    of the chain otherwise (module docstring)."""

    __slots__ = ("inner",)

    def __init__(self, inner: ServerMiddleware[Any]) -> None:
        self.inner = inner

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if _tracing_configured() or (ctx.meta and extract_trace_context(ctx.meta) is not None):
            return await self.inner(ctx, call_next)
        return await call_next(ctx)


def span_only_when_traced(server: Server[Any]) -> None:
    """Wrap each OpenTelemetry middleware of ``server`` (the SDK installs
    one) in :class:`SpanWhenTraced`; other middleware is left as it is.
    Does nothing when the installed SDK no longer has the names this
    relies on (every span then runs, as the SDK does by default)."""
    if OpenTelemetryMiddleware is None or extract_trace_context is None:
        return
    server.middleware = [
        SpanWhenTraced(m) if isinstance(m, OpenTelemetryMiddleware) else m for m in server.middleware
    ]
