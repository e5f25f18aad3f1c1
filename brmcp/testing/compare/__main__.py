"""``python -m brmcp.testing.compare [--probe NAME ...] [--fast-fake] [--json]``:
run the probes on the fake and on brnet (needs Go) and print every difference.
Exit status: 0 when nothing differs, 1 when something does, 2 without Go."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import anyio

from ..brnet import BrNetUnavailable, brnet_binary
from .probes import PROBES
from .runner import compare_networks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brmcp.testing.compare", description=__doc__)
    parser.add_argument("--probe", action="append", choices=sorted(PROBES), help="run only these probes")
    parser.add_argument(
        "--fast-fake",
        action="store_true",
        help="run the fake with its speed options (no pacing, no TipUser block)",
    )
    parser.add_argument("--json", action="store_true", help="print both networks' observations as JSON")
    args = parser.parse_args(argv)
    try:
        exe = brnet_binary()
    except BrNetUnavailable as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="brmcp-compare-") as tmp:
        result = anyio.run(
            lambda: compare_networks(
                Path(tmp), probes=args.probe, binary=exe, realistic_fake=not args.fast_fake
            )
        )
    if args.json:
        print(json.dumps({"fake": result.fake, "real": result.real}, indent=2, sort_keys=True))
    print(result.report())
    return 1 if result.differences else 0


if __name__ == "__main__":
    sys.exit(main())
