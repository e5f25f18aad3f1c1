"""The ``brmcp-bridge`` console command: the daemon, and the subcommands that
talk to it over the admin API or edit its files while it is stopped
(BRIDGE.md "Running the daemon", §Admin surface). :func:`main` is the
entry point.

:func:`receipt_line` is loaded on first use (PEP 562): its module imports
the directory client and the MCP SDK, which ``--version`` and the commands
that only talk to the daemon do not need."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._main import (
    main,
)
from ._settingsedit import (
    parse_pairs,
)

if TYPE_CHECKING:
    from ._receiptcli import (
        receipt_line,
    )

__all__ = [
    "main",
    "parse_pairs",
    "receipt_line",
]


def __getattr__(name: str) -> Any:
    """Import :func:`receipt_line` on first use (PEP 562); raises
    AttributeError for a name this package does not export."""
    if name != "receipt_line":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ._receiptcli import receipt_line

    return receipt_line


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
