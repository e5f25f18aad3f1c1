"""Prometheus metrics of the two daemons (``prometheus-client``).

* :class:`ServeMetrics`: the bot (``brmcp-serve --metrics 127.0.0.1:9464``):
  tool calls by tool and outcome, call latency, atoms charged and refunded,
  tips credited or not, ledger errors, BR sessions and reassembly bytes;
* :class:`BridgeMetrics`: the bridge (``brmcp-bridge --metrics …``): tool
  calls by tool and outcome, their latency, payments by outcome and atoms paid, approvals
  waiting, transport errors, BR sessions and reassembly bytes;
* :class:`MetricsEndpoint`: serves one registry at ``/metrics`` on a
  loopback address (the only kind accepted); :func:`check_listen_address`
  (before a daemon creates anything) and :meth:`MetricsEndpoint.start`
  raise :class:`MetricsListenError`, one line naming the address, when it
  cannot be bound.

Both also export ``brmcp_build_info{version="…",python="…"} 1``. Each
daemon has its own :class:`MetricsRegistry` (a
:class:`prometheus_client.CollectorRegistry` without ``_created`` series),
so several can run in one process. No metric carries a uid or any secret:
labels are tool names and fixed outcome words.
"""

from .endpoint import (
    MetricsEndpoint,
    MetricsListenError,
    cannot_listen,
    check_listen_address,
    metrics_address_problem,
    probe_listen,
)
from .registry import BUILD_INFO, BridgeMetrics, MetricsRegistry, ServeMetrics

__all__ = [
    "BUILD_INFO",
    "BridgeMetrics",
    "MetricsEndpoint",
    "MetricsListenError",
    "MetricsRegistry",
    "ServeMetrics",
    "cannot_listen",
    "check_listen_address",
    "metrics_address_problem",
    "probe_listen",
]
