"""Keep credentials out of logs at the source (SECURITY.md "Secrets").

Third-party libraries log HTTP headers at debug level: websockets writes
every handshake header (``> Authorization: Basic …``, which is
``rpcuser:rpcpass`` in base64) to its logger. Filters on handlers would
miss handlers a host adds later, so the loggers we hand those libraries
are wrapped here and the values of credential-carrying headers are
replaced before a record is ever created.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["REDACTED", "SENSITIVE_HEADERS", "RedactingLogger", "redact_headers"]

#: What a credential's value is replaced with in a log line.
REDACTED = "[redacted]"

#: Header names (lowercase) whose values are credentials: clientrpc Basic auth,
#: the bridge's bearer and admin tokens, cookies.
SENSITIVE_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``headers`` with the values of :data:`SENSITIVE_HEADERS`
    (any case) replaced by :data:`REDACTED`."""
    return {k: (REDACTED if k.lower() in SENSITIVE_HEADERS else v) for k, v in headers.items()}


class RedactingLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger adapter for libraries that log header lines as
    ``logger.debug("> %s: %s", name, value)`` (websockets' client and
    server): the value of a sensitive header is replaced by
    :data:`REDACTED`; every other record passes unchanged. Pass it as the
    library's ``logger=`` argument."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        if len(args) >= 2 and isinstance(args[0], str) and args[0].strip().lower() in SENSITIVE_HEADERS:
            args = (args[0], REDACTED, *args[2:])
        elif isinstance(msg, str) and _mentions_secret_header(msg):
            msg, args = REDACTED, ()
        self.logger.log(level, msg, *args, **kwargs)


def _mentions_secret_header(msg: str) -> bool:
    """A preformatted line such as ``> Authorization: Basic …``."""
    head = msg.lstrip("<> ").split(":", 1)[0].strip().lower()
    return ":" in msg and head in SENSITIVE_HEADERS
