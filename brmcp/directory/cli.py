"""The ``brmcpdir`` command: a directory bot over a running brclient
(docs/directory.md §Running brmcpdir; karamble/brmcp, ``cmd/brmcpdir/main.go``).

``brmcpdir --datadir DIR`` (Go's single-dash ``-datadir DIR`` is accepted
too; default ``~/.brmcpdir``) reads the bot config ``DIR/brmcpdir.conf``
(bisonbotkit's format: ``brrpcurl``, the certificate paths, ``debug``,
``logfile``; ``brstatusurl`` turns ``introduce`` on through brclientd's
status server) and the policy ``DIR/brmcpdir.json``. On the first run the
missing files are written, the command says what to edit and exits 0.
Then it serves until SIGINT/SIGTERM:

* PMs: envelopes to the directory's harness, plain chat answered with how
  to reach the directory from an agent (once per sender per hour);
* received tips: credited to the sender's balance whoever sent them,
  deduplicated by brclient's sequence id, then the sender's funding is
  re-checked;
* the directory's own payments (tests, snapshot purchases): brclient tips,
  confirmed by the tip-progress stream;
* completed key exchanges: a lead pursuit waiting on one sends its invite;
  lead introductions are brclient's ``MediateKX``.

One process per data directory (``DIR/brmcpdir.lock``) and one harness per
brclient. Errors are one line on stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path

import anyio
import anyio.abc

from .._ops.botlog import LEVEL_CHOICES, LogSetupError, bot_logging
from .._ops.console import add_version
from .._ops.goflags import GoFlagError, go_style
from .._ops.lockfile import acquire_datadir
from ..clientrpc import (
    BotConfig,
    Client,
    ClientrpcConfigError,
    ClientrpcError,
    TipProgressEvent,
    load_bot_config,
    load_or_create_bot_config,
)
from ..clientrpc._glue import Acker
from ..clientrpc.statusserver import StatusClient
from ..clientrpc.tipmatcher import TipMatcher
from ..clientrpc.tippayer import TipPayer
from ..server import HarnessError, run_bot
from ._service import Directory, DirectoryConfig
from .model import (
    POLICY_FILENAME,
    Policy,
    PolicyError,
    SnapshotError,
    load_policy,
    policy_template,
)
from .payer import Suggester

__all__ = [
    "BOT_CONFIG_NAME",
    "LOCK_FILE",
    "PROG",
    "ClientIntroducer",
    "ClientTips",
    "StatusSuggester",
    "default_datadir",
    "main",
    "run",
    "serve_directory",
]

log = logging.getLogger("brmcp.directory")

PROG = "brmcpdir"
#: The bot config's name: ``<datadir>/brmcpdir.conf``.
BOT_CONFIG_NAME = "brmcpdir"
LOCK_FILE = "brmcpdir.lock"


class DirectoryRunError(Exception):
    """The daemon cannot run (a lock is held, a file is unusable)."""


def default_datadir() -> Path:
    """Go's ``dcrutil.AppDataDir("brmcpdir", false)``: ``~/.brmcpdir``
    (Linux/BSD), ``~/Library/Application Support/Brmcpdir`` (macOS),
    ``%LOCALAPPDATA%\\Brmcpdir`` (Windows)."""
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Brmcpdir"
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        return (Path(local) if local else home / "AppData" / "Local") / "Brmcpdir"
    return home / ".brmcpdir"


class ClientTips:
    """The directory's :class:`~.client.Payer`: brclient tips through
    :class:`brmcp.bridge.TipPayer`, confirmed by the terminal tip-progress
    event the host hands to :meth:`on_tip_progress`."""

    def __init__(self, client: Client) -> None:
        self.matcher = TipMatcher()
        self._tips = TipPayer(client, self.matcher)

    async def pay(self, payee_uid: str, atoms: int) -> None:
        await self._tips.pay(payee_uid, atoms)

    def on_tip_progress(self, event: TipProgressEvent) -> None:
        if not event.final:
            self.matcher.stall(event.uid, event.amount_matoms, event.attempt_err)
            return
        error = None if event.completed else (event.attempt_err or "tip attempt failed")
        self.matcher.resolve(event.uid, event.amount_matoms, error)


class ClientIntroducer:
    """The :class:`~.federation.Introducer` over brclient's ``MediateKX``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def introduce(self, mediator_uid: str, target_uid: str) -> None:
        await self._client.mediate_kx(mediator_uid, target_uid)


