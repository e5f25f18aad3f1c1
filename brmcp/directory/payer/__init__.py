"""The directory's paying side (docs/directory.md): calls to providers
that pay their refusals as judged by :mod:`brmcp.protocol.listing`, the
registration pipeline (crawl, paid test call, listing) and federation with
peer directories. Imports :mod:`brmcp.directory.model` and
:mod:`brmcp.directory.db`; never the tools or the service."""

from __future__ import annotations

from ._client import (
    MAX_CATALOG_PAGES,
    CallError,
    Payer,
    ProviderClient,
    Timeouts,
    listing_in,
)
from ._federation import (
    Federation,
    Introducer,
    Suggester,
    leads_from,
)
from ._pipeline import (
    Pipeline,
)

__all__ = [
    "MAX_CATALOG_PAGES",
    "CallError",
    "Federation",
    "Introducer",
    "Payer",
    "Pipeline",
    "ProviderClient",
    "Suggester",
    "Timeouts",
    "leads_from",
    "listing_in",
]
