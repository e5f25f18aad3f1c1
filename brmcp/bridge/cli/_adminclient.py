"""How the ``brmcp-bridge`` subcommands reach the running daemon (BRIDGE.md
"Admin surface"): find it through its runtime record (:mod:`.runtime`; a
record whose process is gone or was replaced is stale: the daemon is not
running), authenticate with ``<datadir>/mcpadmin.token``, and call its
``/admin/…`` JSON surface over loopback HTTP (never through a proxy).
Every failure is a one-line :class:`CLIError`; :class:`NotRunning` and
:class:`Disabled` say why the daemon cannot answer, so a command can fall
back to the files.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brmcp.bridge.base import ADMIN_TOKEN_FILE, SETTINGS_FILE, BridgeError, cli_command, load_settings
from brmcp.bridge.daemon import RUNTIME_FILE, read_runtime, runtime_stale_reason

__all__ = [
    "OTHER_DATADIR_HINT",
    "REQUEST_TIMEOUT",
    "AdminError",
    "CLIError",
    "Daemon",
    "Disabled",
    "NotRunning",
    "admin",
    "locate",
]

#: Seconds a subcommand waits for the daemon's answer.
REQUEST_TIMEOUT = 15.0
#: Said whenever no daemon runs on the data directory a command was given:
#: the usual cause is a daemon started with another ``--datadir``. (Daemons
#: are found only through the runtime file in their own data directory;
#: nothing lists them all.)
OTHER_DATADIR_HINT = "if the daemon runs with another data directory, add --datadir DIR to this command"


class CLIError(Exception):
    """A one-line error for the user."""


class Disabled(CLIError):
    """The admin surface is off because the bridge is disabled."""


class NotRunning(CLIError):
    """No daemon runs on the data directory; ``detail`` says how we know.
    The message says how to start one there, and to add ``--datadir`` when
    the daemon runs on another data directory (:data:`OTHER_DATADIR_HINT`)."""

    def __init__(self, datadir: Path, detail: str) -> None:
        self.datadir = datadir
        self.detail = detail
        super().__init__(
            f"the daemon is not running ({detail}); start it with: {cli_command(datadir)} "
            f"({OTHER_DATADIR_HINT})"
        )


class AdminError(CLIError):
    """The admin surface answered with an error status (``status``, the HTTP code)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message or f"HTTP {status}")
        self.status = status


@dataclass(frozen=True, slots=True)
class Daemon:
    """A running daemon as its runtime record names it: its data directory,
    ``pid``, admin ``url`` (``http://host:port``), whether it reloads on
    SIGHUP, and the admin ``token`` read from ``mcpadmin.token``."""

    datadir: Path
    pid: int
    url: str
    sighup: bool
    token: str


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, plain: bool) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.plain = plain


class _Unreachable(Exception):
    pass


def locate(datadir: Path) -> Daemon:
    """The running daemon, from its runtime record. Raises :class:`NotRunning`
    when there is no record or it is stale, CLIError for other problems
    (a malformed record, a missing, unreadable or empty admin token)."""
    record = read_runtime(datadir)
    runtime = datadir / RUNTIME_FILE
    if record is None:
        raise NotRunning(datadir, f"no {runtime}")
    pid, url = record.get("pid"), record.get("url")
    if not isinstance(pid, int) or not isinstance(url, str):
        raise CLIError(f"{runtime} is malformed; restart the daemon")
    stale = runtime_stale_reason(record)
    if stale is not None:
        raise NotRunning(datadir, f"stale runtime file {runtime}: {stale}")
    token_path = datadir / ADMIN_TOKEN_FILE
    try:
        token = token_path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise CLIError(
            f"admin token file {token_path} is missing: is {datadir} the daemon's --datadir?"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"cannot read admin token file {token_path}: {exc}") from None
    if not token:
        raise CLIError(f"admin token file {token_path} is empty")
    return Daemon(datadir, pid, url, bool(record.get("sighup")), token)


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy


def _request(
    daemon: Daemon, method: str, path: str, body: Any = None, timeout: float = REQUEST_TIMEOUT
) -> Any:
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(
        daemon.url + path,
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {daemon.token}",
            "Accept": "application/json",
            "Content-Type": "application/json",
        },
    )
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        ctype = exc.headers.get("Content-Type", "") if exc.headers else ""
        message = raw.decode("utf-8", errors="replace").strip()
        if ctype.startswith("application/json"):
            try:
                message = str(json.loads(raw).get("error", message))
            except (ValueError, AttributeError):
                pass
            raise _HTTPError(exc.code, message, plain=False) from None
        raise _HTTPError(exc.code, message, plain=True) from None
    except urllib.error.URLError as exc:
        raise _Unreachable(str(exc.reason)) from None
    except OSError as exc:
        raise _Unreachable(str(exc) or type(exc).__name__) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise CLIError(f"the daemon at {daemon.url} sent a malformed answer") from None


def _enabled_on_disk(datadir: Path) -> bool:
    try:
        return load_settings(datadir / SETTINGS_FILE).enabled
    except BridgeError:
        return True


def admin(
    daemon: Daemon, method: str, path: str, body: Any = None, *, timeout: float = REQUEST_TIMEOUT
) -> Any:
    """``method path`` on the daemon's admin surface with ``body`` as JSON
    (None: no body), waiting ``timeout`` seconds for the answer; returns the
    decoded JSON answer. Raises
    :class:`Disabled` when the surface is off (the bridge is disabled: the
    listener is unbound, or its gate answers a plain 404),
    :class:`AdminError` for an error status, and CLIError when the daemon
    cannot be reached, refuses the admin token or answers malformed JSON."""
    disabled = Disabled(
        "the bridge is disabled, so its admin surface is off; enable it with: "
        f"{cli_command(daemon.datadir)} settings set enabled=true"
    )
    try:
        return _request(daemon, method, path, body, timeout)
    except _Unreachable as exc:
        if not _enabled_on_disk(daemon.datadir):
            raise disabled from None
        raise CLIError(f"cannot reach the daemon (pid {daemon.pid}) at {daemon.url}: {exc}") from None
    except _HTTPError as exc:
        if exc.status == 401:
            raise CLIError(
                f"the daemon at {daemon.url} refused the admin token in {daemon.datadir / ADMIN_TOKEN_FILE}"
            ) from None
        if exc.status == 404 and exc.plain:
            raise disabled from None
        raise AdminError(exc.status, exc.message) from None
