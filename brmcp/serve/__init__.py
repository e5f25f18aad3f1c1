"""brmcp-serve: the paid-bot daemon. It connects to a running brclient over
clientrpc and serves MCP tools through the brmcp harness: by default the two
example tools ``echo`` (free) and ``fortune`` (10 000 atoms per call), as the
Go reference's ``cmd/brmcp-serve`` does (README §Running a real bot;
docs/interop.md §The pinned reference), or the tools of an upstream MCP
server at the prices of ``prices.json`` (:mod:`brmcp.gateway`). Run it as
``brmcp-serve`` or ``python -m brmcp.serve``; ``examples/serve/mybot.py`` is
the short example program built on the same public API.

* :class:`ServeApp`: the application as an async API (``from_datadir``,
  ``run``, ``reload``, ``harness``), used by the console command and by
  ``brmcp demo``;
* :class:`ServeConfig` and the data-directory helpers;
* :func:`main`: the ``brmcp-serve`` console entry point.
"""

from .app import IMPLEMENTATION_NAME, IMPLEMENTATION_VERSION, ServeApp
from .cli import main
from .config import (
    BOT_CONFIG_NAME,
    DEFAULT_CALLS_PER_MINUTE,
    SERVE_CONFIG_FILE,
    TEMPLATE,
    ServeConfig,
    ServeConfigError,
    bot_config_path,
    default_datadir,
    init_datadir,
    load_serve_config,
    write_serve_config,
)
from .tools import (
    ECHO_DESCRIPTION,
    FORTUNE_DESCRIPTION,
    FORTUNE_PRICE_ATOMS,
    FORTUNES,
    register_tools,
)

__all__ = [
    "BOT_CONFIG_NAME",
    "DEFAULT_CALLS_PER_MINUTE",
    "ECHO_DESCRIPTION",
    "FORTUNES",
    "FORTUNE_DESCRIPTION",
    "FORTUNE_PRICE_ATOMS",
    "IMPLEMENTATION_NAME",
    "IMPLEMENTATION_VERSION",
    "SERVE_CONFIG_FILE",
    "TEMPLATE",
    "ServeApp",
    "ServeConfig",
    "ServeConfigError",
    "bot_config_path",
    "default_datadir",
    "init_datadir",
    "load_serve_config",
    "main",
    "register_tools",
    "write_serve_config",
]
