"""``prices.json``: what each tool of the upstream MCP server costs, and
which tools are hidden (README.md, "Sell an MCP server you already have").

::

    {
      "default": 1000,
      "tools": {
        "get_current_time": "free",
        "convert_time": 2500,
        "debug_dump": "hidden"
      }
    }

* ``tools``: tool name → a whole number of atoms (0 is free), ``"free"``,
  or ``"hidden"`` (absent from tools/list and unknown to tools/call);
* ``default``: the same choices for every tool the upstream lists that is
  not named in ``tools`` (``"hidden"`` makes ``tools`` an allowlist).
  Missing: ``"free"``.

Prices are advertised in each tool's ``_meta`` as ``brmcp/priceAtoms``
exactly as for a native tool (WIRE.md §Payments). Names in ``tools`` that
the upstream does not list are ignored, with a warning in the log naming
the closest tool the upstream does list. An unknown top-level key is
refused, naming the closest known one (a misspelt ``default`` would make
every tool free). The first run writes the file with every tool the
upstream lists at 0 atoms (:func:`prices_template`).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FREE",
    "HIDDEN",
    "PRICES_FILE",
    "PRICES_TEMPLATE",
    "PriceError",
    "PriceTable",
    "load_prices",
    "prices_template",
]

#: The prices file in the data directory.
PRICES_FILE = "prices.json"
#: A tool price: atoms (>= 0) or :data:`HIDDEN`.
FREE = "free"
HIDDEN = "hidden"
#: The first-run ``prices.json`` when the upstream's tools are not known:
#: every tool free until the operator prices it.
PRICES_TEMPLATE = '{\n  "default": "free",\n  "tools": {}\n}\n'
_TOP_KEYS = ("default", "tools")

#: Largest price accepted (an int64 of atoms, as the ledger stores).
_MAX_ATOMS = (1 << 63) - 1

Price = int | str  # atoms, or HIDDEN


class PriceError(ValueError):
    """An invalid ``prices.json``; the one-line message names the file and
    the problem."""


def _parse_price(value: Any, where: str, source: str) -> Price:
    if isinstance(value, str):
        word = value.strip().lower()
        if word == FREE:
            return 0
        if word == HIDDEN:
            return HIDDEN
        raise PriceError(f'{source}: {where}: expected atoms, "free" or "hidden", got {json.dumps(value)}')
    if isinstance(value, bool) or not isinstance(value, int):
        raise PriceError(f'{source}: {where}: expected atoms (a whole number), "free" or "hidden"')
    if not 0 <= value <= _MAX_ATOMS:
        raise PriceError(f"{source}: {where}: atoms must be between 0 and {_MAX_ATOMS}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Parsed ``prices.json``: ``default`` and per-tool ``tools`` entries,
    each atoms (``int``, 0 = free) or ``"hidden"``."""

    default: Price = 0
    tools: dict[str, Price] = field(default_factory=dict)

    def price(self, tool: str) -> int | None:
        """Atoms for one call of ``tool``, or None when it is hidden."""
        value = self.tools.get(tool, self.default)
        return None if value == HIDDEN else int(value)

    @classmethod
    def parse(cls, text: str, *, source: str = PRICES_FILE) -> PriceTable:
        """Parse file text. Raises :class:`PriceError` naming ``source``
        for invalid JSON, a non-object, an unknown top-level key, or a price
        that is not atoms >= 0, ``"free"`` or ``"hidden"``."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise PriceError(f"{source}: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise PriceError(f'{source}: expected a JSON object with "default" and "tools"')
        unknown = sorted(set(data) - set(_TOP_KEYS))
        if unknown:
            # A typo of "default" would make every tool free: refused, not
            # warned (this file is brmcp's own; no Go program writes it).
            close = difflib.get_close_matches(unknown[0].lower(), _TOP_KEYS, n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise PriceError(
                f"{source}: unknown key(s) {', '.join(unknown)}{hint}; the keys are default and tools"
            )
        default = _parse_price(data.get("default", FREE), "default", source)
        raw_tools = data.get("tools", {})
        if raw_tools is None:
            raw_tools = {}
        if not isinstance(raw_tools, dict):
            raise PriceError(f"{source}: tools must be an object mapping tool names to prices")
        tools = {name: _parse_price(value, f'tools["{name}"]', source) for name, value in raw_tools.items()}
        return cls(default=default, tools=tools)


def prices_template(tool_names: Iterable[str]) -> str:
    """The first-run ``prices.json`` naming each of ``tool_names`` (in the
    upstream's order, duplicates dropped) at 0 atoms (free), with
    ``"default": "free"``, so the operator edits prices rather than hunting
    for tool names; two-space indent and a final newline. With no names it
    is :data:`PRICES_TEMPLATE`."""
    names = list(dict.fromkeys(tool_names))
    if not names:
        return PRICES_TEMPLATE
    return (
        json.dumps({"default": FREE, "tools": dict.fromkeys(names, 0)}, indent=2, ensure_ascii=False) + "\n"
    )


def load_prices(path: str | os.PathLike[str]) -> PriceTable:
    """Read ``prices.json``; raises :class:`PriceError` naming the file when
    it is missing, unreadable or invalid."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PriceError(f"{p}: file not found (run brmcp-serve once to create it)") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PriceError(f"{p}: cannot read: {reason}") from None
    return PriceTable.parse(text, source=str(p))
