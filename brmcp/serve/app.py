"""The brmcp-serve application as an importable async API (the console
command and ``brmcp demo`` run this same code).

::

    app = ServeApp.from_datadir("~/.brmcp-serve")
    async with anyio.create_task_group() as tg:
        await tg.start(app.run)          # connected streams subscribed, serving
        ...                              # app.harness, app.router, app.reload()
        tg.cancel_scope.cancel()
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from brmcp.directory.provider import ClientTipPayer, Payer, Registrant, RegistrantError

from .._ops.clock import Clock
from .._ops.lockfile import FileLock, acquire_datadir
from ..clientrpc import BotConfig, Client, ClientrpcError, PublicIdentity, load_bot_config
from ..gateway import (
    PRICES_FILE,
    Gateway,
    PriceError,
    PriceTable,
    UpstreamConfig,
    UpstreamConfigError,
    load_prices,
    load_upstream_block,
)
from ..metrics import MetricsEndpoint, ServeMetrics
from ..protocol.receipts import RECEIPT_KEY_FILENAME, ReceiptError, ReceiptSigner
from ..server import Harness, HarnessConfig, HarnessError, lock_brclient, run_bot
from ..server.chathelp import DEFAULT_TEXT, ChatHelp, render
from ..transport.router import Router
from ._drain import FLUSH_GRACE, STOP_GRACE, DrainReport, log_stopped, within
from .config import (
    SERVE_CONFIG_FILE,
    ServeConfig,
    ServeConfigError,
    bot_config_path,
    load_serve_config,
)
from .tools import FORTUNE_PRICE_ATOMS, register_tools

__all__ = [
    "FLUSH_GRACE",
    "IMPLEMENTATION_NAME",
    "IMPLEMENTATION_VERSION",
    "STOP_GRACE",
    "DrainReport",
    "ServeApp",
]

log = logging.getLogger("brmcp.serve")

#: The lock that keeps a second brmcp-serve off a data directory in use.
LOCK_FILE = "brmcp-serve.lock"
#: The MCP implementation info served with the example tools, as the Go
#: reference's (karamble/brmcp, `cmd/brmcp-serve/main.go`).
IMPLEMENTATION_NAME = "brmcp-example"
#: The implementation name when selling an upstream MCP server (brmcp/gateway).
GATEWAY_NAME = "brmcp-gateway"
IMPLEMENTATION_VERSION = "0.1.0"


class ServeApp:
    """The brmcp-serve bot: a :class:`~brmcp.server.Harness` serving the
    example tools ``echo`` and ``fortune`` (or an upstream's tools) through a
    running brclient (clientrpc).

    ``datadir`` holds ``brmcp.json``, ``brmcp-serve.conf`` and the harness
    database; ``bot_config`` says how to reach brclient; ``config`` is the
    parsed ``brmcp.json``. ``client_options`` go to
    :class:`~brmcp.clientrpc.Client` (timeouts, backoff, keepalive); ``rng``
    picks fortunes. Construction opens the database and reads the
    certificates; it raises :class:`~brmcp.clientrpc.ClientrpcConfigError`
    (bad URL or certificate paths, naming the file) or
    :class:`~brmcp.server.HarnessError` (unusable database, or a
    ``receiptkey.json`` that cannot be read or created, naming the file).

    A plain-chat PM (not a brmcp envelope) gets one reply per sender per
    hour saying how to reach the bot from an agent, unless ``chat_help`` in
    ``brmcp.json`` is false (a string replaces the text;
    :mod:`brmcp.server.chathelp`). Envelopes are never answered with chat.

    Attributes: :attr:`harness`, :attr:`client`, :attr:`config` (in force),
    :attr:`router` (once running), :attr:`identity` (brclient's own, once
    connected), :attr:`chat_help` and :attr:`chat_replies` (the plain-chat
    reply's throttle and count), :attr:`registrant` (with a ``directory``
    block, else None).

    With a ``directory`` block in ``brmcp.json`` the bot (example tools or
    gateway alike) lists itself in brmcp directories through a
    :class:`~brmcp.directory.provider._registrant.Registrant`: it serves the free
    ``listing_invite`` tool beside the others and, once connected,
    registers at every ``register_at_uids`` directory, paying listing costs
    under the block's ``auto_fund`` policy with brclient tips (or
    ``directory_payer``). The directories the block names are admitted as
    callers besides ``allowed_uids`` (a directory crawls and test-calls the
    bots it lists), logged once at INFO; the block is read only at start,
    so a reload keeps those directories admitted.
    """

    def __init__(
        self,
        datadir: str | os.PathLike[str],
        bot_config: BotConfig,
        config: ServeConfig,
        *,
        client_options: Mapping[str, Any] | None = None,
        rng: random.Random | None = None,
        upstream: UpstreamConfig | None = None,
        prices: PriceTable | None = None,
        directory_payer: Payer | None = None,
    ) -> None:
        self.datadir = Path(datadir)
        self.bot_config = bot_config
        self.client = Client.from_config(bot_config, **dict(client_options or {}))
        #: The directories of the ``directory`` block, admitted as callers (read at start).
        self.directory_uids = config.directory_uids
        try:
            #: Signs receipts (WIRE.md §Signed receipts); its key is ``receiptkey.json``.
            self.receipt_signer = ReceiptSigner.load_or_create(self.datadir / RECEIPT_KEY_FILENAME)
        except ReceiptError as exc:
            raise HarnessError(str(exc)) from None
        self.harness = Harness(
            HarnessConfig(
                data_dir=self.datadir,
                store=config.store,
                allowed_peers=self._admitted(config),
                calls_per_minute=config.rate,
                name=GATEWAY_NAME if upstream is not None else IMPLEMENTATION_NAME,
                version=IMPLEMENTATION_VERSION,
                tools_list_changed=upstream is not None,
                receipt_signer=self.receipt_signer,
                receipts=config.receipts,
                pool=config.pool,
            )
        )
        #: The gateway selling an existing MCP server (``--upstream``), else None.
        self.gateway: Gateway | None = None
        if upstream is None:
            register_tools(self.harness, rng)
        else:
            self.gateway = Gateway(self.harness, upstream, prices or PriceTable(), base_dir=self.datadir)
        self.config = config
        #: Lists this bot in directories (the ``directory`` block), else None.
        self.registrant: Registrant | None = None
        #: The registrant's payer: brclient tips unless ``directory_payer`` was given.
        self.directory_payer: Payer | None = None
        if config.directory is not None:
            self.directory_payer = directory_payer or ClientTipPayer(self.client)
            self.registrant = Registrant(config.directory, payer=self.directory_payer, data_dir=self.datadir)
            self.registrant.register_tools(self.harness)
            if self.directory_uids:
                log.info(
                    "%s: admitting the directories of the directory block as callers (they crawl and "
                    "test-call this bot): %s",
                    self.config_path,
                    ", ".join(self.directory_uids),
                )
        self.router: Router | None = None
        self.identity: PublicIdentity | None = None
        #: The Prometheus endpoint (:meth:`enable_metrics`), or None.
        self.metrics_endpoint: MetricsEndpoint | None = None
        #: The throttle of the plain-chat reply (``chat_help`` in brmcp.json).
        self.chat_help = ChatHelp()
        #: Plain-chat replies decided on so far (each is then sent in the background).
        self.chat_replies = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self._ran = False
        self._draining = False
        self._stopping_at: float | None = None

    def enable_metrics(self, address: str) -> MetricsEndpoint:
        """Count calls, charges, refunds, tips and errors in a
        :class:`~brmcp.metrics.ServeMetrics` and serve them at
        ``http://<address>/metrics`` (loopback only) while :meth:`run` runs.
        Raises ValueError for a bad or non-loopback address."""
        metrics = ServeMetrics()
        endpoint = MetricsEndpoint(metrics.registry, address)
        metrics.watch_router(lambda: self.router)
        self.harness.metrics = metrics
        self.metrics_endpoint = endpoint
        return endpoint

    @classmethod
    def from_datadir(
        cls,
        datadir: str | os.PathLike[str],
        *,
        client_options: Mapping[str, Any] | None = None,
        rng: random.Random | None = None,
        bot_config: BotConfig | None = None,
        upstream: UpstreamConfig | None = None,
    ) -> ServeApp:
        """Load ``<datadir>/brmcp-serve.conf`` (unless ``bot_config``, already
        read from it, is given) and ``<datadir>/brmcp.json``. With an
        ``upstream`` (the command line's) or an ``upstream`` block in
        ``brmcp.json``, the app sells that MCP server at the prices of
        ``<datadir>/prices.json`` instead of serving the example tools.
        Raises :class:`ServeConfigError` (a file missing or invalid, naming
        it), :class:`~brmcp.clientrpc.ClientrpcConfigError` or
        :class:`~brmcp.server.HarnessError` (see the class)."""
        root = Path(datadir).expanduser()
        if bot_config is None:
            conf = bot_config_path(root)
            if not conf.exists():
                raise ServeConfigError(f"{conf}: file not found (run brmcp-serve once to create it)")
            bot_config = load_bot_config(conf)
        config = load_serve_config(root / SERVE_CONFIG_FILE)
        prices: PriceTable | None = None
        try:
            if upstream is None:
                upstream = load_upstream_block(root / SERVE_CONFIG_FILE)
            if upstream is not None:
                # Fail now on a missing variable or headers file.
                upstream.headers(root)
                upstream.process_env()
                prices = load_prices(root / PRICES_FILE)
        except (UpstreamConfigError, PriceError) as exc:
            raise ServeConfigError(str(exc)) from None
        return cls(
            root, bot_config, config, client_options=client_options, rng=rng, upstream=upstream, prices=prices
        )

    @property
    def config_path(self) -> Path:
        """``<datadir>/brmcp.json``."""
        return self.datadir / SERVE_CONFIG_FILE

    def _admitted(self, config: ServeConfig) -> tuple[str, ...]:
        """The callers let in: ``allowed_uids`` and the start's directories."""
        return tuple(dict.fromkeys((*config.allowed_uids, *self.directory_uids)))

    async def start_registrant(self, router: Router, tg: anyio.abc.TaskGroup) -> bool:
        """Run :attr:`registrant` on ``router`` in ``tg`` (registering at its
        ``register_at_uids`` directories in the background). Returns False,
        logging the reason at ERROR, when there is no registrant or its fund
        history is unreadable (the bot then serves without one, as the Go
        reference does)."""
        if self.registrant is None:
            return False
        try:
            await tg.start(self.registrant.run, router)
        except RegistrantError as exc:
            log.error("directory registrant disabled: %s", exc)
            return False
        return True

    def reload(self) -> ServeConfig:
        """Re-read ``brmcp.json`` (and, when selling an upstream,
        ``prices.json``) and apply the allowlist, rate, ``chat_help`` and prices at once
        (no restart; sessions already open keep running, but every new
        message is checked against the new allowlist). Raises
        :class:`ServeConfigError` and keeps the settings in force when a
        file is invalid, or when ``prices.json`` prices a tool the upstream
        does not list (:meth:`~brmcp.gateway.Gateway.set_prices`). The
        ``upstream`` block is read only at start.
        This is what SIGHUP does (followed there by
        :meth:`release_held_tips`, for the uids the new allowlist allows)."""
        config = load_serve_config(self.config_path)
        prices: PriceTable | None = None
        if self.gateway is not None:
            try:
                prices = load_prices(self.datadir / PRICES_FILE)
                self.gateway.set_prices(prices)
            except PriceError as exc:
                raise ServeConfigError(str(exc)) from None
            log.info("reloaded %s", self.datadir / PRICES_FILE)
        self.harness.set_allowed_peers(self._admitted(config))
        self.harness.set_calls_per_minute(config.rate)
        self.harness.config.receipts = config.receipts
        self.config = config
        log.info(
            "reloaded %s: %d allowed caller(s), %d calls per minute",
            self.config_path,
            len(config.allowed_uids),
            config.rate,
        )
        self._warn_if_closed()
        return config

    async def release_held_tips(self) -> int:
        """Credit, exactly once, the tips held for senders that the
        allowlist in force now allows (WIRE.md §Payments, "Tips from
        senders not allowed"; SIGHUP runs it after :meth:`reload`). Returns
        the atoms credited; a ledger failure is logged and leaves them held
        (the sender's next call or tip, or the next start, credits them)."""
        try:
            return await self.harness.release_held_tips()
        except Exception as exc:
            log.error("tips held for senders not allowed not credited after the reload: %s", exc)
            return 0

    def _warn_if_closed(self) -> None:
        if not self.config.allowed_uids:
            log.warning(
                "NO CALLER IS ALLOWED: allowed_uids in %s is empty, so MCP messages from every caller are "
                "ignored (their requests get no answer and time out). Add the 64-hex Bison Relay uids of "
                "your users, then send SIGHUP (kill -HUP %d) to reload.",
                self.config_path,
                os.getpid(),
            )

    async def run(
        self,
        *,
        handle_signals: bool = False,
        task_status: anyio.abc.TaskStatus[ServeApp] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Connect to brclient and serve until cancelled or :meth:`stop`
        (or, with ``handle_signals``, until SIGINT/SIGTERM, which run
        :meth:`stop`, a second one stopping at once; SIGHUP reloads
        ``brmcp.json``). With ``tg.start(app.run)`` the started value is the
        app, once the event streams are subscribed (brclient may still be
        unreachable: the client keeps retrying with backoff). Runs once per
        app; the harness and client are closed on return.

        One process per data directory and one harness per brclient: raises
        :class:`ServeConfigError` when another brmcp-serve holds
        ``<datadir>/brmcp-serve.lock``, and :class:`~brmcp.server.HarnessError`
        when another harness serves the same brclient (both name the
        holder's pid; README "One process per identity")."""
        if self._ran:
            raise RuntimeError("ServeApp.run can be called only once")
        self._ran = True
        with contextlib.ExitStack() as locks:
            locks.enter_context(await anyio.to_thread.run_sync(self._lock_datadir))
            locks.enter_context(await anyio.to_thread.run_sync(lock_brclient, self.client))
            try:
                await self._serve(handle_signals, task_status)
            finally:
                self._tg = None
        log_stopped(self._stopping_at)

    def _lock_datadir(self) -> FileLock:
        return acquire_datadir(
            self.datadir, LOCK_FILE, what="brmcp-serve", error=ServeConfigError, already="is already running"
        )

    async def _serve(self, handle_signals: bool, task_status: anyio.abc.TaskStatus[ServeApp]) -> None:
        self._warn_if_closed()
        async with self.client, anyio.create_task_group() as tg:
            self._tg = tg
            if handle_signals:
                await tg.start(self._signals, tg.cancel_scope)
            if self.gateway is not None:
                await tg.start(self.gateway.run)
            if self.metrics_endpoint is not None:
                try:
                    await self.metrics_endpoint.start(tg)
                except OSError as exc:
                    log.error("brmcp-serve: metrics endpoint not started: %s", exc)
                else:
                    log.info("brmcp-serve: metrics at %s", self.metrics_endpoint.url)
            self.router = await tg.start(
                partial(
                    run_bot,
                    self.harness,
                    self.client,
                    on_connected=self._on_connected,
                    on_pm=self._on_chat,
                    on_tip_progress=(
                        self.directory_payer.on_tip_progress
                        if isinstance(self.directory_payer, ClientTipPayer)
                        else None
                    ),
                    exclusive=False,
                )
            )
            await self.start_registrant(self.router, tg)
            if self.gateway is not None:
                log.info(
                    "brmcp-serve: selling %d tool(s) of %s; brclient at %s",
                    len(self.harness.tools()),
                    self.gateway.config.describe(),
                    self.client.url,
                )
            else:
                log.info(
                    "brmcp-serve: echo (free) and fortune (%s atoms); brclient at %s",
                    f"{FORTUNE_PRICE_ATOMS:,}",
                    self.client.url,
                )
            task_status.started(self)

    async def _on_connected(self) -> None:
        try:
            self.identity = await self.client.user_public_identity()
        except (ClientrpcError, TimeoutError) as exc:
            log.warning("connected to brclient at %s, but its identity is unknown: %s", self.client.url, exc)
            return
        pool = self.config.pool
        if pool is not None:
            try:
                pool.check_member(self.identity.uid)
            except ValueError as exc:  # the harness then announces no pool
                log.error("brmcp-serve: %s", exc)
        # Receipts name the bot from now on (WIRE.md §Signed receipts).
        self.receipt_signer.bot = self.identity.uid
        log.info(
            "serving as %s (uid %s) through brclient at %s",
            self.identity.nick,
            self.identity.uid,
            self.client.url,
        )

    async def _on_chat(self, uid: str, text: str) -> None:
        """A plain-chat PM (never an envelope: run_bot routes those to the
        harness): answer it with how to reach the bot from an agent, at most
        once per sender per hour, unless ``chat_help`` is false. The reply
        is sent in the background so the PM stream does not wait for it."""
        setting = self.config.chat_help
        if setting is False or self._tg is None:
            return
        identity = self.identity
        if identity is None:
            try:
                identity = self.identity = await self.client.user_public_identity()
            except (ClientrpcError, TimeoutError) as exc:
                log.debug("plain chat from %s not answered: own identity unknown: %s", uid, exc)
                return
        if uid.lower() == identity.uid or not self.chat_help.should_reply(uid):
            return
        reply = render(
            DEFAULT_TEXT if setting is True else setting,
            bot_uid=identity.uid,
            bot_nick=identity.nick,
            sender_uid=uid,
            allowed=self.harness.allowed(uid),
        )
        self.chat_replies += 1
        self._tg.start_soon(self._send_chat_help, uid, reply)

    async def _send_chat_help(self, uid: str, reply: str) -> None:
        try:
            await self.client.send_pm(uid, reply)
        except (ClientrpcError, TimeoutError) as exc:
            self.chat_help.forget(uid)
            log.warning("plain chat from %s: the how-to-connect reply was not sent: %s", uid, exc)
            return
        log.info(
            "plain chat from %s: replied with how to connect an agent (once an hour per sender; "
            'turn off with "chat_help": false in %s)',
            uid,
            self.config_path,
        )

    async def stop(
        self, *, grace: float = STOP_GRACE, flush: float = FLUSH_GRACE, timer: Clock | None = None
    ) -> DrainReport | None:
        """Stop :meth:`run` without dropping answers (what SIGINT/SIGTERM
        do), in order:

        1. take no new work: PMs arriving from now on are neither handled
           nor acked, so brclient replays them to the next start (a call in
           them is not started, so not charged; its caller re-sends);
        2. wait at most ``grace`` seconds for the requests in flight (every
           request delivered to a session, a ``tools/call`` held for its
           pay-alongside tip included) to be answered;
        3. wait at most ``flush`` seconds for every answer written to be
           handed to brclient (its ``PM`` call returned);
        4. cancel the rest: a call still running is cancelled, and a paid
           one refunded, as any cancelled call is.

        ``timer`` runs both bounds (None: anyio's clock; a
        :class:`~brmcp.ManualClock` in tests). Logs one INFO line of what
        was drained and returns it; :meth:`run` then returns. Returns None,
        stopping at once, when a stop is already under way (a second
        SIGINT/SIGTERM), and None when the app is not running; before the
        bot serves, it stops at once."""
        tg = self._tg
        if tg is None:
            return None
        if self._draining:
            self.stop_now()
            return None
        self._draining = True
        if self._stopping_at is None:
            self._stopping_at = anyio.current_time()
        router = self.router
        if router is None:
            tg.cancel_scope.cancel()
            return None
        started = anyio.current_time()
        stats = router.stats
        answered, sent = stats.requests_answered, stats.pms_sent
        router.stop_intake()
        in_time = await within(router.requests_answered, grace, timer)
        cut = 0 if in_time else router.pending_requests
        if not await within(router.outbox_drained, flush, timer):
            log.warning("stopping: answers still queued for brclient after %g s; giving up on them", flush)
        report = DrainReport(
            answered=stats.requests_answered - answered,
            cut=cut,
            pms_flushed=stats.pms_sent - sent,
            parts_left=router.outbox_waiting(),
            pms_held=stats.pms_held,
            seconds=anyio.current_time() - started,
        )
        log.info(
            "stopping: drained in %.1f s: %d request(s) in flight answered, %d cut off after the %g s grace "
            "(cancelled; paid ones refunded), %d PM(s) handed to brclient, %d part(s) not handed over, "
            "%d PM(s) left in brclient for the next start",
            report.seconds,
            report.answered,
            report.cut,
            grace,
            report.pms_flushed,
            report.parts_left,
            report.pms_held,
        )
        tg.cancel_scope.cancel()
        return report

    def stop_now(self) -> None:
        """Stop :meth:`run` at once, without a drain (calls in flight are
        cancelled and paid ones refunded; answers not yet handed to
        brclient are lost, and their callers' re-sends replay them from
        the journal). A no-op when the app is not running."""
        if self._tg is not None:
            if self._stopping_at is None:
                self._stopping_at = anyio.current_time()
            self._tg.cancel_scope.cancel()

    async def _signals(
        self, scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    try:
                        self.reload()
                    except ServeConfigError as exc:
                        log.error("reload refused, keeping the previous settings: %s", exc)
                        continue
                    await self.release_held_tips()
                    continue
                name = signal.Signals(signum).name
                if self._draining:
                    log.info("%s again: stopping at once", name)
                    self.stop_now()
                    scope.cancel()
                    return
                log.info("%s: stopping", name)
                log.info(
                    "answering the requests in flight first (for at most %g s; send %s again to stop "
                    "at once)",
                    STOP_GRACE,
                    name,
                )
                self._stopping_at = anyio.current_time()
                tg = self._tg
                if tg is None:
                    scope.cancel()
                    return
                tg.start_soon(self.stop)
