"""The standalone ``brmcp-bridge`` daemon: a :class:`~brmcp.bridge.Bridge`
on a brclient (BRIDGE.md "Running the daemon") and its runtime file."""

from __future__ import annotations

from ._daemon import (
    BOT_CONFIG_NAME,
    BridgeDaemon,
    load_daemon_config,
    resolve_listen,
)
from ._runtime import (
    RUNTIME_FILE,
    read_runtime,
    remove_runtime,
    runtime_stale_reason,
    write_runtime,
)

__all__ = [
    "BOT_CONFIG_NAME",
    "RUNTIME_FILE",
    "BridgeDaemon",
    "load_daemon_config",
    "read_runtime",
    "remove_runtime",
    "resolve_listen",
    "runtime_stale_reason",
    "write_runtime",
]
