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

* ``allow_unlisted``: ``true`` to keep a price for a tool the upstream
  does not list yet (one it adds at runtime). Missing: ``false``.

Prices are advertised in each tool's ``_meta`` as ``brmcp/priceAtoms``
exactly as for a native tool (WIRE.md §Payments). A name in ``tools`` that
the upstream does not list is refused when the gateway starts and when
prices are reloaded (:meth:`PriceTable.check_listed`), naming the closest
tool the upstream does list: a misspelt name would leave the real tool at
``default``, which the first run writes as ``"free"``. With
``allow_unlisted`` it is a warning; a tool the upstream drops while the
gateway runs is a warning too, and its price is kept for its return. An
unknown top-level key is refused, naming the closest known one (a misspelt
``default`` would make every tool free). The first run writes the file
with every tool the upstream lists at 0 atoms (:func:`prices_template`).
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ALLOW_UNLISTED",
    "FREE",
    "HIDDEN",
    "PRICES_FILE",
    "PRICES_TEMPLATE",
    "PriceError",
    "PriceTable",
    "load_prices",
    "prices_template",
    "unlisted_text",
]

#: The prices file in the data directory.
PRICES_FILE = "prices.json"
#: A tool price: atoms (>= 0) or :data:`HIDDEN`.
FREE = "free"
HIDDEN = "hidden"
#: The first-run ``prices.json`` when the upstream's tools are not known:
#: every tool free until the operator prices it.
PRICES_TEMPLATE = '{\n  "default": "free",\n  "tools": {}\n}\n'
#: The key that allows prices for tools the upstream does not list.
ALLOW_UNLISTED = "allow_unlisted"
_TOP_KEYS = ("default", "tools", ALLOW_UNLISTED)

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
    each atoms (``int``, 0 = free) or ``"hidden"``; ``allow_unlisted``;
    ``source``, the file named in errors (not compared)."""

    default: Price = 0
    tools: dict[str, Price] = field(default_factory=dict)
    allow_unlisted: bool = False
    source: str = field(default=PRICES_FILE, compare=False)

    def price(self, tool: str) -> int | None:
        """Atoms for one call of ``tool``, or None when it is hidden."""
        value = self.tools.get(tool, self.default)
        return None if value == HIDDEN else int(value)

    def unlisted(self, listed: Collection[str]) -> list[str]:
        """The names under ``tools`` that are not in ``listed``, sorted."""
        return sorted(name for name in self.tools if name not in listed)

    def check_listed(self, listed: Iterable[str], *, dropped: Collection[str] = ()) -> list[str]:
        """Check ``tools`` against the names the upstream ``listed`` (in its
        order). Raises :class:`PriceError` for a name it does not list,
        naming the file, the key, the closest listed name and the fix,
        unless ``allow_unlisted`` is set or the name is in ``dropped`` (a
        tool the upstream listed earlier and dropped while running).
        Returns the names not listed that were let through."""
        names = list(dict.fromkeys(listed))
        unknown = self.unlisted(set(names))
        refused = [name for name in unknown if name not in dropped]
        if refused and not self.allow_unlisted:
            raise PriceError(unlisted_text(self.source, refused, names, error=True))
        return unknown

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
                f"{source}: unknown key(s) {', '.join(unknown)}{hint}; the keys are default, tools and "
                f"{ALLOW_UNLISTED}"
            )
        default = _parse_price(data.get("default", FREE), "default", source)
        raw_tools = data.get("tools", {})
        if raw_tools is None:
            raw_tools = {}
        if not isinstance(raw_tools, dict):
            raise PriceError(f"{source}: tools must be an object mapping tool names to prices")
        tools = {name: _parse_price(value, f'tools["{name}"]', source) for name, value in raw_tools.items()}
        allow = data.get(ALLOW_UNLISTED, False)
        if not isinstance(allow, bool):
            raise PriceError(f"{source}: {ALLOW_UNLISTED} must be true or false, got {json.dumps(allow)}")
        return cls(default=default, tools=tools, allow_unlisted=allow, source=source)


def unlisted_text(source: str, unknown: Iterable[str], listed: Iterable[str], *, error: bool) -> str:
    """The one line about names under ``tools`` that the upstream does not
    list: each with the closest name it does list, and, for an ``error``,
    the fix (else: that the price is not used while the tool is missing)."""
    names = list(listed)
    keys = []
    hinted = False
    for name in unknown:
        close = difflib.get_close_matches(name, names, n=1)
        hinted = hinted or bool(close)
        keys.append(f'tools["{name}"]' + (f' (did you mean "{close[0]}"?)' if close else ""))
    what = ", ".join(keys)
    if not error:
        return f"{source}: {what}: the upstream lists no such tool, so this price is not used"
    lists = "" if hinted else f" (it lists {_some(names)})"
    return (
        f"{source}: {what}: the upstream lists no such tool{lists}; correct or remove the name, or add "
        f'"{ALLOW_UNLISTED}": true to keep a price for a tool the upstream lists later'
    )


def defaulted_text(prices: PriceTable, names: list[str]) -> str:
    """The one line about tools the upstream lists that ``prices.json``
    does not name (non-empty ``names``): they are sold at ``default``, and
    how to give them a price of their own."""
    price = prices.price(names[0])
    sold = "hidden" if price is None else ("free" if price == 0 else f"{price} atoms a call")
    one = len(names) == 1
    keys = ", ".join(f'"{name}"' for name in names[:8]) + (
        f" and {len(names) - 8} more" if len(names) > 8 else ""
    )
    what = "tool" if one else "tools"
    return (
        f"{prices.source}: the upstream lists {what} {keys} that the file does not name: "
        f"{'not served' if price is None else 'served'} at the default price ({sold}); "
        f'name {"it" if one else "them"} under "tools" to set {"its" if one else "their"} price'
    )


def _some(names: list[str], most: int = 8) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


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
