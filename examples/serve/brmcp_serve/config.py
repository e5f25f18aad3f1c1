"""brmcp-serve's data directory: the harness settings ``brmcp.json`` and the
bisonbotkit connection file ``brmcp-serve.conf`` (README §Running a real bot;
docs/interop.md §What is verified).

``brmcp.json`` holds who may call the tools and how often::

    {
      "allowed_uids": [],
      "calls_per_minute": 30
    }

* ``allowed_uids``: Bison Relay uids (64 hex characters; stored lowercased)
  of the callers admitted; empty (or ``null``) refuses everyone.
* ``calls_per_minute``: per-caller rate limit; 0 selects 30.

Other keys (the Go reference's optional ``directory`` block) are ignored.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brmcp.clientrpc import BotConfig, write_bot_config

__all__ = [
    "BOT_CONFIG_NAME",
    "DEFAULT_CALLS_PER_MINUTE",
    "SERVE_CONFIG_FILE",
    "TEMPLATE",
    "ServeConfig",
    "ServeConfigError",
    "bot_config_path",
    "default_datadir",
    "init_datadir",
    "load_serve_config",
    "write_serve_config",
]

log = logging.getLogger("brmcp_serve")

#: The harness settings file in the data directory.
SERVE_CONFIG_FILE = "brmcp.json"
#: bisonbotkit's config name: the file is ``<datadir>/brmcp-serve.conf``.
BOT_CONFIG_NAME = "brmcp-serve"
#: Rate limit used when ``calls_per_minute`` is 0.
DEFAULT_CALLS_PER_MINUTE = 30
#: The first-run ``brmcp.json``, byte for byte as the Go reference writes it
#: (two-space indent, no trailing newline; karamble/brmcp `cmd/brmcp-serve/main.go`;
#: compared byte for byte, docs/interop.md §What is verified).
TEMPLATE = '{\n  "allowed_uids": [],\n  "calls_per_minute": 30\n}'

_UID = re.compile(r"[0-9a-fA-F]{64}")
_INT64_MAX = (1 << 63) - 1


class ServeConfigError(ValueError):
    """A missing, unreadable or invalid brmcp-serve file; the one-line
    message names the file and the problem."""


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """The content of ``brmcp.json``: ``allowed_uids`` (lowercase 64-hex
    uids, in file order, without duplicates) and ``calls_per_minute``
    (0 means the default of 30)."""

    allowed_uids: tuple[str, ...] = ()
    calls_per_minute: int = DEFAULT_CALLS_PER_MINUTE

    @property
    def rate(self) -> int:
        """The calls per minute in force (``calls_per_minute`` or 30 when it is 0)."""
        return self.calls_per_minute or DEFAULT_CALLS_PER_MINUTE

    def to_json(self) -> str:
        """The file text (two-space indent, no trailing newline, as Go's
        ``MarshalIndent``)."""
        return json.dumps(
            {"allowed_uids": list(self.allowed_uids), "calls_per_minute": self.calls_per_minute}, indent=2
        )

    @classmethod
    def parse(cls, text: str, *, source: str = SERVE_CONFIG_FILE) -> ServeConfig:
        """Parse and validate file text. Raises :class:`ServeConfigError`
        naming ``source`` for invalid JSON, a non-object, an ``allowed_uids``
        that is not a list of 64-hex strings, or a ``calls_per_minute`` that
        is not an integer in 0..2**63-1."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ServeConfigError(f"{source}: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ServeConfigError(f"{source}: expected a JSON object, got {_json_type(data)}")
        uids = _parse_uids(data.get("allowed_uids"), source)
        rate = data.get("calls_per_minute", DEFAULT_CALLS_PER_MINUTE)
        if rate is None:
            rate = DEFAULT_CALLS_PER_MINUTE
        if isinstance(rate, bool) or not isinstance(rate, int):
            raise ServeConfigError(f"{source}: calls_per_minute must be an integer, got {_json_type(rate)}")
        if not 0 <= rate <= _INT64_MAX:
            raise ServeConfigError(f"{source}: calls_per_minute must be >= 0 (0 selects 30), got {rate}")
        # "upstream" is brmcp/gateway's (read by brmcp.gateway.load_upstream_block).
        ignored = sorted(set(data) - {"allowed_uids", "calls_per_minute", "upstream"})
        if ignored:
            log.info("%s: ignoring keys this example does not use: %s", source, ", ".join(ignored))
        return cls(allowed_uids=uids, calls_per_minute=rate)


