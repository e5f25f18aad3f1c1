"""The standalone ``brmcp-bridge`` daemon: a :class:`~brmcp.bridge.Bridge`
on a brclient (BRIDGE.md "Running the daemon") and its runtime file.

The names are loaded on first use (PEP 562): the ``brmcp-bridge`` commands
that only read the runtime file must not import the whole bridge."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

#: Exported name → the module (in this package) that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("BOT_CONFIG_NAME", "BridgeDaemon", "load_daemon_config", "resolve_listen"), "._daemon"),
    **dict.fromkeys(
        ("RUNTIME_FILE", "read_runtime", "remove_runtime", "runtime_stale_reason", "write_runtime"),
        "._runtime",
    ),
}


def __getattr__(name: str) -> Any:
    """Import the module defining ``name`` on first use (PEP 562); raises
    AttributeError for a name this package does not export."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
