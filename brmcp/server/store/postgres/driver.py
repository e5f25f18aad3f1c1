"""psycopg 3, imported only when a PostgreSQL store is used: a harness on
SQLite runs without it installed."""

from __future__ import annotations

import sys
from types import ModuleType

from ..records import StoreError

__all__ = ["INSTALL_HINT", "is_driver_error", "psycopg"]

#: What to run when the driver is missing.
INSTALL_HINT = 'pip install "brmcp[postgres]"'


def psycopg() -> ModuleType:
    """The ``psycopg`` module. Raises :class:`StoreError` saying how to
    install it when it is missing."""
    try:
        import psycopg as module
    except ImportError as exc:
        raise StoreError(
            f"a postgresql:// store needs psycopg 3, which is not installed ({exc}): {INSTALL_HINT}"
        ) from None
    return module


def is_driver_error(exc: BaseException) -> bool:
    """True for any ``psycopg.Error`` (False, importing nothing, when psycopg
    was never imported)."""
    module = sys.modules.get("psycopg")
    return module is not None and isinstance(exc, module.Error)
