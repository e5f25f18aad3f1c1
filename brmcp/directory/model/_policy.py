"""The directory's terms: :class:`Policy`, read from ``brmcpdir.json``
(docs/directory.md §Files; karamble/brmcp, ``directory/service.go``
``Policy`` and ``cmd/brmcpdir/main.go`` ``loadPolicy``).

The file is one JSON object with Go's keys, decoded with Go's rules
(:mod:`brmcp._ops.gojson`: keys matched exactly, then case-insensitively;
unknown keys ignored; ``null`` leaves the default). A value that is zero,
negative or absent selects the default, as Go's ``withDefaults`` does.
Unlike Go, an ``admin_uids`` entry that is not a uid (64 lowercase hex
digits, the form brclient shows) is refused: Go would start with an admin
who can never match a caller.

One key is brmcp's own: ``store``, where the harness keeps its book and the
directory's tables (brmcp/server/store/url.py: ``"sqlite:"``, the default,
or a ``postgresql://`` URL). Go ignores it; a value that is not a store URL
is refused, the password redacted in the message.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brmcp._ops import gojson
from brmcp.server.store.url import DEFAULT_STORE, parse_store_url

__all__ = [
    "DEFAULT_CALLS_PER_MINUTE",
    "DEFAULT_EXPIRY_DAYS",
    "DEFAULT_LISTING_FEE_ATOMS",
    "DEFAULT_NAME",
    "DEFAULT_RECRAWL_HOURS",
    "DEFAULT_SNAPSHOT_PRICE_ATOMS",
    "DEFAULT_TEST_BUDGET_MAX_ATOMS",
    "POLICY_FILENAME",
    "Policy",
    "PolicyError",
    "load_policy",
    "policy_template",
]

POLICY_FILENAME = "brmcpdir.json"
DEFAULT_LISTING_FEE_ATOMS = 100_000
DEFAULT_SNAPSHOT_PRICE_ATOMS = 10_000
DEFAULT_EXPIRY_DAYS = 30
#: The harness's rate limit when ``calls_per_minute`` is not set.
DEFAULT_CALLS_PER_MINUTE = 30
DEFAULT_TEST_BUDGET_MAX_ATOMS = 10_000_000
DEFAULT_RECRAWL_HOURS = 24
DEFAULT_NAME = "brmcpdir"

_FIELDS: dict[str, gojson.Kind] = {
    "admin_uids": "strings",
    "listing_fee_atoms": "int64",
    "snapshot_price_atoms": "int64",
    "search_price_atoms": "int64",
    "expiry_days": "int64",
    "calls_per_minute": "int64",
    "test_budget_max_atoms": "int64",
    "recrawl_hours": "int64",
    "name": "string",
    "store": "string",
}


_HEX = frozenset("0123456789abcdef")


class PolicyError(ValueError):
    """``brmcpdir.json`` cannot be used; the one-line message names the
    file, the key, the value and what is allowed."""


@dataclass(frozen=True, slots=True)
class Policy:
    """The directory's terms, defaults applied. Amounts are atoms.

    * ``admin_uids``: uids (64 lowercase hex) that see and call the admin tools;
    * ``listing_fee_atoms``: taken at the start of verification, never refunded;
    * ``snapshot_price_atoms``: the price of ``get_snapshot``;
    * ``search_price_atoms``: the price of ``search`` (0: free);
    * ``expiry_days``: a listing's life after approval or renewal;
    * ``calls_per_minute``: the harness's per-caller rate limit;
    * ``test_budget_max_atoms``: the largest ``test.maxAtoms`` accepted;
    * ``recrawl_hours``: the age of a listing's catalog that triggers a free re-crawl;
    * ``name``: the MCP server name and the name sent with invites;
    * ``store``: the harness's ``store`` URL (``"sqlite:"``: the data
      directory's ``brmcp.sqlite3``; ``postgresql://...``: a PostgreSQL
      database); never shown by ``repr`` (it may hold a password).
    """

    admin_uids: tuple[str, ...] = ()
    listing_fee_atoms: int = DEFAULT_LISTING_FEE_ATOMS
    snapshot_price_atoms: int = DEFAULT_SNAPSHOT_PRICE_ATOMS
    search_price_atoms: int = 0
    expiry_days: int = DEFAULT_EXPIRY_DAYS
    calls_per_minute: int = DEFAULT_CALLS_PER_MINUTE
    test_budget_max_atoms: int = DEFAULT_TEST_BUDGET_MAX_ATOMS
    recrawl_hours: int = DEFAULT_RECRAWL_HOURS
    name: str = DEFAULT_NAME
    store: str = field(default=DEFAULT_STORE, repr=False)
    _admins: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_admins", frozenset(self.admin_uids))

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> Policy:
        """A policy from decoded keys (Go's names); zero, negative or
        missing values select the defaults (``search_price_atoms``: 0)."""

        def positive(key: str, default: int) -> int:
            value = values.get(key)
            return value if isinstance(value, int) and value > 0 else default

        search = values.get("search_price_atoms")
        return cls(
            admin_uids=tuple(values.get("admin_uids") or ()),
            listing_fee_atoms=positive("listing_fee_atoms", DEFAULT_LISTING_FEE_ATOMS),
            snapshot_price_atoms=positive("snapshot_price_atoms", DEFAULT_SNAPSHOT_PRICE_ATOMS),
            search_price_atoms=search if isinstance(search, int) and search > 0 else 0,
            expiry_days=positive("expiry_days", DEFAULT_EXPIRY_DAYS),
            calls_per_minute=positive("calls_per_minute", DEFAULT_CALLS_PER_MINUTE),
            test_budget_max_atoms=positive("test_budget_max_atoms", DEFAULT_TEST_BUDGET_MAX_ATOMS),
            recrawl_hours=positive("recrawl_hours", DEFAULT_RECRAWL_HOURS),
            name=values.get("name") or DEFAULT_NAME,
            store=values.get("store") or DEFAULT_STORE,
        )

    def is_admin(self, uid: str) -> bool:
        return uid in self._admins


def _raw_value(parsed: Any, key: str) -> Any:
    """The value under ``key`` in a :func:`gojson.loads` object, matched as
    Go matches keys (exact, then case-insensitive; the last match wins)."""
    found: Any = None
    for name, value in parsed:
        if name == key or name.casefold() == key.casefold():
            found = value
    return found


def _show(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(p, tuple) for p in value):
        return "{...}"
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, list) else "[...]"
    return text if len(text) <= 60 else text[:57] + "..."


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Read the policy file at ``path``. Raises :class:`PolicyError` (one
    line naming the file, the key, the value and the allowed values) for
    unreadable or invalid JSON, a top level that is not an object, a
    value of the wrong type, an ``admin_uids`` entry that is not 64
    lowercase hex digits, or a ``store`` that is not a store URL (the
    password redacted; :data:`~brmcp.server.store.url.STORE_FORMS`
    allowed); FileNotFoundError when the file is missing
    (the daemon then writes :func:`policy_template`)."""
    where = Path(path)
    try:
        raw = where.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise PolicyError(f"{where}: cannot read: {exc.strerror or exc}") from None
    try:
        parsed = gojson.loads(raw)
    except gojson.GoJSONError as exc:
        raise PolicyError(f"{where}: not valid JSON: {exc}") from None
    if parsed is None:
        return Policy()
    try:
        values = gojson.decode_struct(parsed, _FIELDS, struct="Policy")
    except gojson.GoJSONError as exc:
        message = str(exc)
        if message.startswith('"'):
            key = message[1 : message.index('"', 1)]
            allowed = {
                "strings": "a list of uid strings",
                "string": "a string",
                "int64": "a whole number (0 or less: the default)",
            }[_FIELDS[key]]
            raise PolicyError(
                f'{where}: key "{key}": value {_show(_raw_value(parsed, key))} is not allowed; '
                f"allowed: {allowed}"
            ) from None
        raise PolicyError(
            f"{where}: {message}; allowed: a JSON object with the keys {', '.join(_FIELDS)}"
        ) from None
    for admin in values.get("admin_uids") or ():
        if len(admin) != 64 or not _HEX.issuperset(admin):
            raise PolicyError(
                f'{where}: key "admin_uids": value {_show(admin)} is not allowed; '
                "allowed: Bison Relay uids, 64 lowercase hex digits each"
            )
    store = values.get("store")
    if store:
        try:
            parse_store_url(store)
        except ValueError as exc:
            raise PolicyError(f'{where}: key "store": {exc}') from None
    return Policy.from_values(values)


def policy_template() -> str:
    """The file the daemon writes on its first run: every key at its zero
    value (so the defaults apply), ``admin_uids`` empty, as Go writes it
    (``json.MarshalIndent`` of a zero ``Policy``)."""
    return gojson.dumps(
        {
            "admin_uids": [],
            "listing_fee_atoms": 0,
            "snapshot_price_atoms": 0,
            "search_price_atoms": 0,
            "expiry_days": 0,
            "calls_per_minute": 0,
            "test_budget_max_atoms": 0,
            "recrawl_hours": 0,
            "name": "",
        },
        indent=True,
    )
