"""The metric families of both daemons (see the package docs)."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, RestrictedRegistry

from ..transport.router import Router

__all__ = ["BUILD_INFO", "BridgeMetrics", "MetricsRegistry", "ServeMetrics"]

#: The build-info metric of both daemons: ``brmcp_build_info{version, python} 1``.
BUILD_INFO = "brmcp_build_info"
#: Metric types whose prometheus-client samples include a ``<name>_created``
#: series (the creation time of each labelled child).
_WITH_CREATED = frozenset({"counter", "histogram", "summary"})


def _without_created(metrics: Iterable[Metric]) -> Iterator[Metric]:
    for metric in metrics:
        if metric.type in _WITH_CREATED:
            created = metric.name + "_created"
            kept = [sample for sample in metric.samples if sample.name != created]
            if len(kept) != len(metric.samples):
                trimmed = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                trimmed.samples = kept
                metric = trimmed
        yield metric


class _Restricted(RestrictedRegistry):
    """:meth:`MetricsRegistry.restricted_registry`'s view (used for
    ``/metrics?name[]=...``), without ``_created`` series too."""

    def collect(self) -> Iterator[Metric]:
        return _without_created(super().collect())


class MetricsRegistry(CollectorRegistry):
    """A :class:`prometheus_client.CollectorRegistry` that exports no
    ``_created`` series: prometheus-client adds one per counter, histogram
    and summary child (the time it was created), which doubles the series
    and means nothing for these daemons. Only this registry is affected,
    unlike ``prometheus_client.disable_created_metrics()``, which changes
    every registry in the process (a host's own metrics too)."""

    def collect(self) -> Iterator[Metric]:
        return _without_created(super().collect())

    def restricted_registry(self, names: Iterable[str]) -> RestrictedRegistry:
        return _Restricted(names, self)


def _build_info(registry: CollectorRegistry) -> None:
    """``brmcp_build_info{version="<brmcp version>",python="<x.y.z>"} 1``."""
    from .. import __version__

    info = Info("brmcp_build", "brmcp version and Python version of this daemon", registry=registry)
    info.info({"version": __version__, "python": platform.python_version()})


#: Latency buckets (seconds): BR round trips take from milliseconds (local)
#: to tens of seconds (relay latency, approvals).
_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _RouterCollector(Collector):
    """BR transport figures read from a :class:`~brmcp.transport.Router` at
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
        yield CounterMetricFamily(
            f"{p}_notifications_dropped",
            "Notifications whose PM could not be sent (dropped; their session kept open)",
            value=stats.notifications_dropped,
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
    """The bot's metrics (prefix ``brmcp_serve_``, plus ``brmcp_build_info``).
    Tool-call outcomes: ``ok``, ``error`` (the handler failed; a paid call
    is refunded), ``payment_required``, ``rate_limited``, ``refused`` (other
    refusals). Tip outcomes: ``credited``, ``not_credited`` (sender not
    allowed or under 1 atom), ``duplicate``. Counters end in ``_total`` and
    export no ``_created`` series (:class:`MetricsRegistry`)."""

    def __init__(self) -> None:
        self.registry = MetricsRegistry(auto_describe=True)
        r = self.registry
        _build_info(r)
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
    """The bridge's metrics (prefix ``brmcp_bridge_``, plus
    ``brmcp_build_info``). ``calls`` (``brmcp_bridge_tool_calls_total``) is
    labelled by ``tool`` (the tool name the agent called) and ``outcome``:
    ``ok``, ``tool_error`` (the bot's result is an error, including a
    payment not made), ``failed`` (transport or bot unreachable); count one
    call with ``calls.labels(tool, outcome).inc()``. Payment outcomes:
    ``paid``, ``failed`` (the payer failed), ``unknown`` (not confirmed
    within the tip wait; stays pending), ``refused`` (caps, denial, approval
    timeout, policy). Counters end in ``_total`` and export no ``_created``
    series (:class:`MetricsRegistry`)."""

    def __init__(self) -> None:
        self.registry = MetricsRegistry(auto_describe=True)
        r = self.registry
        _build_info(r)
        self.calls = Counter(
            "brmcp_bridge_tool_calls",
            "Agent tool calls, by tool and outcome",
            ["tool", "outcome"],
            registry=r,
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
