"""The provider's side of a directory (docs/directory.md, "The provider
side"): the :class:`Registrant` that registers a bot operator's listing at
directories and funds it, its configuration and fund history, the bounded
line to a directory and the tip payer. Imports :mod:`brmcp.directory.model`
and the layers below the directory, never the directory's service, tables,
payer or tools, so a provider loads no directory service."""

from __future__ import annotations

from ._fundhistory import (
    FUND_FILE,
    FundEntry,
    FundHistory,
)
from ._regconfig import (
    AutoFund,
    RegistrantConfig,
    RegistrantError,
    RegistrationError,
)
from ._registrant import (
    FUND_WINDOW_SECS,
    INVITE_SCHEMA,
    RENEW_AHEAD_SECS,
    Registrant,
)
from ._tippay import (
    ClientTipPayer,
    Payer,
)

__all__ = [
    "FUND_FILE",
    "FUND_WINDOW_SECS",
    "INVITE_SCHEMA",
    "RENEW_AHEAD_SECS",
    "AutoFund",
    "ClientTipPayer",
    "FundEntry",
    "FundHistory",
    "Payer",
    "Registrant",
    "RegistrantConfig",
    "RegistrantError",
    "RegistrationError",
]