class StatusSuggester:
    """The :class:`~.federation.Suggester` over brclientd's status server
    (``POST /contacts/suggest-kx``)."""

    def __init__(self, status: StatusClient) -> None:
        self._status = status

    async def suggest(self, invitee_uid: str, target_uid: str) -> None:
        await self._status.suggest_kx(invitee_uid, target_uid)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description="A verified directory of brmcp tool providers.")
    parser.add_argument(
        "--datadir",
        default=str(default_datadir()),
        help="data directory (bot config, policy, ledger, index, snapshot key, admin log)",
    )
    parser.add_argument("--log-level", choices=LEVEL_CHOICES, help="replaces the bot config's debug key")
    add_version(parser, PROG)
    raw = list(sys.argv[1:] if argv is None else argv)
    try:
        return parser.parse_args(go_style(raw, {"datadir", "log-level"}, {"version"}))
    except GoFlagError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _prepare(datadir: Path) -> list[Path]:
    """Create the data directory and the missing config files; returns the
    files written."""
    datadir.mkdir(mode=0o700, parents=True, exist_ok=True)
    created: list[Path] = []
    _, made = load_or_create_bot_config(datadir, BOT_CONFIG_NAME)
    if made:
        created.append(datadir / f"{BOT_CONFIG_NAME}.conf")
    policy_path = datadir / POLICY_FILENAME
    if not policy_path.exists():
        policy_path.write_text(policy_template())
        policy_path.chmod(0o600)
        created.append(policy_path)
    return created


