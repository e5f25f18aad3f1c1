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
* ``chat_help`` (optional, brmcp's own; the Go brmcp-serve ignores plain
  chat): what a human who sends the bot a plain-chat PM gets back, at most
  once per sender per hour (:mod:`brmcp.server.chathelp`): ``true`` (the
  default) the built-in text on how to reach the bot from an agent,
  ``false`` or ``""`` nothing, a string your own text (``{bot_uid}``,
  ``{bot_nick}`` and ``{sender_uid}`` are filled in).
* ``receipts`` (optional, brmcp's own): which calls get a signed receipt
  (WIRE.md §Signed receipts), signed with the key in ``receiptkey.json``
  in the data directory (created at the first start): ``"paid"`` (the
  default) every charged call that succeeded, ``"all"`` free calls too,
  ``"off"`` none (the key is then not announced either).
* ``store`` (optional, brmcp's own): where the harness keeps its book
  (balances, paid-call journal, tips; :mod:`brmcp.server.store.url`):
  ``"sqlite:"`` (the default, ``brmcp.sqlite3`` in the data directory) or a
  PostgreSQL URL ``"postgresql://user@host/dbname"`` (``postgres://``
  also; ``?host=/socket/dir`` for a Unix socket; needs
  ``pip install "brmcp[postgres]"``). A password in it never appears in a
  log line or an error.
* ``pool`` (optional, brmcp's own): this bot is one member of a bot pool
  (WIRE.md §Pools; :func:`brmcp.server.pool.parse_pool`):
  ``{"id": "<name>", "members": ["<uid>", ...]}`` with 2..16 64-hex uids,
  this bot's own among them; needs a PostgreSQL ``store`` shared by every
  member and the same ``receiptkey.json`` copied to each.
* ``upstream``: brmcp/gateway's (:func:`brmcp.gateway.load_upstream_block`).
* ``directory`` (optional, the Go reference's keys): list this bot in
  brmcp directories (:class:`brmcp.directory.provider._registrant.RegistrantConfig`;
  README §List your bot)::

    "directory": {
      "description": "fortunes and echoes",
      "tags": ["fun"],
      "test": {"tool": "fortune", "args": {}, "maxAtoms": 10000},
      "auto_fund": {"enabled": true, "max_atoms_per_request": 200000,
                    "max_atoms_per_month": 1000000, "allowed_directory_uids": []},
      "register_at_uids": ["<64-hex directory uid>"]
    }

  The directories it names (``register_at_uids`` and
  ``auto_fund.allowed_directory_uids``) are admitted as callers besides
  ``allowed_uids``, since a directory crawls and test-calls the bot it
  lists (:attr:`ServeConfig.directory_uids`). An empty object (``{}``) is
  no block, with an INFO line (the Go reference then runs without a
  registrant too).

Keys are matched case-insensitively, as Go's ``encoding/json`` does (the Go
reference reads this file). Any other key is ignored with a WARNING that
names the file, the key and the closest known key ("did you mean"), so a
typo such as ``allowed_uid`` does not silently refuse every caller. A value
of the wrong kind is an error naming the file, key, value and what is
allowed.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brmcp.directory.provider import RegistrantConfig, RegistrantError

from ..clientrpc import BotConfig, write_bot_config
from ..server.config import RECEIPT_MODES, ReceiptMode
from ..server.pool import PoolConfig, parse_pool
from ..server.store.url import DEFAULT_STORE, parse_store_url

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

log = logging.getLogger("brmcp.serve")

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
#: The keys this loader reads (``upstream``: brmcp/gateway's).
_KEYS = (
    "allowed_uids",
    "calls_per_minute",
    "chat_help",
    "directory",
    "pool",
    "receipts",
    "store",
    "upstream",
)


class ServeConfigError(ValueError):
    """A missing, unreadable or invalid brmcp-serve file; the one-line
    message names the file and the problem."""


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """The content of ``brmcp.json``: ``allowed_uids`` (lowercase 64-hex
    uids, in file order, without duplicates), ``calls_per_minute`` (0 means
    the default of 30) and ``chat_help`` (True: the built-in plain-chat
    reply, False: none, a string: that text), ``directory`` (the
    ``directory`` block, or None) and ``receipts`` (which calls get a
    signed receipt: ``"paid"``, ``"all"`` or ``"off"``)."""

    allowed_uids: tuple[str, ...] = ()
    calls_per_minute: int = DEFAULT_CALLS_PER_MINUTE
    chat_help: bool | str = True
    directory: RegistrantConfig | None = None
    receipts: ReceiptMode = "paid"
    #: The ``store`` URL (``"sqlite:"`` or a PostgreSQL URL; not in ``repr``:
    #: it may carry a password).
    store: str = field(default=DEFAULT_STORE, repr=False)
    #: The ``pool`` block (WIRE.md §Pools), or None.
    pool: PoolConfig | None = None

    @property
    def directory_uids(self) -> tuple[str, ...]:
        """The directories the ``directory`` block names
        (:attr:`RegistrantConfig.directory_uids`), () without a block."""
        return () if self.directory is None else self.directory.directory_uids

    @property
    def rate(self) -> int:
        """The calls per minute in force (``calls_per_minute`` or 30 when it is 0)."""
        return self.calls_per_minute or DEFAULT_CALLS_PER_MINUTE

    def to_json(self) -> str:
        """The file text (two-space indent, no trailing newline, as Go's
        ``MarshalIndent``)."""
        data: dict[str, Any] = {
            "allowed_uids": list(self.allowed_uids),
            "calls_per_minute": self.calls_per_minute,
        }
        if self.chat_help is not True:
            data["chat_help"] = self.chat_help
        if self.directory is not None:
            data["directory"] = self.directory.to_json()
        if self.receipts != "paid":
            data["receipts"] = self.receipts
        if self.store != DEFAULT_STORE:
            data["store"] = self.store
        if self.pool is not None:
            data["pool"] = self.pool.to_json()
        return json.dumps(data, indent=2)

    @classmethod
    def parse(cls, text: str, *, source: str = SERVE_CONFIG_FILE) -> ServeConfig:
        """Parse and validate file text. Keys match case-insensitively (an
        exact match first, as Go's decoder does). Raises
        :class:`ServeConfigError` naming ``source`` for invalid JSON, a
        non-object, an ``allowed_uids`` that is not a list of 64-hex
        strings, a ``calls_per_minute`` that is not an integer in
        0..2**63-1, a ``chat_help`` that is not true, false or a string, or
        an invalid ``directory`` block (naming the key inside it:
        :meth:`RegistrantConfig.from_json`), or a ``receipts`` other than
        ``"paid"``, ``"all"`` or ``"off"``, or a ``store`` that is not a store
        URL (:func:`~brmcp.server.store.url.parse_store_url`; the password
        redacted). Logs a WARNING per unknown key
        (with the closest known key) and an INFO line for an empty
        ``directory`` block."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ServeConfigError(f"{source}: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ServeConfigError(f"{source}: expected a JSON object, got {_json_type(data)}")
        data, unknown = _canonical_keys(data, _KEYS)
        uids = _parse_uids(data.get("allowed_uids"), source)
        rate = data.get("calls_per_minute", DEFAULT_CALLS_PER_MINUTE)
        if rate is None:
            rate = DEFAULT_CALLS_PER_MINUTE
        allowed_rate = "use a whole number >= 0 (0 selects 30)"
        if isinstance(rate, bool) or not isinstance(rate, int):
            raise ServeConfigError(
                f"{source}: calls_per_minute must be an integer, got {_json_type(rate)} "
                f"({_shown(rate)}); {allowed_rate}"
            )
        if not 0 <= rate <= _INT64_MAX:
            raise ServeConfigError(f"{source}: calls_per_minute must be >= 0 (0 selects 30), got {rate}")
        chat_help = data.get("chat_help", True)
        if chat_help is None:
            chat_help = True
        if isinstance(chat_help, str) and not chat_help.strip():
            chat_help = False
        if not isinstance(chat_help, bool | str):
            raise ServeConfigError(
                f"{source}: chat_help: {_shown(chat_help)} is not allowed: use true (the built-in reply to "
                "plain chat), false (no reply) or a string (your own reply text)"
            )
        directory = _parse_directory(data.get("directory"), source)
        receipts = _parse_receipts(data.get("receipts"), source)
        store = _parse_store(data.get("store"), source)
        try:
            pool = parse_pool(data.get("pool"))
        except ValueError as exc:
            raise ServeConfigError(f"{source}: pool: {exc}") from None
        if pool is not None and parse_store_url(store).kind != "postgresql":
            raise ServeConfigError(
                f"{source}: pool: the members share one book: set store to the PostgreSQL URL of it"
            )
        for key in unknown:
            log.warning("%s", _unknown_key_warning(source, key, _KEYS))
        return cls(
            allowed_uids=uids,
            calls_per_minute=rate,
            chat_help=chat_help,
            directory=directory,
            receipts=receipts,
            store=store,
            pool=pool,
        )


def _parse_store(value: Any, source: str) -> str:
    """The ``store`` URL: ``"sqlite:"`` when absent or null, else a value
    :func:`~brmcp.server.store.url.parse_store_url` accepts (its error,
    password redacted, names the allowed forms)."""
    if value is None:
        return DEFAULT_STORE
    try:
        parse_store_url(value)
    except ValueError as exc:
        raise ServeConfigError(f"{source}: store: {exc}") from None
    return str(value).strip()


def _parse_receipts(value: Any, source: str) -> ReceiptMode:
    """The ``receipts`` mode: ``"paid"`` when absent or null, else one of
    :data:`~brmcp.server.config.RECEIPT_MODES` exactly."""
    if value is None:
        return "paid"
    for mode in RECEIPT_MODES:
        if value == mode:
            return mode
    allowed = ", ".join(json.dumps(mode) for mode in RECEIPT_MODES)
    raise ServeConfigError(f"{source}: receipts: {_shown(value)} is not allowed: use one of {allowed}")


def _parse_directory(value: Any, source: str) -> RegistrantConfig | None:
    """The ``directory`` block: None when absent, null or ``{}`` (logged at
    INFO), else a validated :class:`RegistrantConfig`."""
    if value is None:
        return None
    if value == {}:
        log.info("%s: the directory block is empty: this bot is not listed in any directory", source)
        return None
    try:
        return RegistrantConfig.from_json(value, where=f"{source}: directory")
    except RegistrantError as exc:
        raise ServeConfigError(str(exc)) from None


def _canonical_keys(data: dict[str, Any], known: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Go's ``encoding/json`` rule for a struct: each key of ``data`` names
    the known field it equals, else the one it equals ignoring case; a
    later key for the same field wins. Returns the values by their known
    names and, in file order, the keys that name no field."""
    folded = {name.casefold(): name for name in known}
    out: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in data.items():
        name = key if key in known else folded.get(key.casefold())
        if name is None:
            unknown.append(key)
        else:
            out[name] = value
    return out, unknown


def _unknown_key_warning(source: str, key: str, known: Sequence[str]) -> str:
    """The one-line warning for an unknown key: ``<source>: unknown key
    "<key>" ignored (did you mean "<closest>"?)``, the hint only when a
    known key is close (difflib)."""
    close = difflib.get_close_matches(key.casefold(), list(known), n=1, cutoff=0.6)
    hint = f' (did you mean "{close[0]}"?)' if close else f" (the keys are {', '.join(known)})"
    return f"{source}: unknown key {json.dumps(key)} ignored{hint}"


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _parse_uids(value: Any, source: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ServeConfigError(
            f"{source}: allowed_uids must be a list of uids, got {_json_type(value)} ({_shown(value)}); "
            'use ["<64-hex uid>", ...] ([] refuses everyone)'
        )
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
