"""The directory: verified listings of paid brmcp tools (docs/directory.md).

A directory is a brmcp bot that lists a provider only after crawling its
``tools/list`` and making a real paid test call at the provider's expense,
sells search and signed snapshots, introduces callers to listed providers
and federates with peer directories as a customer. The provider's side is
the :class:`Registrant`. Shapes shared with Go peers are in :mod:`.types`;
the directory itself is :class:`Directory` (:mod:`.service`), configured by
:class:`DirectoryConfig` and its :class:`Policy`.
"""

from .client import Payer, Timeouts
from .federation import Introducer, Suggester
from .policy import Policy, PolicyError, load_policy
from .service import Directory, DirectoryConfig
from .snapshot import Signer, Snapshot, SnapshotError, verify_snapshot
from .types import ShapeError, StatusOut, TestSpec

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
