"""The ``brmcp demo`` command line (:func:`demo_main`): logging, the checks
that fail in one line before anything starts (Go for ``--network real``, the
bridge's port), the run, and the exit status."""

from __future__ import annotations

import logging
import sys
import time

import anyio

from .options import NO_GO, DemoError, DemoOptions, check_port
from .run import run_demo

__all__ = ["demo_main"]


def demo_main(options: DemoOptions, *, verbose: bool = False) -> int:
    """Run the demo from the command line; returns the exit status (0 done,
    1 failed with one line on stderr, 130 interrupted)."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.ERROR,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    real = options.network == "real"
    if real:
        from ..testing.brnet import go_executable

        if go_executable() is None:
            print(f"brmcp demo: {NO_GO}", file=sys.stderr)
            return 1
    try:
        check_port(options.port)
    except DemoError as exc:
        print(f"brmcp demo: {exc}", file=sys.stderr)
        return 1
    kind = "a real Bison Relay network (brnet)" if real else "a simulated Bison Relay network"
    print(f"brmcp demo: an MCP agent pays a bot per call over {kind}")
    print()
    started = time.monotonic()
    try:
        anyio.run(run_demo, options)
    except DemoError as exc:
        print(f"\nbrmcp demo failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nbrmcp demo interrupted", file=sys.stderr)
        return 130
    print(f"Total time {time.monotonic() - started:.1f} s.")
    return 0
