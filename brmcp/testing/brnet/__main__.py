"""``python -m brmcp.testing.brnet [brnet flags]``: build brnet if needed and
run it in the foreground (e.g. ``--root /tmp/net --users bot,alice``; Go's
flag package takes ``-flag`` and ``--flag``). Without Go: one line on stderr,
exit status 1."""

from __future__ import annotations

import os
import sys

from .build import BrNetBuildError, BrNetUnavailable, brnet_binary


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        exe = brnet_binary()
    except (BrNetUnavailable, BrNetBuildError) as exc:
        print(f"brnet: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    os.execv(exe, [str(exe), *args])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
