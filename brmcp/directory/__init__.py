"""The directory: verified listings of paid brmcp tools (docs/directory.md).

A directory is a brmcp bot that lists a provider only after crawling its
``tools/list`` and making a real paid test call at the provider's expense,
sells search and signed snapshots, introduces callers to listed providers
and federates with peer directories as a customer. The provider's side is
the :class:`~.provider.Registrant`. Shapes shared with Go peers are in
:mod:`.model`; the directory itself is :class:`Directory` (:mod:`._service`), configured by
:class:`DirectoryConfig` and its :class:`Policy`.

The rooms, imports pointing one way: :mod:`.model` (shapes, policy,
snapshot formats, status push) → :mod:`.db` (tables) → :mod:`.payer` (the
directory's paying side: provider calls, pipeline, federation) →
:mod:`.tools` (MCP tool registration) → :mod:`._service` (the composition
root) → :mod:`.cli`. :mod:`.provider` (the bot operator's
:class:`~.provider.Registrant`) stands apart and imports only :mod:`.model`.

The exports below load lazily (PEP 562) so that importing
:mod:`brmcp.directory.provider` loads no directory service.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._service import Directory, DirectoryConfig
    from .model import (
        Policy,
        PolicyError,
        ShapeError,
        Signer,
        Snapshot,
        SnapshotError,
        StatusOut,
        TestSpec,
        load_policy,
        verify_snapshot,
    )
    from .payer import Introducer, Payer, Suggester, Timeouts

#: Where each export is defined (a room of this package).
_HOMES = {
    "Directory": "._service",
    "DirectoryConfig": "._service",
    "Introducer": ".payer",
    "Payer": ".payer",
    "Suggester": ".payer",
    "Timeouts": ".payer",
    "Policy": ".model",
    "PolicyError": ".model",
    "ShapeError": ".model",
    "Signer": ".model",
    "Snapshot": ".model",
    "SnapshotError": ".model",
    "StatusOut": ".model",
    "TestSpec": ".model",
    "load_policy": ".model",
    "verify_snapshot": ".model",
}


def __getattr__(name: str) -> Any:
    """Load an export from its room on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Directory",
    "DirectoryConfig",
    "Introducer",
    "Payer",
    "Policy",
    "PolicyError",
    "ShapeError",
    "Signer",
    "Snapshot",
    "SnapshotError",
    "StatusOut",
    "Suggester",
    "TestSpec",
    "Timeouts",
    "load_policy",
    "verify_snapshot",
]
