"""Logging for the console daemons (``brmcp-serve``, ``brmcp-bridge``), set up
from the logging keys of their bisonbotkit config file the way a bisonbotkit
bot sets up its log backend (docs/clientrpc.md §Bot config file):

* ``debug``: comma-separated items. A bare level word sets the threshold of
  every logger; ``name=level`` sets one Python logger, e.g.
  ``info,brmcp.clientrpc=debug`` (bisonbotkit's Go subsystem names such as
  ``RPC`` name no logger here and change nothing). Level words are decred
  slog's, without case: ``trace``/``trc`` and ``debug``/``dbg`` (both Python
  DEBUG: Python has no trace level), ``info``/``inf``, ``warn``/``wrn``/``warning``,
  ``error``/``err``, ``critical``/``crt`` and ``off`` (nothing is logged).
  Empty means ``info``; an unknown word is logged as a warning and means
  ``info`` (bisonbotkit takes it silently as info).
* ``logfile``: when not empty, every record also goes to this file (``~``
  expanded; missing directories are created with mode 0700, the file with
  mode 0600). It is rotated when it grows past 1 MiB, keeping ``maxlogfiles``
  rotated files ``<logfile>.1`` … ``<logfile>.N`` beside the current one
  (≤ 0 means 5), like bisonbotkit's rotator (1024 kB, ``maxlogfiles`` rolls).
* ``maxbufferlines``: the size of bisonbotkit's in-memory buffer of recent
  lines, which a bot with a user interface shows; a headless daemon has no
  such view, so the key is accepted and ignored.

Unknown keys of the config file are logged as warnings with their line
numbers once the handlers are in place (:meth:`BotConfig.unknown_key_warnings`).

Records always go to stderr as well. A command-line level (``--log-level``)
replaces the whole ``debug`` value.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from io import TextIOWrapper
from pathlib import Path
from typing import Protocol, TextIO

__all__ = [
    "DEFAULT_MAX_LOG_FILES",
    "LEVEL_CHOICES",
    "LEVEL_WORDS",
    "LOG_FORMAT",
    "LOG_ROTATE_BYTES",
    "OFF",
    "LogPlan",
    "LogSettings",
    "LogSetupError",
    "bot_logging",
    "parse_level",
    "plan_logging",
]

log = logging.getLogger("brmcp.botlog")


class LogSettings(Protocol):
    """The logging keys of a bot config file (a :class:`brmcp.clientrpc.BotConfig`;
    a protocol so that this module, below clientrpc, does not import it)."""

    @property
    def debug(self) -> str: ...

    @property
    def logfile(self) -> str: ...

    @property
    def maxlogfiles(self) -> int: ...

    def unknown_key_warnings(self, source: str) -> list[str]: ...


#: A threshold above every level Python defines: nothing is logged.
OFF = logging.CRITICAL + 10
#: slog's level words (lowercase) and their Python levels.
LEVEL_WORDS: dict[str, int] = {
    "trace": logging.DEBUG,
    "trc": logging.DEBUG,
    "debug": logging.DEBUG,
    "dbg": logging.DEBUG,
    "info": logging.INFO,
    "inf": logging.INFO,
    "warn": logging.WARNING,
    "wrn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "err": logging.ERROR,
    "critical": logging.CRITICAL,
    "crt": logging.CRITICAL,
    "off": OFF,
}
#: The log file is rotated when it grows past this many bytes (bisonbotkit: 1024 kB).
LOG_ROTATE_BYTES = 1024 * 1024
#: Rotated files kept when ``maxlogfiles`` is unset (bisonbotkit's default).
DEFAULT_MAX_LOG_FILES = 5
#: One line per record, on stderr and in the file.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogSetupError(Exception):
    """The log file or its directory cannot be created or opened; the one-line
    message names the path."""


#: The level words a ``--log-level`` option offers.
LEVEL_CHOICES = ("trace", "debug", "info", "warn", "warning", "error", "critical", "off")


def parse_level(word: str) -> int:
    """The Python level for an slog level word (see :data:`LEVEL_WORDS`;
    case and surrounding blanks ignored). Raises ValueError for another word."""
    level = LEVEL_WORDS.get(word.strip().lower())
    if level is None:
        raise ValueError(f"unknown log level {word.strip()!r} (use {', '.join(LEVEL_CHOICES)})")
    return level


@dataclass(frozen=True, slots=True)
class LogPlan:
    """What :func:`bot_logging` installs: the default ``level`` (a Python
    level, :data:`OFF` for nothing), per-logger ``loggers`` levels, the
    ``logfile`` (None: stderr only), ``backups`` (rotated files kept) and
    ``warnings`` about the config to log once the handlers are in place."""

    level: int = logging.INFO
    loggers: tuple[tuple[str, int], ...] = ()
    logfile: Path | None = None
    backups: int = DEFAULT_MAX_LOG_FILES
    warnings: tuple[str, ...] = ()


def plan_logging(cfg: LogSettings | None, *, level: str | None = None, source: str = "bot config") -> LogPlan:
    """Read the logging keys of ``cfg`` (None: defaults, stderr only).
    ``level``, when given, replaces ``debug`` and must be a level word
    (raises ValueError otherwise). ``source`` names the config file in
    warnings. Opens nothing."""
    warnings: list[str] = []
    default = logging.INFO
    loggers: list[tuple[str, int]] = []
    if level is not None:
        default = parse_level(level)
    elif cfg is not None and cfg.debug.strip():
        for item in cfg.debug.split(","):
            name, sep, word = item.partition("=")
            if not sep:
                name, word = "", name
            name, word = name.strip(), word.strip()
            if not word:
                continue
            try:
                parsed = parse_level(word)
            except ValueError:
                warnings.append(
                    f"{source}: debug={cfg.debug.strip()!r}: unknown log level {word!r}, using info"
                )
                parsed = logging.INFO
            if name:
                loggers.append((name, parsed))
            else:
                default = parsed
    if cfg is not None:
        warnings.extend(cfg.unknown_key_warnings(source))
    logfile: Path | None = None
    backups = DEFAULT_MAX_LOG_FILES
    if cfg is not None and cfg.logfile.strip():
        logfile = Path(cfg.logfile.strip()).expanduser()
        if cfg.maxlogfiles > 0:
            backups = cfg.maxlogfiles
    return LogPlan(default, tuple(loggers), logfile, backups, tuple(warnings))


class _PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotating file handler whose files are created with mode 0600."""

    def _open(self) -> TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return open(fd, "a", encoding=self.encoding, errors=self.errors)


