"""Shared plumbing of the console commands: ``--version`` and a quiet exit
when the reader of stdout goes away (``brmcp-bridge settings | head``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

__all__ = ["EXIT_BROKEN_PIPE", "add_version", "quiet_broken_pipe"]

#: The status of a command whose stdout reader went away (128 + SIGPIPE, as
#: a shell reports a tool killed by SIGPIPE).
EXIT_BROKEN_PIPE = 141


def add_version(parser: argparse.ArgumentParser, prog: str) -> None:
    """Add ``--version``, printing ``<prog> <brmcp version>`` and exiting 0."""
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"{prog} {__version__}")


def quiet_broken_pipe(run: Callable[[], int]) -> int:
    """Run ``run`` and flush stdout; when the reader of stdout closed the
    pipe, return :data:`EXIT_BROKEN_PIPE` without a traceback (stdout is
    pointed at the null device so the interpreter's final flush is silent)."""
    try:
        status = run()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
        return EXIT_BROKEN_PIPE
    return status
