"""bisonbotkit-style bot configuration: a ``key=value`` file naming brclient's
clientrpc address, certificates and Basic-auth credentials (docs/clientrpc.md
§Bot config file).

Format: one ``key=value`` per line, split at the first ``=``, both sides
trimmed. Blank lines and lines starting with ``#`` that hold no ``=`` are
skipped; any other line without ``=`` is an error naming the file and line
(bisonbotkit skips it silently, which hides typos). There is no other
comment syntax (a ``# a=b`` line is the unknown key ``# a``); unknown keys
are kept in :attr:`BotConfig.extra` and written back, and their line
numbers in :attr:`BotConfig.extra_lines` so that the daemons can warn about
them (:func:`BotConfig.unknown_key_warnings`). A missing file is created with
defaults (random ``rpcuser``/``rpcpass``, certificates under brclient's app-data
directory), mode 0600. An existing file is never backfilled or overwritten.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import secrets
import sys
import tempfile
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .errors import ClientrpcConfigError

__all__ = [
    "DEFAULT_BRRPCURL",
    "BotConfig",
    "brclient_appdata_dir",
    "load_bot_config",
    "load_or_create_bot_config",
    "write_bot_config",
]

DEFAULT_BRRPCURL = "wss://127.0.0.1:7676/ws"
_INT_KEYS = ("maxlogfiles", "maxbufferlines")
#: BotConfig fields that are not config keys.
_NOT_KEYS = frozenset({"extra", "extra_lines"})
#: Keys outside bisonbotkit's set that brmcp reads from :attr:`BotConfig.extra`
#: (as the Go reference reads them from bisonbotkit's extras map); never
#: warned about as unknown.
_EXTRA_KEYS = frozenset({"brstatusurl"})


def brclient_appdata_dir() -> Path:
    """brclient's default root: ``~/.brclient`` (Linux/BSD),
    ``~/Library/Application Support/Brclient`` (macOS), ``%LOCALAPPDATA%\\Brclient`` (Windows)."""
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Brclient"
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        return (Path(local) if local else home / "AppData" / "Local") / "Brclient"
    return home / ".brclient"


@dataclass(slots=True)
class BotConfig:
    """The known keys of a bot config file (all strings except the two counts).

    ``brrpcurl``: ``wss://host:port/ws``; ``servercertpath``: brclient's
    ``rpc.cert`` (pinned as the only CA); ``clientcertpath``/``clientkeypath``:
    ``rpc-client.cert``/``rpc-client.key``; ``rpcuser``/``rpcpass``: Basic auth
    (only checked when brclient sets ``rpcauthmode``); ``debug``, ``logfile``,
    ``maxlogfiles``, ``maxbufferlines``: logging settings (0 = unset).
    ``extra``: every other key, in file order; ``extra_lines``: the line
    number of each (1-based, the last occurrence; not written back).
    ``brstatusurl`` (:attr:`brstatusurl`) is one of them: the base URL of
    brclientd's status server, kept in ``extra`` as bisonbotkit keeps it in
    its extras map (karamble/brmcp, ``cmd/brmcpdir/main.go``).
    """

    datadir: str = ""
    brrpcurl: str = ""
    servercertpath: str = ""
    clientcertpath: str = ""
    clientkeypath: str = ""
    rpcuser: str = ""
    rpcpass: str = ""
    debug: str = ""
    logfile: str = ""
    maxlogfiles: int = 0
    maxbufferlines: int = 0
    extra: dict[str, str] = field(default_factory=dict)
    extra_lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def brstatusurl(self) -> str:
        """brclientd's status server, e.g. ``https://127.0.0.1:7677`` (the
        ``brstatusurl`` key; ``""`` when unset): where KX suggestions go
        (docs/clientrpc.md §KX suggestions)."""
        return self.extra.get("brstatusurl", "")

    @brstatusurl.setter
    def brstatusurl(self, value: str) -> None:
        if value:
            self.extra["brstatusurl"] = value
        else:
            self.extra.pop("brstatusurl", None)

    @classmethod
    def defaults(cls, datadir: str | os.PathLike[str], name: str) -> BotConfig:
        """What bisonbotkit writes for a missing file: ``brrpcurl`` =
        ``wss://127.0.0.1:7676/ws``, certificates in :func:`brclient_appdata_dir`,
        ``rpcuser`` 8 random hex characters, ``rpcpass`` 16, ``debug=info``,
        ``logfile=<datadir>/logs/<name>.log``, 5 log files, 1000 buffer lines."""
        root = brclient_appdata_dir()
        data = Path(datadir)
        return cls(
            datadir=str(data),
            brrpcurl=DEFAULT_BRRPCURL,
            servercertpath=str(root / "rpc.cert"),
            clientcertpath=str(root / "rpc-client.cert"),
            clientkeypath=str(root / "rpc-client.key"),
            rpcuser=secrets.token_hex(4),
            rpcpass=secrets.token_hex(8),
            debug="info",
            logfile=str(data / "logs" / f"{name}.log"),
            maxlogfiles=5,
            maxbufferlines=1000,
        )

    @classmethod
    def parse(cls, text: str, *, source: str = "<config>") -> BotConfig:
        """Parse file text; raises :class:`ClientrpcConfigError` naming ``source``
        and the line when a count is not an integer or a line is not
        ``key=value`` (blank lines and ``#`` comments without ``=`` are
        skipped; the message never repeats the line, which may hold a
        password). A repeated key: last wins."""
        cfg = cls()
        known = {f.name for f in fields(cls)} - _NOT_KEYS
        for lineno, line in enumerate(text.splitlines(), start=1):
            if "=" not in line:
                stripped = line.strip()
                if stripped and not stripped.startswith("#"):
                    raise ClientrpcConfigError(
                        f"{source}:{lineno}: not a key=value line (a key, '=', then its value)"
                    )
                continue
            key, _, value = line.partition("=")
            key, value = key.strip(), value.strip()
            if key not in known:
                cfg.extra[key] = value
                cfg.extra_lines[key] = lineno
            elif key in _INT_KEYS:
                try:
                    setattr(cfg, key, int(value) if value else 0)
                except ValueError:
                    raise ClientrpcConfigError(
                        f"{source}:{lineno}: {key}={value!r} is not an integer"
                    ) from None
            else:
                setattr(cfg, key, value)
        return cfg

    def render(self) -> str:
        """The file text: known keys in bisonbotkit's order (empty/zero ones
        left out), then the extra keys; raises :class:`ClientrpcConfigError` for
        a value with a line break or a key with ``=``, which the format cannot hold."""
        lines: list[str] = []
        for f in fields(self):
            if f.name in _NOT_KEYS:
                continue
            value = getattr(self, f.name)
            if value in ("", 0):
                continue
            lines.append(f"{f.name}={value}")
        for key, value in self.extra.items():
            if "=" in key or "\n" in key or "\r" in key:
                raise ClientrpcConfigError(
                    f"config key {key!r} cannot be written (contains '=' or a newline)"
                )
            lines.append(f"{key}={value}")
        for line in lines:
            if "\n" in line or "\r" in line:
                raise ClientrpcConfigError(
                    f"config line {line.splitlines()[0]!r}...: value contains a newline"
                )
        return "\n".join(lines) + "\n"

    def unknown_key_warnings(self, source: str) -> list[str]:
        """One line per unknown key, ``<source>:<line>: unknown key 'x' ignored``
        (``brstatusurl``, which brmcp reads, is not unknown; bisonbotkit files
        may carry keys of other bots, so this is a warning, not an error)."""
        out = []
        for key in self.extra:
            if key in _EXTRA_KEYS:
                continue
            line = self.extra_lines.get(key)
            where = f"{source}:{line}" if line is not None else source
            close = difflib.get_close_matches(key, (*_KNOWN, *sorted(_EXTRA_KEYS)), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(f"{where}: unknown key {key!r} ignored{hint}")
        return out

    def with_runtime_defaults(self) -> BotConfig:
        """Check what bisonbotkit's ``NewBot`` requires (``brrpcurl``, ``datadir``
        and ``logfile`` non-empty; raises :class:`ClientrpcConfigError`) and fill
        ``maxlogfiles`` (5), ``maxbufferlines`` (1000) and ``debug`` (``info``)
        when unset."""
        for key in ("brrpcurl", "datadir", "logfile"):
            if not getattr(self, key):
                raise ClientrpcConfigError(f"bot config: {key} is required")
        return replace(
            self,
            maxlogfiles=self.maxlogfiles or 5,
            maxbufferlines=self.maxbufferlines or 1000,
            debug=self.debug or "info",
            extra=dict(self.extra),
            extra_lines=dict(self.extra_lines),
        )


#: The keys a bot config file may hold, in bisonbotkit's order.
_KNOWN = tuple(f.name for f in fields(BotConfig) if f.name not in _NOT_KEYS)


def load_bot_config(path: str | os.PathLike[str]) -> BotConfig:
    """Read and parse a config file; raises :class:`ClientrpcConfigError` naming
    the file when it is missing or unreadable. A leading ``~`` is expanded."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ClientrpcConfigError(f"bot config {p}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ClientrpcConfigError(f"bot config {p}: {_os_reason(exc)}") from None
    return BotConfig.parse(text, source=str(p))


def write_bot_config(path: str | os.PathLike[str], cfg: BotConfig) -> None:
    """Write ``cfg`` atomically (temporary file + rename) with mode 0600; creates
    the parent directory (mode 0700). Raises :class:`ClientrpcConfigError` naming
    the file on failure."""
    p = Path(path)
    text = cfg.render()
    try:
        p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.chmod(tmp, 0o600)
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise ClientrpcConfigError(f"bot config {p}: cannot write: {_os_reason(exc)}") from None


def load_or_create_bot_config(datadir: str | os.PathLike[str], name: str) -> tuple[BotConfig, bool]:
    """Load ``<datadir>/<name>.conf``, or write :meth:`BotConfig.defaults` there
    when it does not exist. Returns ``(config, created)``."""
    path = Path(datadir) / f"{name}.conf"
    if path.exists():
        return load_bot_config(path), False
    cfg = BotConfig.defaults(datadir, name)
    write_bot_config(path, cfg)
    return cfg, True


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
