"""The SDK's OpenTelemetry middleware runs exactly when a span could be
seen: a configured tracer provider, or a caller's trace context in
``_meta`` (brmcp.server._tracing)."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.server._otel import OpenTelemetryMiddleware

from brmcp.server import Harness, HarnessConfig, _tracing
from brmcp.server._tracing import SpanWhenTraced

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _Ctx:
    def __init__(self, meta: dict[str, Any] | None) -> None:
        self.meta = meta


class _Inner:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        self.calls += 1
        return await call_next(ctx)


async def _next(ctx: Any) -> dict[str, Any]:
    return {"ok": True}


@pytest.mark.parametrize(
    ("meta", "spans"),
    [
        (None, 0),
        ({}, 0),
        ({"brmcp/callKey": "k" * 16}, 0),
        ({"traceparent": "not a trace context"}, 0),
        ({"traceparent": TRACEPARENT}, 1),
    ],
)
async def test_span_only_for_a_caller_trace_context(meta: dict[str, Any] | None, spans: int) -> None:
    inner = _Inner()
    result = await SpanWhenTraced(inner)(_Ctx(meta), _next)  # type: ignore[arg-type]
    assert result == {"ok": True}
    assert inner.calls == spans


async def test_span_always_with_a_tracer_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tracing, "_tracing_configured", lambda: True)
    inner = _Inner()
    assert await SpanWhenTraced(inner)(_Ctx(None), _next) == {"ok": True}  # type: ignore[arg-type]
    assert inner.calls == 1


def test_the_harness_wraps_the_sdk_middleware(tmp_path: Any) -> None:
    harness = Harness(HarnessConfig(data_dir=str(tmp_path)))
    try:
        wrapped = [m for m in harness.server.middleware if isinstance(m, SpanWhenTraced)]
        assert len(wrapped) == 1
        assert isinstance(wrapped[0].inner, OpenTelemetryMiddleware)
        assert not any(isinstance(m, OpenTelemetryMiddleware) for m in harness.server.middleware)
    finally:
        harness._accounts.close()