def _first_run_text(created: list[Path]) -> str:
    names = "\n".join(f"  {path}" for path in created)
    return (
        f"{PROG}: wrote\n{names}\n"
        f"Edit {BOT_CONFIG_NAME}.conf to point at your brclient (brrpcurl and the certificate paths; "
        "brstatusurl enables introductions), add your operator uids to admin_uids in "
        f"{POLICY_FILENAME} (zero values keep the defaults), then run {PROG} again."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0 after a clean stop
    or a first run, 1 on an error)."""
    args = _parse_args(argv)
    datadir = Path(args.datadir).expanduser()
    try:
        created = _prepare(datadir)
    except (OSError, ClientrpcConfigError) as exc:
        print(f"{PROG}: cannot prepare {datadir}: {exc}", file=sys.stderr)
        return 1
    if created:
        print(_first_run_text(created), flush=True)
        return 0
    conf = datadir / f"{BOT_CONFIG_NAME}.conf"
    try:
        bot_config = load_bot_config(conf)
        policy = load_policy(datadir / POLICY_FILENAME)
    except (ClientrpcConfigError, PolicyError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(bot_logging(bot_config, level=args.log_level, source=str(conf)))
        except LogSetupError as exc:
            print(f"{PROG}: {exc} (logfile in {conf})", file=sys.stderr)
            return 1
        try:
            anyio.run(partial(run, datadir, bot_config, policy))
        except KeyboardInterrupt:  # a second Ctrl-C while stopping
            return 0
        except ClientrpcConfigError as exc:
            # Raised while connecting: name the file that holds the key.
            where = "" if str(conf) in str(exc) else f" (set in {conf})"
            print(f"{PROG}: {exc}{where}", file=sys.stderr)
            return 1
        except (DirectoryRunError, HarnessError, SnapshotError) as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
    return 0


async def run(datadir: Path, bot_config: BotConfig, policy: Policy) -> None:
    """Serve the directory in ``datadir`` through the brclient of
    ``bot_config`` until SIGINT/SIGTERM. Raises :class:`DirectoryRunError`
    when another brmcpdir holds the data directory, HarnessError or
    SnapshotError for unusable files, ClientrpcConfigError for an unusable
    bot config (certificates, ``brstatusurl``)."""
    if not policy.admin_uids:
        log.warning(
            "admin_uids is empty: the admin tools are unreachable until %s is edited",
            datadir / POLICY_FILENAME,
        )
    with contextlib.ExitStack() as locks:
        locks.enter_context(
            await anyio.to_thread.run_sync(
                partial(acquire_datadir, datadir, LOCK_FILE, what=PROG, error=DirectoryRunError)
            )
        )
        client = Client.from_config(bot_config)
        payer = ClientTips(client)
        suggester: Suggester | None = None
        if bot_config.brstatusurl:
            suggester = StatusSuggester(StatusClient.from_config(bot_config))
            log.info("introductions enabled via %s", bot_config.brstatusurl)
        else:
            log.info("brstatusurl not set: the introduce tool is disabled")
        directory = Directory(
            DirectoryConfig(datadir, policy, payer, introducer=ClientIntroducer(client), suggester=suggester)
        )
        await serve_directory(directory, client, payer)


async def serve_directory(
    directory: Directory,
    client: Client,
    payer: ClientTips,
    *,
    until: Callable[[], Awaitable[None]] | None = None,
    task_status: anyio.abc.TaskStatus[Directory] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``directory`` through ``client`` (not yet entered: this
    enters it) with ``payer``'s tips, until ``until()`` returns (default:
    SIGINT or SIGTERM). The started value is the directory, once it runs.
    Leaving stops the directory's tasks first, then the bot."""

    async def on_connected() -> None:
        try:
            identity = await client.user_public_identity()
        except (ClientrpcError, TimeoutError) as exc:
            log.warning("connected to brclient at %s, but its identity is unknown: %s", client.url, exc)
            return
        directory.set_self_uid(identity.uid, identity.nick)
        log.info("connected as %s (uid %s) through brclient at %s", identity.nick, identity.uid, client.url)

    async def on_tip_received(uid: str, atoms: int) -> None:
        if atoms > 0:
            await directory.funding_changed(uid)

    async with client, anyio.create_task_group() as outer:

        async def on_chat(uid: str, text: str) -> None:
            reply = await directory.chat_reply(uid, text)
            if reply is not None:
                outer.start_soon(_send_chat, client, directory, uid, reply)

        await outer.start(
            partial(
                run_bot,
                directory.harness,
                client,
                on_pm=on_chat,
                on_tip_received=on_tip_received,
                on_tip_progress=payer.on_tip_progress,
                on_connected=on_connected,
            )
        )
        try:
            async with directory.attached(), anyio.create_task_group() as inner:
                inner.start_soon(_kx_loop, directory, client)
                log.info(
                    "directory %r serving through %s (snapshot key %s)",
                    directory.policy.name,
                    client.url,
                    directory.public_key[:16],
                )
                task_status.started(directory)
                await (until or _until_signal)()
                inner.cancel_scope.cancel()
        finally:
            outer.cancel_scope.cancel()


async def _send_chat(client: Client, directory: Directory, uid: str, reply: str) -> None:
    try:
        await client.send_pm(uid, reply)
    except (ClientrpcError, TimeoutError) as exc:
        directory.chat_help.forget(uid)
        log.warning("plain chat from %s: the how-to-connect reply was not sent: %s", uid, exc)


async def _kx_loop(directory: Directory, client: Client) -> None:
    """Completed key exchanges resume lead pursuits; each is acked after."""
    acker = Acker("KX", client.ack_kx_completed)
    stream = client.kx_stream()
    try:
        async for kx in stream:
            directory.notify_kx(kx.uid)
            await acker.ack(kx.sequence_id)
    finally:
        stream.close()


async def _until_signal() -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("%s: stopping", signal.Signals(signum).name)
            return
