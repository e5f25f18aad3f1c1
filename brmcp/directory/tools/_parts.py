"""What the directory's tools use of the running directory: the narrow
:class:`DirectoryParts`, which :class:`brmcp.directory._service.Directory`
satisfies. The tools type against it so that the service, which registers
the tools, is the only module that imports both (imports point one way).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from brmcp._ops.clock import Clock
    from brmcp.server import Harness

    from ..db import AdminLog, DirectoryStore
    from ..model import Policy, Signer
    from ..payer import Federation, Pipeline, Suggester

__all__ = ["ConfigParts", "DirectoryParts"]


class ConfigParts(Protocol):
    """The part of the directory's configuration a tool reads."""

    @property
    def suggester(self) -> Suggester | None:
        """KX suggestions for ``introduce`` (None: the tool refuses)."""


class DirectoryParts(Protocol):
    """The running directory as its tools see it: its database, policy,
    clock, signer, harness, payer pipeline, federation and admin log."""

    @property
    def config(self) -> ConfigParts:
        """The configuration the directory was started with."""

    @property
    def store(self) -> DirectoryStore:
        """The directory's tables."""

    @property
    def policy(self) -> Policy:
        """The operator's policy (fees, limits, prices)."""

    @property
    def clock(self) -> Clock:
        """The directory's clock (unix seconds)."""

    @property
    def signer(self) -> Signer:
        """The snapshot signing key."""

    @property
    def harness(self) -> Harness:
        """The MCP harness the tools are registered on."""

    @property
    def pipeline(self) -> Pipeline:
        """The registration pipeline (crawl, test call, listing)."""

    @property
    def federation(self) -> Federation:
        """Introductions and leads to other directories."""

    @property
    def admin_log(self) -> AdminLog:
        """The operator's admin action log."""

    @property
    def public_key(self) -> str:
        """The snapshot key's public half, hex."""

    def self_uid(self) -> str | None:
        """The directory's own client uid, once known."""
