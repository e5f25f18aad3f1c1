"""Prometheus metrics of the two daemons (``prometheus-client``).

* :class:`ServeMetrics`: the bot (``brmcp-serve --metrics 127.0.0.1:9464``):
  tool calls by tool and outcome, call latency, atoms charged and refunded,
  tips credited or not, ledger errors, BR sessions and reassembly bytes;
* :class:`BridgeMetrics`: the bridge (``brmcp-bridge --metrics …``): tool
  calls and their latency, payments by outcome and atoms paid, approvals
  waiting, transport errors, BR sessions and reassembly bytes;
* :class:`MetricsEndpoint`: serves one registry at ``/metrics`` on a
  loopback address (the only kind accepted).

Each daemon has its own :class:`prometheus_client.CollectorRegistry`, so
several can run in one process. No metric carries a uid or any secret:
labels are tool names and fixed outcome words.
"""

from .endpoint import MetricsEndpoint
from .registry import BridgeMetrics, ServeMetrics

__all__ = ["BridgeMetrics", "MetricsEndpoint", "ServeMetrics"]
