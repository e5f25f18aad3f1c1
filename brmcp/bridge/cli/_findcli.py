"""The ``brmcp-bridge find`` and ``add`` commands (BRIDGE.md §Finding bots
through directories): thin clients of the running daemon's discovery routes
(:mod:`.discovery`) on its admin surface.

::

    brmcp-bridge find QUERY [--max-price N] [--tag T]... [--json]
    brmcp-bridge add PROVIDER_UID [--via DIRECTORY_UID] [--per-call-cap N] [--per-day-cap N]
                     [--kx-timeout SECS]

``find`` waits for the daemon's answer as long as the directories may take
(:data:`~.discovery.FIND_TIMEOUT` plus ``approval_timeout_secs`` in approval
mode, when a priced ``search`` waits for the user's decision). ``add`` asks
whether the provider is a contact of the daemon's brclient; when it is not,
it asks a directory to introduce it, says what to do in brclient, and waits
for the key exchange; then it puts the provider on ``allowed_bots`` (the
caps given are the bridge's caps, for every bot) and prints the agent
configuration. Errors are :class:`~._adminclient.CLIError` lines.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from brmcp.bridge.base import PROG, cli_command, is_uid
from brmcp.bridge.find import FIND_TIMEOUT, KX_TIMEOUT, MAX_KX_TIMEOUT

from ._adminclient import (
    OTHER_DATADIR_HINT,
    REQUEST_TIMEOUT,
    AdminError,
    CLIError,
    Daemon,
    Disabled,
    NotRunning,
)
from ._adminclient import admin as _admin
from ._adminclient import locate as _locate

__all__ = ["add_arguments", "cmd_add", "cmd_find", "format_age"]


def add_arguments(command: str, parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``command`` (``find`` or ``add``) to its
    ``brmcp-bridge`` subcommand parser (named, with its help line, by
    :mod:`._main`)."""
    if command == "find":
        parser.add_argument("query", metavar="QUERY", help="words to look for in tool names and descriptions")
        parser.add_argument(
            "--max-price", type=int, default=0, metavar="N", help="only tools listed at N atoms or less"
        )
        parser.add_argument(
            "--tag", action="append", default=[], metavar="T", help="only providers with tag T"
        )
        return
    parser.add_argument("uid", metavar="PROVIDER_UID", help="the provider's 64-hex uid (from find)")
    parser.add_argument(
        "--via", metavar="DIRECTORY_UID", default=None, help="the directory that introduces you"
    )
    parser.add_argument("--per-call-cap", type=int, default=None, metavar="N", help="set per_call_cap_atoms")
    parser.add_argument("--per-day-cap", type=int, default=None, metavar="N", help="set per_day_cap_atoms")
    parser.add_argument(
        "--kx-timeout",
        type=float,
        default=KX_TIMEOUT,
        metavar="SECS",
        help="how long to wait for the key exchange (default: %(default)s)",
    )


def running_daemon(datadir: Path, what: str) -> Daemon:
    try:
        return _locate(datadir)
    except NotRunning as exc:
        raise CLIError(
            f"{what} needs the running daemon, and it is not running ({exc.detail}); start it with: "
            f"{cli_command(datadir)} ({OTHER_DATADIR_HINT})"
        ) from None


def admin_call(
    daemon: Daemon, method: str, path: str, body: Any = None, *, timeout: float = REQUEST_TIMEOUT
) -> Any:
    try:
        return _admin(daemon, method, path, body, timeout=timeout)
    except Disabled:
        raise CLIError(
            "directories are reached through the daemon's admin surface, which is off while the bridge is "
            f"disabled; enable it with: {cli_command(daemon.datadir)} settings set enabled=true"
        ) from None


def format_age(now: int, ts: Any) -> str:
    """How long before ``now`` the Unix time ``ts`` was (``5m ago``,
    ``3h ago``, ``2d ago``; ``in the future`` for a later one), or
    ``never`` when it is not a time."""
    if isinstance(ts, bool) or not isinstance(ts, int) or ts <= 0:
        return "never"
    delta = now - ts
    if delta < 0:
        return "in the future"
    for unit, seconds in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if delta >= seconds:
            return f"{delta // seconds}{unit} ago"
    return f"{delta}s ago"


