"""The ``brmcp-bridge`` console command: the daemon, and the subcommands that
talk to it over the admin API or edit its files while it is stopped
(BRIDGE.md "Running the daemon", §Admin surface). :func:`main` is the
entry point."""

from __future__ import annotations

from ._main import (
    main,
)
from ._receiptcli import (
    receipt_line,
)
from ._settingsedit import (
    parse_pairs,
)

__all__ = [
    "main",
    "parse_pairs",
    "receipt_line",
]
