"""The metric families of both daemons (see the package docs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..router import Router

__all__ = ["BridgeMetrics", "ServeMetrics"]

#: Latency buckets (seconds): BR round trips take from milliseconds (local)
#: to tens of seconds (relay latency, approvals).
_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _RouterCollector(Collector):
    """BR transport figures read from a :class:`~brmcp.router.Router` at
    scrape time (``router()`` may return None before the daemon started)."""

    def __init__(self, prefix: str, router: Callable[[], Router | None]) -> None:
        self._prefix = prefix
        self._router = router

    def collect(self) -> Iterator[Metric]:
        router = self._router()
        if router is None:
            return
        p = self._prefix
        yield GaugeMetricFamily(
            f"{p}_sessions", "Open BR sessions (MCP over PMs)", value=router.session_count
        )
        yield GaugeMetricFamily(
            f"{p}_reassembly_bytes",
            "Decoded bytes of partial messages waiting for their other parts",
            value=router.assembler.buffered_bytes,
        )
        stats = router.stats
        yield CounterMetricFamily(f"{p}_pms_received", "PMs received", value=stats.pms_received)
        yield CounterMetricFamily(f"{p}_pms_sent", "PMs sent", value=stats.pms_sent)
        yield CounterMetricFamily(
            f"{p}_send_failures", "PMs that could not be sent", value=stats.send_failures
        )
        dropped = CounterMetricFamily(f"{p}_pms_dropped", "Inbound PMs dropped, by reason", labels=["reason"])
        for name in (
            "denied",
            "expired",
            "too_large",
            "buffer_full",
            "part_count",
            "invalid_jsonrpc",
            "unknown_session",
            "session_cap",
        ):
            dropped.add_metric([name], getattr(stats, f"dropped_{name}"))
        yield dropped


class ServeMetrics:
    """The bot's metrics (prefix ``brmcp_serve_``). Tool-call outcomes:
    ``ok``, ``error`` (the handler failed; a paid call is refunded),
    ``payment_required``, ``rate_limited``, ``refused`` (other refusals).
    Tip outcomes: ``credited``, ``not_credited`` (sender not allowed or
    under 1 atom), ``duplicate``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter(
            "brmcp_serve_tool_calls", "Tool calls, by tool and outcome", ["tool", "outcome"], registry=r
        )
        self.call_seconds = Histogram(
            "brmcp_serve_tool_call_seconds", "Tool call latency", ["tool"], buckets=_BUCKETS, registry=r
        )
        self.charged_atoms = Counter(
            "brmcp_serve_charged_atoms", "Atoms charged, by tool", ["tool"], registry=r
        )
        self.refunds = Counter("brmcp_serve_refunds", "Paid calls refunded, by tool", ["tool"], registry=r)
        self.refunded_atoms = Counter(
            "brmcp_serve_refunded_atoms", "Atoms refunded, by tool", ["tool"], registry=r
        )
        self.tips = Counter("brmcp_serve_tips", "Tips received, by outcome", ["outcome"], registry=r)
        self.tip_atoms = Counter("brmcp_serve_tip_atoms", "Atoms credited from tips", registry=r)
        self.errors = Counter("brmcp_serve_errors", "Errors, by kind", ["kind"], registry=r)

    def watch_router(self, router: Callable[[], Router | None]) -> None:
        """Export sessions, reassembly bytes and PM counts of ``router()``."""
        self.registry.register(_RouterCollector("brmcp_serve", router))


class BridgeMetrics:
    """The bridge's metrics (prefix ``brmcp_bridge_``). Tool-call outcomes:
    ``ok``, ``tool_error`` (the bot's result is an error, including a
    payment not made), ``failed`` (transport or bot unreachable). Payment
    outcomes: ``paid``, ``failed`` (the payer failed), ``unknown`` (not
    confirmed within the tip wait; stays pending), ``refused`` (caps,
    denial, approval timeout, policy)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter(
            "brmcp_bridge_tool_calls", "Agent tool calls, by outcome", ["outcome"], registry=r
        )
        self.call_seconds = Histogram(
            "brmcp_bridge_tool_call_seconds",
            "Agent tool call latency (payments included)",
            buckets=_BUCKETS,
            registry=r,
        )
        self.payments = Counter("brmcp_bridge_payments", "Payments, by outcome", ["outcome"], registry=r)
        self.paid_atoms = Counter("brmcp_bridge_paid_atoms", "Atoms paid to bots (confirmed)", registry=r)
        self.errors = Counter("brmcp_bridge_errors", "Errors, by kind", ["kind"], registry=r)
        self.pending_approvals = Gauge(
            "brmcp_bridge_pending_approvals", "Payments waiting for the user's approval", registry=r
        )

    def watch_router(self, router: Callable[[], Router | None]) -> None:
        """Export sessions, reassembly bytes and PM counts of ``router()``."""
        self.registry.register(_RouterCollector("brmcp_bridge", router))

    def watch_pending(self, count: Callable[[], int]) -> None:
        """Read the number of waiting approvals from ``count()`` at scrape time."""
        self.pending_approvals.set_function(lambda: float(count()))
