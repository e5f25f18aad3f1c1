"""Sell an existing MCP server over Bison Relay without writing code.

The gateway opens one MCP client session to an upstream server (a stdio
command or a streamable-HTTP URL, any language) with the official SDK and
serves what it declares through a :class:`~brmcp.server.Harness`: tools at
the prices of ``prices.json`` (allowlist, rate limit, prepaid ledger,
callKey, journal and crash safety exactly as for native tools), plus its
resources, templates, prompts and completions, free.

* :class:`Gateway`: ties an upstream to a harness;
* :class:`UpstreamConfig`: how to reach the upstream (``upstream`` block of
  ``brmcp.json``, or ``brmcp-serve --upstream`` / ``--upstream-url``);
* :class:`PriceTable` / :func:`load_prices`: ``prices.json``;
* :class:`Upstream`: the kept-alive client session (restart with backoff).
"""

from .config import (
    CALLER_UID_KEY,
    DEFAULT_CALL_TIMEOUT,
    PASSTHROUGH_ENV,
    UpstreamConfig,
    UpstreamConfigError,
    load_upstream_block,
    parse_env_option,
    parse_header_env,
    read_headers_file,
)
from .gateway import Gateway, GatewayError, list_upstream_tools
from .prices import (
    ALLOW_UNLISTED,
    FREE,
    HIDDEN,
    PRICES_FILE,
    PRICES_TEMPLATE,
    PriceError,
    PriceTable,
    load_prices,
    prices_template,
)
from .tools import UpstreamToolSpec
from .upstream import Upstream, UpstreamStartError, UpstreamUnavailable

__all__ = [
    "ALLOW_UNLISTED",
    "CALLER_UID_KEY",
    "DEFAULT_CALL_TIMEOUT",
    "FREE",
    "HIDDEN",
    "PASSTHROUGH_ENV",
    "PRICES_FILE",
    "PRICES_TEMPLATE",
    "Gateway",
    "GatewayError",
    "PriceError",
    "PriceTable",
    "Upstream",
    "UpstreamConfig",
    "UpstreamConfigError",
    "UpstreamStartError",
    "UpstreamToolSpec",
    "UpstreamUnavailable",
    "list_upstream_tools",
    "load_prices",
    "load_upstream_block",
    "parse_env_option",
    "parse_header_env",
    "prices_template",
    "read_headers_file",
]