def _make_dirs(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each with mode 0700."""
    missing: list[Path] = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)


def _reason(exc: OSError) -> str:
    return exc.strerror.lower() if exc.strerror else str(exc)


def _file_handler(plan: LogPlan) -> logging.Handler | None:
    path = plan.logfile
    if path is None:
        return None
    try:
        _make_dirs(path.parent)
    except OSError as exc:
        raise LogSetupError(f"cannot create log directory {path.parent}: {_reason(exc)}") from None
    try:
        return _PrivateRotatingFileHandler(
            path, maxBytes=LOG_ROTATE_BYTES, backupCount=plan.backups, encoding="utf-8"
        )
    except OSError as exc:
        raise LogSetupError(f"cannot open log file {path}: {_reason(exc)}") from None


@contextlib.contextmanager
def bot_logging(
    cfg: LogSettings | None,
    *,
    level: str | None = None,
    source: str = "bot config",
    stream: TextIO | None = None,
) -> Iterator[LogPlan]:
    """Install logging for a console daemon while the block runs: records go
    to ``stream`` (default: stderr) and, when ``cfg.logfile`` is set, to that
    file (see the module docs); levels from ``cfg.debug`` or ``level``.
    Yields the :class:`LogPlan`. At ``info`` and above the MCP SDK's
    ``mcp.*`` loggers are held at ``warn`` unless ``debug`` names them.
    On exit the handlers are removed and closed
    and the previous levels restored. Raises :class:`LogSetupError` (one
    line naming the path) when the log file cannot be opened, and
    ValueError for a ``level`` that is not a level word."""
    plan = plan_logging(cfg, level=level, source=source)
    formatter = logging.Formatter(LOG_FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler(stream or sys.stderr)]
    file_handler = _file_handler(plan)
    if file_handler is not None:
        handlers.append(file_handler)
    root = logging.getLogger()
    saved_root = root.level
    levels = list(plan.loggers)
    if plan.level >= logging.INFO and not any(n == "mcp" or n.startswith("mcp.") for n, _ in levels):
        # The MCP SDK's INFO lines (a session created or terminated, with its
        # id) are not the operator's at info; a debug level shows them.
        levels.append(("mcp", max(plan.level, logging.WARNING)))
    saved = {name: logging.getLogger(name).level for name, _ in levels}
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(plan.level)
    for name, value in levels:
        logging.getLogger(name).setLevel(value)
    try:
        for warning in plan.warnings:
            log.warning("%s", warning)
        yield plan
    finally:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(saved_root)
        for name, value in saved.items():
            logging.getLogger(name).setLevel(value)