def printable(value: Any) -> str:
    text = str(value)
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _price(claim: dict[str, Any]) -> str:
    if claim.get("pricing") == "dynamic":
        return "dynamic price"
    price = claim.get("priceAtoms")
    if isinstance(price, int) and not isinstance(price, bool):
        return "free" if price == 0 else f"{price:,} atoms"
    return "price not given"


def cmd_find(datadir: Path, args: argparse.Namespace) -> None:
    """``find QUERY``: every configured directory's hits, merged; one block
    per provider and tool, one line per directory that listed it. Problems
    of single directories go to stderr; all of them failing is an error."""
    if args.max_price < 0:
        raise CLIError(f"--max-price {args.max_price}: must be 0 (no ceiling) or more atoms")
    daemon = running_daemon(datadir, "find")
    settings = admin_call(daemon, "GET", "/admin/settings")
    directories = settings.get("directories") or []
    if not directories:
        raise CLIError(
            f"no directories configured; add one with: {cli_command(daemon.datadir)} settings set "
            "directories=<directory uid> (its operator gives you its uid and an invite to KX with it)"
        )
    approval = settings.get("mode") != "autopay"
    timeout = FIND_TIMEOUT + 15 + (float(settings.get("approval_timeout_secs") or 120) if approval else 0)
    if approval:
        print(
            f"{PROG}: asking {len(directories)} directory(ies); a priced search waits for your approval "
            f"(see: {cli_command(daemon.datadir)} approvals)",
            file=sys.stderr,
        )
    body = {"query": args.query, "tags": list(args.tag), "maxPriceAtoms": args.max_price}
    try:
        result = admin_call(daemon, "POST", "/admin/find", body, timeout=timeout)
    except AdminError as exc:
        raise CLIError(str(exc)) from None
    if args.json:
        print(json.dumps(result))
    else:
        _print_hits(result)
    answers = result.get("directories") or []
    for answer in answers:
        if answer.get("outcome") != "ok":
            print(f"{PROG}: {printable(answer.get('error', answer.get('outcome')))}", file=sys.stderr)
        elif answer.get("dropped"):
            print(
                f"{PROG}: directory {answer.get('directory')}: {answer['dropped']} malformed or surplus "
                "hit(s) dropped",
                file=sys.stderr,
            )
    if answers and all(a.get("outcome") != "ok" for a in answers):
        raise CLIError("no directory answered the search")


def _print_hits(result: dict[str, Any]) -> None:
    hits = result.get("hits") or []
    now = int(result.get("now") or 0)
    if not hits:
        print("no tools found")
        return
    for hit in hits:
        claims = hit.get("claims") or []
        first = claims[0] if claims else {}
        tags = ", ".join(printable(t) for t in first.get("tags") or [])
        print(
            f"{hit['providerUid']}  {printable(hit['tool'])}  {_price(first)}"
            + (f"  [{tags}]" if tags else "")
        )
        if first.get("description"):
            print(f"    {printable(first['description'])}")
        for claim in claims:
            verified = claim.get("lastVerifiedExecution")
            shown = (
                "never verified by a paid call" if not verified else f"verified {format_age(now, verified)}"
            )
            print(
                f"    said by directory {claim['directory']}: {_price(claim)}, {shown}, catalog checked "
                f"{format_age(now, claim.get('catalogCheckedAt'))}"
            )
    print(
        f"{len(hits)} tool(s); prices are advisory (the bot's own quote binds, within your caps); reach one "
        f"with: {PROG} add <provider uid>"
    )


