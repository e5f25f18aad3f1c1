"""Running the ``brmcp-bridge`` daemon (no command given): the first run
writes ``brmcp-bridge.conf`` and ``mcpclient.json`` and says what to edit;
later runs set up logging from the conf file and serve until a signal
(BRIDGE.md "Running the daemon"). Kept apart from :mod:`._main` because it
imports the whole bridge and the MCP SDK, which the other commands do not
need."""

from __future__ import annotations

import argparse
import contextlib
import sys
from functools import partial
from pathlib import Path

import anyio

from brmcp._ops.botlog import LogSetupError, bot_logging
from brmcp.bridge.base import PROG, SETTINGS_FILE, BridgeError, Settings, cli_command, save_settings
from brmcp.bridge.daemon import BOT_CONFIG_NAME, BridgeDaemon, load_daemon_config
from brmcp.clientrpc import BotConfig, ClientrpcConfigError

__all__ = ["run_daemon"]


def run_daemon(args: argparse.Namespace, datadir: Path) -> int:
    if args.metrics:
        # Before anything is created: a taken port leaves nothing behind.
        from brmcp.metrics import metrics_address_problem

        problem = metrics_address_problem(args.metrics)
        if problem is not None:
            print(f"{PROG}: {problem}", file=sys.stderr)
            return 1
    conf = datadir / f"{BOT_CONFIG_NAME}.conf"
    try:
        cfg, created = load_daemon_config(datadir)
    except ClientrpcConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{PROG}: cannot create {datadir}: {exc}", file=sys.stderr)
        return 1
    if created:
        settings_path = datadir / SETTINGS_FILE
        made = [conf]
        if not settings_path.exists():
            try:
                save_settings(settings_path, Settings())
            except BridgeError as exc:
                print(f"{PROG}: {exc}", file=sys.stderr)
                return 1
            made.append(settings_path)
        print(_first_run_text(datadir, made, cfg), flush=True)
        return 0
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(bot_logging(cfg, level=args.log_level, source=str(conf)))
        except LogSetupError as exc:
            print(f"{PROG}: {exc} (logfile in {conf})", file=sys.stderr)
            return 1
        return _serve(args, datadir, cfg, created)


def _first_run_text(datadir: Path, created: list[Path], cfg: BotConfig) -> str:
    """What the first run wrote and what to do next (like brmcp-serve's)."""
    conf = datadir / f"{BOT_CONFIG_NAME}.conf"
    here = cli_command(datadir)
    lines = [f"{PROG}: created {', '.join(str(p) for p in created)}", "", "Before the next run:"]
    lines += [
        f"  1. {conf} says how to reach your brclient. The defaults expect brclient's files",
        f"     in {Path(cfg.servercertpath).parent} and its clientrpc at {cfg.brrpcurl}: enable it in",
        "     brclient.conf, section [clientrpc], with 'jsonrpclisten = 127.0.0.1:7676', and adjust",
        "     brrpcurl, servercertpath, clientcertpath and clientkeypath if yours differ. (With",
        "     brmcp-fakebr, 'brmcp-fakebr --write-confs DIR' writes a ready file instead.)",
        "  2. Allow the bots you want to call, set the caps (atoms; 0 means never pay) and enable:",
        f"     {here} settings set enabled=true allowed_bots=<bot uid> \\",
        "         per_call_cap_atoms=20000 per_day_cap_atoms=100000",
        "     (mode=approval, the default, asks you before each payment; mode=autopay pays within the caps)",
        "",
        f"Then start it: {here}",
        f"and give your agent the output of: {here} config-snippet <bot uid>",
    ]
    return "\n".join(lines)


def _serve(args: argparse.Namespace, datadir: Path, cfg: BotConfig, created: bool) -> int:
    conf = datadir / f"{BOT_CONFIG_NAME}.conf"
    try:
        daemon = BridgeDaemon.from_datadir(
            datadir,
            listen=args.listen,
            bot_config=cfg,
            config_created=created,
            notify_command=args.notify_command,
        )
    except ClientrpcConfigError as exc:
        print(f"{PROG}: {exc} (see {conf})", file=sys.stderr)
        return 1
    except (BridgeError, ValueError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if args.metrics:
        try:
            daemon.enable_metrics(args.metrics)
        except ValueError as exc:
            print(f"{PROG}: --metrics: {exc}", file=sys.stderr)
            return 1
    try:
        anyio.run(partial(daemon.run, handle_signals=True))
    except BridgeError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0
