"""``python -m brmcp.testing.brnet [brnet flags]``: build brnet if needed and
run it in the foreground (e.g. ``--root /tmp/net --users bot,alice``; Go's
flag package takes ``-flag`` and ``--flag``). A first build reports its
progress on stderr. Without Go: one line on stderr, exit status 1."""

from __future__ import annotations

import os
import sys

from .build import BrNetBuildError, BrNetUnavailable, brnet_binary


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        exe = brnet_binary(progress=_stderr)
    except BrNetUnavailable as exc:
        print(f"brnet: {exc}", file=sys.stderr)
        return 1
    except BrNetBuildError as exc:
        print(f"brnet: {exc.summary}", file=sys.stderr)
        return 1
    os.execv(exe, [str(exe), *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
