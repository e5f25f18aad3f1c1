"""``python -m brmcp.testing.brnet [brnet flags]``: build brnet if needed and
run it in the foreground (e.g. ``--root /tmp/net --users bot,alice``; Go's
flag package takes ``-flag`` and ``--flag``). A first build reports its
progress on stderr. Without Go: one line on stderr, exit status 1.

The tip restart delay is 1 s here unless a flag sets it
(:data:`STANDALONE_DEFAULTS`): brclient's TipUser blocks for its
``[tipuser] restartdelay`` (brnet's ``-tiprestartdelay``, 1 minute by default
in both) after a client connects to the relay, which would hold the first
paid call made within a minute of the start. ``--tiprestartdelay 1m`` gives
brclient's behaviour back.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .build import BrNetBuildError, BrNetUnavailable, brnet_binary

__all__ = ["STANDALONE_DEFAULTS", "main", "standalone_args"]

#: brnet flags (name, Go duration) this command sets unless told otherwise:
#: a test network's tip restart delay, as :class:`~brmcp.testing.brnet.BrNet`
#: sets it (``tip_restart_delay``, 1 s).
STANDALONE_DEFAULTS: tuple[tuple[str, str], ...] = (("tiprestartdelay", "1s"),)


def standalone_args(args: Sequence[str]) -> list[str]:
    """The brnet command-line arguments for ``args`` (brnet flags): each of
    :data:`STANDALONE_DEFAULTS` as ``-name=value`` first, then ``args``
    unchanged. Go's flag package keeps the last value of a flag given twice,
    so a flag in ``args`` overrides the default."""
    return [*(f"-{name}={value}" for name, value in STANDALONE_DEFAULTS), *args]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Build brnet (progress on stderr) and replace this process with it,
    run with :func:`standalone_args` of ``argv`` (default ``sys.argv[1:]``).
    Returns 1 (after one line on stderr) when brnet cannot be built."""
    args = sys.argv[1:] if argv is None else argv
    try:
        exe = brnet_binary(progress=_stderr)
    except BrNetUnavailable as exc:
        print(f"brnet: {exc}", file=sys.stderr)
        return 1
    except BrNetBuildError as exc:
        print(f"brnet: {exc.summary}", file=sys.stderr)
        return 1
    os.execv(exe, [str(exe), *standalone_args(args)])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
