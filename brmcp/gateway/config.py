"""Which upstream MCP server the gateway sells, and how to reach it.

One design, two spellings: the ``upstream`` block of ``brmcp.json`` ::

    "upstream": {
      "command": ["uvx", "mcp-server-time", "--local-timezone", "UTC"],
      "env": {"TZ": "UTC"},
      "send_caller_uid": false,
      "call_timeout_seconds": 300
    }

or, for a streamable-HTTP server, ::

    "upstream": {
      "url": "http://127.0.0.1:3001/mcp",
      "headers_env": {"Authorization": "UPSTREAM_AUTHORIZATION"},
      "headers_file": "upstream-headers.txt"
    }

and the command-line options ``brmcp-serve --upstream CMD ARG...`` /
``--upstream-url URL`` (with ``--upstream-header-env NAME=VAR`` and
``--upstream-headers-file FILE``), which replace the block's ``command`` /
``url`` (and headers) for that run; ``--upstream-env NAME`` and
``--upstream-env NAME=VALUE`` add to its ``pass_env`` and ``env``. Keys:

* ``command``: argv of a stdio server (a list of strings, or one string
  split like a shell would). The process gets a small environment: the MCP
  SDK's default (``get_default_environment()``: ``HOME``, ``LOGNAME``,
  ``PATH``, ``SHELL``, ``TERM``, ``USER``; on Windows ``APPDATA``, ``PATH``,
  ``SYSTEMROOT``, ``TEMP``, ``USERPROFILE``, ...), then the variables of
  :data:`PASSTHROUGH_ENV` that are set (a custom CA and a proxy, so that
  ``uvx``/``npx`` can download the server), then ``pass_env``, then ``env``.
* ``pass_env``: names of further variables to pass from brmcp-serve's own
  environment (``--upstream-env NAME``); one that is not set is an error.
* ``env``: variables with their values (``--upstream-env NAME=VALUE``).
* ``url``: an ``http(s)://`` streamable-HTTP endpoint. ``headers_env`` maps
  a header name to the environment variable holding its value;
  ``headers_file`` is a file of ``Name: value`` lines (``#`` comments;
  relative to the data directory). Header values are never logged.
* ``send_caller_uid``: when true, each forwarded call carries the caller's
  BR uid in ``params._meta`` under :data:`CALLER_UID_KEY`; by default the
  upstream sees a call exactly as a local MCP client would send it.
* ``call_timeout_seconds``: longest wait for one upstream answer (default
  300); a call that times out is refunded.

Exactly one of ``command`` and ``url`` must be given.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "CALLER_UID_KEY",
    "DEFAULT_CALL_TIMEOUT",
    "PASSTHROUGH_ENV",
    "UpstreamConfig",
    "UpstreamConfigError",
    "load_upstream_block",
    "parse_env_option",
    "parse_header_env",
    "read_headers_file",
]

#: ``params._meta`` key carrying the caller's BR uid (64 lowercase hex) to
#: the upstream, only when ``send_caller_uid`` is true.
CALLER_UID_KEY = "brmcp/callerUid"
#: Seconds one upstream request may take by default.
DEFAULT_CALL_TIMEOUT = 300.0

#: Variables a stdio upstream gets from brmcp-serve's environment when they
#: are set, besides the MCP SDK's minimal default: where TLS finds a custom
#: CA (OpenSSL, Python requests, curl, Node, uv) and the proxy settings, in
#: both spellings (curl and most tools read the lower-case ones, others the
#: upper-case). Without them ``uvx``/``npx`` cannot download the server
#: behind a corporate proxy or TLS-inspecting firewall.
PASSTHROUGH_ENV: tuple[str, ...] = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "UV_NATIVE_TLS",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "all_proxy",
    "no_proxy",
)

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYS = {
    "command",
    "url",
    "env",
    "pass_env",
    "cwd",
    "headers_env",
    "headers_file",
    "send_caller_uid",
    "call_timeout_seconds",
}


class UpstreamConfigError(ValueError):
    """An invalid upstream setting; the one-line message names where it came
    from (a file or a command-line option) and the problem."""


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """How to reach the upstream: ``command`` (stdio argv) xor ``url``
    (streamable HTTP). ``env``: variables set for a stdio server;
    ``pass_env``: names passed from our environment (besides
    :data:`PASSTHROUGH_ENV`); ``headers_env``: header name → environment
    variable; ``headers_file``: a ``Name: value`` file. See the module
    docstring."""

    command: tuple[str, ...] = ()
    url: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    pass_env: tuple[str, ...] = ()
    cwd: str | None = None
    headers_env: Mapping[str, str] = field(default_factory=dict)
    headers_file: str | None = None
    send_caller_uid: bool = False
    call_timeout: float = DEFAULT_CALL_TIMEOUT

    def __post_init__(self) -> None:
        if bool(self.command) == (self.url is not None):
            raise UpstreamConfigError("upstream: give exactly one of a command (stdio) and a url (HTTP)")
        if self.url is not None and not re.match(r"https?://", self.url, re.IGNORECASE):
            raise UpstreamConfigError(f"upstream: url must start with http:// or https://, got {self.url!r}")
        if self.call_timeout <= 0:
            raise UpstreamConfigError("upstream: call_timeout_seconds must be > 0")

    @property
    def kind(self) -> str:
        """``"stdio"`` or ``"http"``."""
        return "stdio" if self.command else "http"

    def describe(self) -> str:
        """A one-line description for logs (the command or URL; never headers)."""
        if self.command:
            return "stdio: " + shlex.join(self.command)
        return f"http: {self.url}"

    def with_command(self, command: Sequence[str]) -> UpstreamConfig:
        return replace(self, command=tuple(command), url=None, headers_env={}, headers_file=None)

    def with_url(self, url: str) -> UpstreamConfig:
        return replace(self, command=(), url=url, env={}, pass_env=(), cwd=None)

    def with_env(self, env: Mapping[str, str], pass_env: Sequence[str]) -> UpstreamConfig:
        """A copy with ``env`` added over :attr:`env` and ``pass_env`` added
        to :attr:`pass_env` (the command line's ``--upstream-env``)."""
        names = tuple(dict.fromkeys((*self.pass_env, *pass_env)))
        return replace(self, env={**self.env, **env}, pass_env=names)

    def process_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """The variables a stdio upstream gets on top of the MCP SDK's
        default environment (which ``stdio_client`` merges under them): the
        :data:`PASSTHROUGH_ENV` names set in ``environ`` (default
        ``os.environ``), then ``pass_env``, then ``env``. Raises
        :class:`UpstreamConfigError` naming a ``pass_env`` variable that is
        not set."""
        source = os.environ if environ is None else environ
        out = {name: source[name] for name in PASSTHROUGH_ENV if name in source}
        for name in self.pass_env:
            if name not in source:
                raise UpstreamConfigError(
                    f"upstream environment: {name} is to be passed to the upstream (--upstream-env {name} "
                    f'or "pass_env" in brmcp.json) but is not set; set it, or give NAME=VALUE'
                )
            out[name] = source[name]
        out.update(self.env)
        return out

    def headers(self, base_dir: str | os.PathLike[str] | None = None) -> dict[str, str]:
        """The HTTP headers to send: the file's, then the environment's
        (which win). Raises :class:`UpstreamConfigError` for an unset
        variable or a bad file (never quoting a header value)."""
        out: dict[str, str] = {}
        if self.headers_file is not None:
            path = Path(self.headers_file).expanduser()
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            out.update(read_headers_file(path))
        for name, var in self.headers_env.items():
            value = os.environ.get(var)
            if value is None:
                raise UpstreamConfigError(f"upstream header {name}: environment variable {var} is not set")
            out[name] = value
        return out

    @classmethod
    def from_block(cls, block: Any, *, source: str) -> UpstreamConfig:
        """Parse the ``upstream`` object of ``brmcp.json``. Raises
        :class:`UpstreamConfigError` naming ``source`` and the key."""
        if not isinstance(block, dict):
            raise UpstreamConfigError(f"{source}: upstream must be an object")
        unknown = sorted(set(block) - _KEYS)
        if unknown:
            first = unknown[0]
            close = difflib.get_close_matches(first.lower(), sorted(_KEYS), n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise UpstreamConfigError(
                f'{source}: upstream: unknown key "{first}"{hint}; the keys are {", ".join(sorted(_KEYS))}'
            )
        command: tuple[str, ...] = ()
        raw = block.get("command")
        if isinstance(raw, str):
            try:
                command = tuple(shlex.split(raw))
            except ValueError as exc:
                raise UpstreamConfigError(f"{source}: upstream.command: {exc}") from None
        elif isinstance(raw, list) and all(isinstance(a, str) for a in raw):
            command = tuple(raw)
        elif raw is not None:
            raise UpstreamConfigError(f"{source}: upstream.command must be a list of strings or a string")
        url = block.get("url")
        if url is not None and not isinstance(url, str):
            raise UpstreamConfigError(f"{source}: upstream.url must be a string")
        env = _str_map(block.get("env"), "env", source)
        raw_pass = block.get("pass_env")
        if raw_pass is None:
            raw_pass = []
        if not isinstance(raw_pass, list) or not all(isinstance(n, str) for n in raw_pass):
            raise UpstreamConfigError(
                f"{source}: upstream.pass_env must be a list of environment variable names, got "
                f"{json.dumps(raw_pass)[:80]}"
            )
        for name in raw_pass:
            _check_env_name(name, f"{source}: upstream.pass_env")
        headers_env = _str_map(block.get("headers_env"), "headers_env", source)
        for name, var in headers_env.items():
            _check_header_name(name, f"{source}: upstream.headers_env")
            if not _ENV_NAME.fullmatch(var):
                raise UpstreamConfigError(
                    f"{source}: upstream.headers_env[{name}]: {var!r} is not an environment variable name"
                )
        cwd = block.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise UpstreamConfigError(f"{source}: upstream.cwd must be a string")
        headers_file = block.get("headers_file")
        if headers_file is not None and not isinstance(headers_file, str):
            raise UpstreamConfigError(f"{source}: upstream.headers_file must be a string (a path)")
        send_uid = block.get("send_caller_uid", False)
        if not isinstance(send_uid, bool):
            raise UpstreamConfigError(f"{source}: upstream.send_caller_uid must be true or false")
        timeout = block.get("call_timeout_seconds", DEFAULT_CALL_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise UpstreamConfigError(f"{source}: upstream.call_timeout_seconds must be a number > 0")
        try:
            return cls(
                command=command,
                url=url,
                env=env,
                pass_env=tuple(dict.fromkeys(raw_pass)),
                cwd=cwd,
                headers_env=headers_env,
                headers_file=headers_file,
                send_caller_uid=send_uid,
                call_timeout=float(timeout),
            )
        except UpstreamConfigError as exc:
            raise UpstreamConfigError(f"{source}: {exc}") from None


def _str_map(value: Any, key: str, source: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise UpstreamConfigError(f"{source}: upstream.{key} must be an object of strings")
    return dict(value)


def _check_env_name(name: str, where: str) -> None:
    if not _ENV_NAME.fullmatch(name):
        raise UpstreamConfigError(f"{where}: {name!r} is not an environment variable name")


def parse_env_option(spec: str) -> tuple[str, str | None]:
    """Parse a ``--upstream-env`` value: ``NAME`` (pass the variable from
    our environment; value None) or ``NAME=VALUE`` (set it). Raises
    :class:`UpstreamConfigError` for a bad name."""
    name, sep, value = spec.partition("=")
    if not _ENV_NAME.fullmatch(name):
        raise UpstreamConfigError(
            f"--upstream-env: {name!r} is not an environment variable name (expected NAME or NAME=VALUE)"
        )
    return name, value if sep else None


def _check_header_name(name: str, where: str) -> None:
    if not _HEADER_NAME.fullmatch(name):
        raise UpstreamConfigError(f"{where}: {name!r} is not a valid HTTP header name")


def parse_header_env(spec: str) -> tuple[str, str]:
    """Parse a ``NAME=VAR`` option value (header name, environment variable).
    Raises :class:`UpstreamConfigError`."""
    name, sep, var = spec.partition("=")
    if not sep:
        raise UpstreamConfigError(f"--upstream-header-env: expected NAME=VAR, got {spec!r}")
    _check_header_name(name, "--upstream-header-env")
    if not _ENV_NAME.fullmatch(var):
        raise UpstreamConfigError(f"--upstream-header-env: {var!r} is not an environment variable name")
    return name, var


def read_headers_file(path: Path) -> dict[str, str]:
    """``Name: value`` lines (blank lines and ``#`` comments skipped).
    Raises :class:`UpstreamConfigError` naming the file and line, never
    quoting a value."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UpstreamConfigError(f"{path}: cannot read the upstream headers file: {reason}") from None
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, sep, value = stripped.partition(":")
        name = name.strip()
        if not sep or not _HEADER_NAME.fullmatch(name):
            raise UpstreamConfigError(f"{path}:{number}: expected 'Name: value'")
        headers[name] = value.strip()
    return headers


def load_upstream_block(path: str | os.PathLike[str]) -> UpstreamConfig | None:
    """The ``upstream`` block of ``brmcp.json`` at ``path`` (the key in any
    case, as Go's decoder matches it), or None when
    the file has none, or cannot be read or parsed (brmcp-serve's own
    loader reports that, naming the file). Raises
    :class:`UpstreamConfigError` for an invalid block."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    # Go's key rule, as brmcp-serve's loader applies to the same file: the
    # key in any case; the last such key wins.
    block = None
    for key, value in data.items():
        if key.casefold() == "upstream":
            block = value
    if block is None:
        return None
    return UpstreamConfig.from_block(block, source=str(p))