def cmd_add(datadir: Path, args: argparse.Namespace) -> None:
    """``add PROVIDER_UID``: KX (through a directory's ``introduce`` when
    there is none yet), ``allowed_bots`` (and the caps given), then the
    agent configuration, as ``config-snippet`` prints it."""
    uid = args.uid.strip().lower()
    if not is_uid(uid):
        raise CLIError(f"provider uid {args.uid!r} is not 64 hex characters")
    if args.via is not None and not is_uid(args.via.strip()):
        raise CLIError(f"--via {args.via!r}: a directory uid is 64 hex characters")
    for flag, value in (("--per-call-cap", args.per_call_cap), ("--per-day-cap", args.per_day_cap)):
        if value is not None and value < 0:
            raise CLIError(f"{flag} {value}: must be 0 (never pay) or more atoms")
    if not 0 < args.kx_timeout <= MAX_KX_TIMEOUT:
        raise CLIError(
            f"--kx-timeout {args.kx_timeout}: must be more than 0 and at most {MAX_KX_TIMEOUT:.0f}"
        )
    daemon = running_daemon(datadir, "add")
    here = cli_command(daemon.datadir)
    try:
        contact = admin_call(daemon, "GET", f"/admin/contact/{uid}").get("contact")
        if contact is False:
            body = {"uid": uid} | ({"via": args.via.strip().lower()} if args.via else {})
            intro = admin_call(daemon, "POST", "/admin/introduce", body, timeout=REQUEST_TIMEOUT + 60)
            via = intro.get("via", "")
            print(
                f"{PROG}: directory {via} sent your brclient a KX suggestion toward {uid}"
                + (f" ({printable(intro['note'])})" if intro.get("note") else "")
                + ".\n"
                # brclient shows "/mi <the directory's nick> <uid>"; its /mi also
                # takes a uid for the nick (bisonrelay's brclient/appstate.go,
                # KXSuggestion; client/remoteuser.go, byNick).
                f"{PROG}: accept the KX suggestion: in brclient type the /mi command it shows (/mi "
                f"<the directory's nick> {uid}), or: /mi {via} {uid}; waiting up to "
                f"{args.kx_timeout:.0f} s for the key exchange...",
                file=sys.stderr,
                flush=True,
            )
            admin_call(
                daemon,
                "POST",
                "/admin/wait-kx",
                {"uid": uid, "timeout_secs": args.kx_timeout},
                timeout=args.kx_timeout + REQUEST_TIMEOUT,
            )
            print(f"{PROG}: key exchange with {uid} completed", file=sys.stderr)
        elif contact is None:
            print(
                f"{PROG}: the daemon cannot tell whether {uid} is a contact of its brclient; allowing it "
                "anyway (if calls fail with 'bot unavailable', KX with it first, e.g. in brclient: "
                f"/mi <directory> {uid})",
                file=sys.stderr,
            )
        settings = admin_call(daemon, "GET", "/admin/settings")
        allowed = list(settings.get("allowed_bots") or [])
        changes: dict[str, Any] = {}
        if uid not in {b.lower() for b in allowed}:
            # A delta, appended to the list in force when the daemon commits
            # it: an approval committed since the read above is kept.
            changes["add_allowed_bots"] = [uid]
        if args.per_call_cap is not None:
            changes["per_call_cap_atoms"] = args.per_call_cap
        if args.per_day_cap is not None:
            changes["per_day_cap_atoms"] = args.per_day_cap
        if changes:
            applied = admin_call(daemon, "PUT", "/admin/settings", changes)
            print(
                f"{PROG}: allowed {uid}; caps for every bot: per_call_cap_atoms="
                f"{applied.get('per_call_cap_atoms')} per_day_cap_atoms={applied.get('per_day_cap_atoms')} "
                f"(mode {applied.get('mode')}; change them with: {here} settings set KEY=VALUE)",
                file=sys.stderr,
            )
        else:
            print(f"{PROG}: {uid} is already allowed", file=sys.stderr)
        snippet = admin_call(daemon, "GET", f"/admin/config-snippet/{uid}")
    except AdminError as exc:
        raise CLIError(str(exc)) from None
    if args.json:
        print(json.dumps(snippet))
        return
    print("# .mcp.json (Claude Code, Cursor and other agents):")
    print(json.dumps(snippet["mcp_json"], indent=2))
    print()
    print("# Claude Code:")
    print(snippet["claude_command"])