def _parse_uids(value: Any, source: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ServeConfigError(f"{source}: allowed_uids must be a list of uids, got {_json_type(value)}")
    seen: dict[str, None] = {}
    for index, uid in enumerate(value):
        if not isinstance(uid, str) or _UID.fullmatch(uid) is None:
            shown = json.dumps(uid) if len(json.dumps(uid)) <= 80 else json.dumps(uid)[:77] + "..."
            raise ServeConfigError(
                f"{source}: allowed_uids[{index}] {shown} is not a Bison Relay uid (64 hex characters)"
            )
        seen[uid.lower()] = None
    return tuple(seen)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def load_serve_config(path: str | os.PathLike[str]) -> ServeConfig:
    """Read ``brmcp.json``; raises :class:`ServeConfigError` naming the file
    when it is missing, unreadable or invalid."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ServeConfigError(f"{p}: file not found (run brmcp-serve once to create it)") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ServeConfigError(f"{p}: cannot read: {reason}") from None
    return ServeConfig.parse(text, source=str(p))


def write_serve_config(path: str | os.PathLike[str], config: ServeConfig | str) -> None:
    """Write ``brmcp.json`` (a :class:`ServeConfig` or exact text) with mode
    0600, atomically (temporary file + rename). Raises OSError."""
    p = Path(path)
    text = config if isinstance(config, str) else config.to_json()
    tmp = p.with_name(f".{p.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def bot_config_path(datadir: str | os.PathLike[str]) -> Path:
    """``<datadir>/brmcp-serve.conf``."""
    return Path(datadir) / f"{BOT_CONFIG_NAME}.conf"


def default_datadir() -> Path:
    """The Go reference's default: ``~/.brmcp-serve`` (Linux/BSD),
    ``~/Library/Application Support/Brmcp-serve`` (macOS),
    ``%LOCALAPPDATA%\\Brmcp-serve`` (Windows)."""
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Brmcp-serve"
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        return (Path(local) if local else home / "AppData" / "Local") / "Brmcp-serve"
    return home / ".brmcp-serve"


def init_datadir(
    datadir: str | os.PathLike[str],
    *,
    bot_config: BotConfig | None = None,
    allowed_uids: Iterable[str] | None = None,
) -> list[Path]:
    """Create what is missing in ``datadir`` (directory mode 0700): the
    connection file with bisonbotkit's defaults (or ``bot_config``) and
    ``brmcp.json`` as :data:`TEMPLATE` (or listing ``allowed_uids``), both
    mode 0600. Existing files are left alone. Returns the files created.
    Raises OSError, :class:`~brmcp.clientrpc.ClientrpcConfigError` (the
    connection file cannot be written) or :class:`ServeConfigError` (a bad uid)."""
    root = Path(datadir)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    created: list[Path] = []
    conf = bot_config_path(root)
    if not conf.exists():
        write_bot_config(conf, bot_config or BotConfig.defaults(root, BOT_CONFIG_NAME))
        created.append(conf)
    harness_file = root / SERVE_CONFIG_FILE
    if not harness_file.exists():
        if allowed_uids is None:
            write_serve_config(harness_file, TEMPLATE)
        else:
            uids = _parse_uids(list(allowed_uids), "allowed_uids")
            write_serve_config(harness_file, ServeConfig(allowed_uids=uids))
        created.append(harness_file)
    return created
