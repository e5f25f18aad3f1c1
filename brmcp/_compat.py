"""Old module paths, kept importable for one release with a
DeprecationWarning: ``brmcp.router`` is now :mod:`brmcp.transport.router`,
``brmcp.payment`` is :mod:`brmcp.protocol.payment`, and so on
(:data:`MOVED`). Importing an old path returns a thin module that forwards
every attribute to the new one, so classes and constants are the same
objects under both names. Installed by ``import brmcp``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["MOVED", "install"]

#: Old module path → new module path.
MOVED: dict[str, str] = {
    "brmcp.router": "brmcp.transport.router",
    "brmcp.conn": "brmcp.transport.conn",
    "brmcp.sender": "brmcp.transport.sender",
    "brmcp.payment": "brmcp.protocol.payment",
    "brmcp.eras": "brmcp.protocol.eras",
    "brmcp.botlog": "brmcp._ops.botlog",
    "brmcp.lockfile": "brmcp._ops.lockfile",
    "brmcp.bridge.clock": "brmcp._ops.clock",
}


class _Forwarder(types.ModuleType):
    """A module whose attributes are those of ``target``."""

    def __init__(self, name: str, target: types.ModuleType) -> None:
        super().__init__(name, target.__doc__)
        self._target = target
        self.__all__ = list(getattr(target, "__all__", ()))

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._target, attribute)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._target)))


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of :data:`MOVED` (and nothing else)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path goes away in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return _Forwarder(spec.name, importlib.import_module(new))

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
