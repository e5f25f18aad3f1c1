"""A private PostgreSQL server on a Unix socket in a temporary directory,
for tests and benchmarks that run the store on PostgreSQL.

:func:`start_server` runs ``initdb`` and ``pg_ctl`` on a fresh temporary
directory and listens only on a socket in it (``listen_addresses=''``: no
TCP port is opened; trust authentication, ``fsync=off``); it yields a
:class:`PostgresServer` and stops the server (``-m immediate``) and removes
the directory on exit. It raises :class:`ServerUnavailable` with the reason
when psycopg 3 or the binaries are missing (searched on PATH and under
``/usr/lib/postgresql/*/bin``), when running as root with no way to run
them as another user (initdb refuses root; ``runuser`` or ``setpriv`` to
the ``postgres`` or ``nobody`` account is used when present), or when the
server does not start. The pytest fixtures in ``tests/kit/postgres.py``
and ``bench/store_bench.py`` both use it.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PostgresServer", "ServerUnavailable", "find_binaries", "start_server"]

_DB_COUNTER = itertools.count(1)


class ServerUnavailable(RuntimeError):
    """No private PostgreSQL server can be started here; ``str()`` is the
    one-line reason (what is missing, or the server's own last words)."""


@dataclass(frozen=True)
class PostgresServer:
    """A running server: ``socket_dir`` holds its socket, ``user`` is its
    superuser (trust authentication on the socket)."""

    socket_dir: Path
    user: str

    def url(self, dbname: str) -> str:
        """The ``store`` URL of database ``dbname`` on this server."""
        return f"postgresql:///{dbname}?host={self.socket_dir}&user={self.user}"

    def create_database(self, prefix: str = "t") -> str:
        """Create an empty database named ``<prefix>_<pid>_<n>`` and return
        its ``store`` URL. Raises ``psycopg.Error`` when the server refuses."""
        import psycopg

        name = f"{prefix}_{os.getpid()}_{next(_DB_COUNTER)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop the database ``url`` names, closing its connections."""
        import psycopg

        name = url.split("///", 1)[1].split("?", 1)[0]
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def find_binaries() -> tuple[str, str] | None:
    """``(initdb, pg_ctl)`` paths, or None when either is missing."""
    for directory in [None, *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]:
        initdb = shutil.which("initdb", path=directory)
        pg_ctl = shutil.which("pg_ctl", path=directory)
        if initdb and pg_ctl:
            return initdb, pg_ctl
    return None


def _run_as() -> tuple[list[str], str, int, int] | str:
    """The command prefix running a binary as a non-root user, that user's
    name, uid and gid; or the reason it cannot be done."""
    if os.geteuid() != 0:
        return [], pwd.getpwuid(os.geteuid()).pw_name, os.geteuid(), os.getegid()
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if shutil.which("runuser"):
            return ["runuser", "-u", name, "--"], name, entry.pw_uid, entry.pw_gid
        if shutil.which("setpriv"):
            prefix = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]
            return prefix, name, entry.pw_uid, entry.pw_gid
    return "running as root and neither runuser nor setpriv with a postgres/nobody account is available"


@contextlib.contextmanager
def start_server(*, max_connections: int = 100) -> Iterator[PostgresServer]:
    """Start a private server (see the module docstring), yield it, stop it.

    ``max_connections`` is the server's connection limit. Raises
    :class:`ServerUnavailable` (before yielding) when no server can be
    started."""
    try:
        import psycopg  # noqa: F401 -- only its presence is checked here
    except ImportError:
        raise ServerUnavailable('psycopg 3 is not installed (pip install "brmcp[postgres]")') from None
    binaries = find_binaries()
    if binaries is None:
        raise ServerUnavailable(
            "PostgreSQL's initdb/pg_ctl not found on PATH or in /usr/lib/postgresql/*/bin"
        )
    initdb, pg_ctl = binaries
    runner = _run_as()
    if isinstance(runner, str):
        raise ServerUnavailable(runner)
    prefix, user, uid, gid = runner
    root = Path(tempfile.mkdtemp(prefix="brmcp-pg-"))
    data = root / "data"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    try:
        os.chown(root, uid, gid)
        os.chmod(root, 0o700)
        subprocess.run(
            [*prefix, initdb, "-D", str(data), "-U", user, "--auth=trust", "--no-sync", "-E", "UTF8"],
            check=True,
            capture_output=True,
            env=env,
            cwd=root,
        )
        options = (
            f"-c listen_addresses='' -c unix_socket_directories={root} -c fsync=off "
            f"-c max_connections={int(max_connections)}"
        )
        subprocess.run(
            [*prefix, pg_ctl, "-D", str(data), "-o", options, "-l", str(root / "server.log"), "-w", "start"],
            check=True,
            capture_output=True,
            env=env,
            cwd=root,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        shutil.rmtree(root, ignore_errors=True)
        raise ServerUnavailable(
            f"cannot start a PostgreSQL server: {exc} {detail.decode(errors='replace')[-300:]}"
        ) from None
    try:
        yield PostgresServer(root, user)
    finally:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            subprocess.run(
                [*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
                check=True,
                capture_output=True,
                env=env,
                cwd=root,
            )
        shutil.rmtree(root, ignore_errors=True)
