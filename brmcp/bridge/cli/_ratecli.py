"""The ``brmcp-bridge rate`` command (BRIDGE.md §Signed receipts,
"Rating"): rate a bot at the directories with a receipt the bridge kept,
through the running daemon's ``POST /admin/rate`` (:mod:`.rating`).

::

    brmcp-bridge rate RECEIPT_ID --stars N [--comment TEXT] [--directory UID] [--json]

``RECEIPT_ID`` is a receipt id or its first characters (at least
:data:`~.rating.MIN_PREFIX`, as ``receipts`` prints them). One line per
directory asked: ``rated``, or why not. Fails when no directory took the
rating. Errors are :class:`~._adminclient.CLIError` lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from brmcp.bridge.base import PROG
from brmcp.bridge.find import MAX_COMMENT_CHARS, RATE_TIMEOUT

from ._adminclient import AdminError, CLIError
from ._findcli import admin_call, printable, running_daemon

__all__ = ["add_arguments", "cmd_rate"]


def add_arguments(command: str, rate: argparse.ArgumentParser) -> None:
    """Add the arguments of ``rate`` to its ``brmcp-bridge`` subcommand
    parser (named, with its help line, by :mod:`._main`)."""
    rate.add_argument("receipt", metavar="RECEIPT_ID", help="a receipt id (or its first 8+ characters)")
    rate.add_argument("--stars", type=int, required=True, metavar="N", help="1 (poor) to 5 (excellent)")
    rate.add_argument("--comment", default="", metavar="TEXT", help=f"at most {MAX_COMMENT_CHARS} characters")
    rate.add_argument("--directory", default=None, metavar="UID", help="only this configured directory")


def cmd_rate(datadir: Path, args: argparse.Namespace) -> None:
    """``rate RECEIPT_ID --stars N``: see the module."""
    if not 1 <= args.stars <= 5:
        raise CLIError(f"--stars {args.stars}: use a whole number from 1 to 5")
    if len(args.comment) > MAX_COMMENT_CHARS:
        raise CLIError(f"--comment: at most {MAX_COMMENT_CHARS} characters, got {len(args.comment)}")
    daemon = running_daemon(datadir, "rate")
    settings = admin_call(daemon, "GET", "/admin/settings")
    approval = settings.get("mode") != "autopay"
    timeout = RATE_TIMEOUT + 15 + (float(settings.get("approval_timeout_secs") or 120) if approval else 0)
    body: dict[str, Any] = {"receipt": args.receipt, "stars": args.stars}
    if args.comment:
        body["comment"] = args.comment
    if args.directory is not None:
        body["directory"] = args.directory
    try:
        result = admin_call(daemon, "POST", "/admin/rate", body, timeout=timeout)
    except AdminError as exc:
        raise CLIError(str(exc)) from None
    if getattr(args, "json", False):
        print(json.dumps(result))
    results = result.get("results") if isinstance(result, dict) else None
    if not isinstance(results, list) or not results:
        raise CLIError("no directory was asked (every configured directory is the rated bot itself)")
    for entry in results:
        if not isinstance(entry, dict):
            continue
        line = f"directory {printable(entry.get('directory'))}: {printable(entry.get('outcome'))}"
        message = entry.get("message")
        if message:
            line += f": {printable(message)}"
        if not getattr(args, "json", False):
            print(line, file=sys.stdout if entry.get("outcome") == "rated" else sys.stderr)
    if result.get("rated") is not True:
        raise CLIError(f"no directory took the rating of receipt {printable(result.get('receiptId'))[:12]}")
    if not getattr(args, "json", False):
        provider, receipt = printable(result.get("provider")), printable(result.get("receiptId"))[:12]
        print(f"{PROG}: rated {provider} with receipt {receipt}")
