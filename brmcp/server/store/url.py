"""Which backend holds the harness's book: a ``store`` URL.

* ``sqlite:`` (the default): ``<data_dir>/brmcp.sqlite3`` (:mod:`._schema`);
* ``postgresql://...`` or ``postgres://...``: a PostgreSQL database, a
  libpq connection URI as psycopg 3 takes it
  (``postgresql://user:password@host:5432/dbname``; a Unix-socket
  directory as ``postgresql:///dbname?host=/run/postgresql``). Several
  harness processes, on one machine or several, may share one database as
  one book (:mod:`.postgres`).

A password (in the URI's user part or a ``password=`` parameter) never
leaves :class:`StoreURL` unredacted except to the driver:
:meth:`StoreURL.redacted` and every error message show ``[redacted]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from ..._ops.redact import REDACTED

__all__ = ["DEFAULT_STORE", "STORE_FORMS", "StoreURL", "parse_store_url", "redact_url"]

#: The store a harness uses unless told otherwise.
DEFAULT_STORE = "sqlite:"
#: The forms a ``store`` value may take, as errors name them.
STORE_FORMS = (
    '"sqlite:" (the default: <data_dir>/brmcp.sqlite3) or a PostgreSQL URL '
    '"postgresql://user@host/dbname" ("postgres://" also; "?host=/socket/dir" for a Unix socket)'
)

_PG_SCHEMES = ("postgresql", "postgres")
_PASSWORD_PARAM = re.compile(r"(?i)([?&]password=)[^&#]*")


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed ``store`` value: ``kind`` ``"sqlite"`` or ``"postgresql"``;
    ``conninfo`` the PostgreSQL URI handed to psycopg (empty for SQLite).
    ``repr`` and :meth:`redacted` never show the password."""

    kind: Literal["sqlite", "postgresql"]
    conninfo: str = field(default="", repr=False)

    def redacted(self) -> str:
        """The URL as logs and errors show it: the password replaced by
        ``[redacted]``."""
        return DEFAULT_STORE if self.kind == "sqlite" else redact_url(self.conninfo)

    def __repr__(self) -> str:
        return f"StoreURL({self.redacted()!r})"

    @property
    def password(self) -> str | None:
        """The password the URL carries, percent-decoded as libpq reads
        it, if any (for scrubbing driver messages; never logged)."""
        if self.kind == "sqlite":
            return None
        parts = urlsplit(self.conninfo)
        if parts.password:
            return unquote(parts.password)
        for key, value in parse_qsl(parts.query):
            if key.lower() == "password" and value:
                return value
        return None

    def scrub(self, text: str) -> str:
        """``text`` (a driver's error message) with the password, decoded or
        percent-encoded, replaced by ``[redacted]`` wherever it appears."""
        secret = self.password
        if not secret:
            return text
        for form in sorted({secret, quote(secret, safe=""), quote(secret)}, key=len, reverse=True):
            text = text.replace(form, REDACTED)
        return text


def redact_url(url: str) -> str:
    """``url`` with the password of its user part and of a ``password=``
    query parameter replaced by ``[redacted]``; anything else unchanged."""
    out = _PASSWORD_PARAM.sub(lambda m: m.group(1) + REDACTED, url)
    scheme, sep, rest = out.partition("://")
    if not sep:
        return out
    # The user part ends at the last "@" before the query: a password holding
    # a raw "/" or "@" is still redacted whole.
    query = next((i for i, ch in enumerate(rest) if ch in "?#"), len(rest))
    at = rest.rfind("@", 0, query)
    if at >= 0 and ":" in rest[:at]:
        rest = f"{rest[:at].split(':', 1)[0]}:{REDACTED}{rest[at:]}"
    return f"{scheme}{sep}{rest}"


def parse_store_url(value: object) -> StoreURL:
    """Parse a ``store`` value (see the module docstring).

    Raises :class:`ValueError` with a one-line message naming the value
    (password redacted) and :data:`STORE_FORMS` for anything else: a
    non-string, an unknown scheme, a PostgreSQL URL with a malformed port
    or authority."""
    if not isinstance(value, str):
        raise ValueError(f"a JSON {type(value).__name__} is not a store URL: use {STORE_FORMS}")
    text = value.strip()
    if text in ("sqlite:", "sqlite"):
        return StoreURL("sqlite")
    scheme = text.partition("://")[0].lower() if "://" in text else ""
    if scheme not in _PG_SCHEMES:
        raise ValueError(f"{redact_url(text)!r} is not a store URL: use {STORE_FORMS}")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a malformed port
    except ValueError as exc:
        raise ValueError(
            f"{redact_url(text)!r} is not a valid PostgreSQL URL ({exc}): use {STORE_FORMS}"
        ) from None
    if any(ch in text for ch in "\r\n\x00"):
        raise ValueError(f"{redact_url(text)!r} contains a control character: use {STORE_FORMS}")
    return StoreURL("postgresql", text)
