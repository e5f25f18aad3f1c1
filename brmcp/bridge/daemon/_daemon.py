"""The standalone bridge daemon (``brmcp-bridge``): a :class:`Bridge` hosted on
the user's running brclient through clientrpc (BRIDGE.md "Running the
daemon", §Embedding the library in another daemon for ``TipMatcher``;
docs/clientrpc.md §Methods brmcp calls, §Units, §Bot config file).

What the daemon supplies to the bridge:

* sender: the clientrpc :class:`~brmcp.clientrpc.Client` (``ChatService.PM``;
  fails at once with ``brclient not connected`` while disconnected);
* inbound PMs: every PM from ``ChatService.PMStream`` goes to
  :meth:`Bridge.handle_pm`, then ``AckReceivedPM``;
* sender: wrapped in a :class:`~.patient.PatientSender` (:mod:`.patient`),
  so a PM sent during a reconnect waits for it, and once that wait ran out
  calls fail at once naming this brclient, the daemon's command line and
  its log file, until brclient is connected again;
* payer: :class:`~.tippayer.TipPayer` (:mod:`.tippayer`) pays with
  ``PaymentsService.TipUser`` (``dcr_amount`` = atoms / 1e8, 3 attempts)
  and returns once the matching terminal ``TipProgress`` event says the tip
  completed; a first event saying the attempt failed and will be retried
  ends the wait at once (the spend stays pending); a terminal event no
  payment waits for (it came after the tip wait, after such a stall, or
  after a restart) is a late outcome for :meth:`Bridge.resolve_spend`;
  every progress event is acked after it was handled (one whose outcome
  could not be written stays unacked, so brclient delivers it again); a tip
  outstanding for over :data:`~.tippayer.TIP_SLOW_SECS` s is logged once at
  INFO with what it waits for (e.g. brclient's tip restart delay after it
  starts);
* the endpoint on ``listen`` (default ``127.0.0.1:8891``), bound while the
  bridge is enabled, and a runtime file that tells the CLI where the admin
  surface is (:data:`~.runtime.RUNTIME_FILE`, :mod:`.runtime`).

Files in the data directory: ``brmcp-bridge.conf`` (bisonbotkit format,
created with defaults on first use), ``mcpclient.json``, ``mcpspend.json``,
``mcpadmin.token`` (the bridge's) and ``brmcp-bridge.runtime.json`` (while
running).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import shlex
import signal
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from brmcp._ops.clock import Clock, SystemClock
from brmcp._ops.listener import parse_listen_address
from brmcp._ops.lockfile import FileLock, acquire_datadir
from brmcp.bridge._bridge import DEFAULT_LISTEN, Bridge, BridgeConfig
from brmcp.bridge.base import BridgeError, Settings, cli_command
from brmcp.bridge.find import ClientrpcContacts
from brmcp.bridge.pay import PendingPayment
from brmcp.clientrpc import (
    BotConfig,
    Client,
    ReceivedPM,
    Subscription,
    TipProgressEvent,
    acquire_brclient,
    load_or_create_bot_config,
)
from brmcp.clientrpc._glue import Acker, connection_signals, flush_on_connect
from brmcp.clientrpc.patient import DEFAULT_OFFLINE_HINT, PatientSender
from brmcp.clientrpc.tipmatcher import TipMatcher
from brmcp.clientrpc.tippayer import (
    TIP_MAX_ATTEMPTS,
    TIP_SLOW_SECS,
    TipPayer,
    TipPaymentError,
    TipStalledError,
)
from brmcp.protocol.units import atoms_from_milliatoms
from brmcp.transport.router import RouterOptions

from ._runtime import (
    RUNTIME_FILE,
    read_runtime,
    remove_runtime,
    runtime_stale_reason,
    write_runtime,
)

if TYPE_CHECKING:
    from brmcp.metrics import MetricsEndpoint

#: Seconds a matched tip outcome waits for the spend log write before its ack.
OUTCOME_WRITE_WAIT = 10.0

# TipPayer (.tippayer), PatientSender (.patient) and the runtime file
# (.runtime) have their own modules; their names stay importable from here.
__all__ = [
    "BOT_CONFIG_NAME",
    "NOTIFY_KEY",
    "RUNTIME_FILE",
    "TIP_MAX_ATTEMPTS",
    "TIP_SLOW_SECS",
    "BridgeDaemon",
    "PatientSender",
    "TipPayer",
    "TipPaymentError",
    "TipStalledError",
    "load_daemon_config",
    "read_runtime",
    "resolve_listen",
    "runtime_stale_reason",
]

log = logging.getLogger("brmcp.bridge.daemon._daemon")

#: bisonbotkit config name: the daemon reads ``<datadir>/brmcp-bridge.conf``.
BOT_CONFIG_NAME = "brmcp-bridge"
#: Held (flock) while the daemon runs: one process per data directory.
LOCK_FILE = "brmcp-bridge.lock"
#: ``brmcp-bridge.conf`` key: a command run on each new payment waiting for approval.
NOTIFY_KEY = "approvalnotify"
#: Seconds a notification command may run before it is killed.
NOTIFY_TIMEOUT = 30.0


def resolve_listen(address: str) -> str:
    """Validate a loopback ``host:port`` (see
    :func:`~brmcp._ops.listener.parse_listen_address`) and replace port 0
    with a free port, so the endpoint keeps one address across listener
    restarts and the CLI can find it. Raises ValueError or OSError."""
    host, port = parse_listen_address(address)
    if port == 0:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind(sockaddr)
            port = sock.getsockname()[1]
    shown = host
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:
            shown = f"[{host}]"
    return f"{shown}:{port}"


def load_daemon_config(datadir: str | os.PathLike[str]) -> tuple[BotConfig, bool]:
    """Create ``datadir`` (mode 0700) when missing and load
    ``<datadir>/brmcp-bridge.conf``, writing bisonbotkit's defaults there when
    it does not exist. Returns ``(config, created)``. Raises
    :class:`~brmcp.clientrpc.ClientrpcConfigError` naming the file, or OSError
    when the directory cannot be created."""
    root = Path(datadir).expanduser()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return load_or_create_bot_config(root, BOT_CONFIG_NAME)


class BridgeDaemon:
    """A :class:`Bridge` on a brclient, as an async API (``brmcp-bridge`` and
    ``brmcp demo`` run this code).

    ``datadir`` holds the bridge's files; ``client`` is a not yet entered
    :class:`~brmcp.clientrpc.Client` for the user's brclient; ``listen`` the
    endpoint address (loopback; port 0 picks a free port once, see
    :func:`resolve_listen`); ``clock``, ``name`` and ``router_options`` go
    to :class:`BridgeConfig`; ``logfile`` (the config's) is named in the
    error a call gets while brclient is down. Construction loads the settings and spend log
    (raises :class:`BridgeError` naming a malformed file, ValueError for a
    bad address) and opens nothing.

    ``daemon.bridge`` is the :class:`Bridge` (its settings, spend log,
    approvals and admin token); ``daemon.matcher`` the :class:`TipMatcher`;
    :attr:`base_url` the endpoint's ``http://host:port``.
    """

    def __init__(
        self,
        datadir: str | os.PathLike[str],
        client: Client,
        *,
        listen: str = DEFAULT_LISTEN,
        clock: Clock | None = None,
        name: str = "brmcp-bridge",
        router_options: RouterOptions | None = None,
        max_attempts: int = TIP_MAX_ATTEMPTS,
        notify_command: str | None = None,
        logfile: str | os.PathLike[str] | None = None,
    ) -> None:
        self.datadir = Path(datadir)
        #: Run on each new payment waiting for approval (see :meth:`_notify`).
        self.notify_command = notify_command or None
        self._notified: set[str] = set()
        #: The Prometheus endpoint (:meth:`enable_metrics`), or None.
        self.metrics_endpoint: MetricsEndpoint | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._unwatch: Callable[[], None] = _nothing
        self.client = client
        self.listen = resolve_listen(listen)
        self.matcher = TipMatcher()
        self.payer = TipPayer(client, self.matcher, max_attempts=max_attempts)
        where = f" (also in {logfile})" if logfile else ""
        hint = (
            f"{DEFAULT_OFFLINE_HINT} The log of {cli_command(self.datadir)} says why it cannot connect{where}"
        )
        self.bridge = Bridge(
            BridgeConfig(
                data_dir=self.datadir,
                sender=PatientSender(client, hint=hint),
                payer=self.payer,
                listen=self.listen,
                name=name,
                clock=clock or SystemClock(),
                router_options=router_options or RouterOptions(),
            )
        )
        # Discovery asks brclient whether a provider is a contact yet.
        self.bridge.use_contacts(ClientrpcContacts(client))
        #: True when :meth:`from_datadir` wrote ``brmcp-bridge.conf`` with defaults.
        self.config_created = False
        #: Terminal tip-progress events that matched no waiting payment.
        self.late_outcomes = 0
        self._ran = False
        self._pm_ack = Acker("PM", client.ack_received_pm)
        self._progress_ack = Acker("tip-progress", client.ack_tip_progress)

    @classmethod
    def from_datadir(
        cls,
        datadir: str | os.PathLike[str],
        *,
        listen: str = DEFAULT_LISTEN,
        clock: Clock | None = None,
        client_options: Mapping[str, Any] | None = None,
        bot_config: BotConfig | None = None,
        config_created: bool = False,
        notify_command: str | None = None,
    ) -> BridgeDaemon:
        """Load ``<datadir>/brmcp-bridge.conf`` (writing bisonbotkit's defaults
        when missing: brclient's files in ``~/.brclient``, clientrpc at
        ``wss://127.0.0.1:7676/ws``), or use ``bot_config`` instead of the
        file (``config_created``: the caller has just written it with
        :func:`load_daemon_config`, which is logged and recorded in
        :attr:`config_created`), and build the daemon. ``client_options`` go to
        :class:`~brmcp.clientrpc.Client`. Raises
        :class:`~brmcp.clientrpc.ClientrpcConfigError` (one line naming the
        file or URL), :class:`BridgeError` or ValueError."""
        root = Path(datadir).expanduser()
        if bot_config is not None:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            cfg, created = bot_config, config_created
        else:
            cfg, created = load_daemon_config(root)
        if created:
            log.warning(
                "wrote %s with defaults (brclient files in %s, clientrpc at %s); edit it if yours differ",
                root / f"{BOT_CONFIG_NAME}.conf",
                Path(cfg.servercertpath).parent,
                cfg.brrpcurl,
            )
        client = Client.from_config(cfg, **dict(client_options or {}))
        command = notify_command if notify_command is not None else cfg.extra.get(NOTIFY_KEY, "")
        daemon = cls(
            root,
            client,
            listen=listen,
            clock=clock,
            notify_command=command.strip() or None,
            logfile=cfg.logfile.strip() or None,
        )
        daemon.config_created = created
        return daemon

    def enable_metrics(self, address: str) -> MetricsEndpoint:
        """Count calls, payments, atoms, errors and waiting approvals in a
        :class:`~brmcp.metrics.BridgeMetrics` and serve them at
        ``http://<address>/metrics`` (loopback only) while :meth:`run` runs.
        Raises ValueError for a bad or non-loopback address."""
        # Imported here: brmcp.metrics uses the bridge's listener module.
        from brmcp.metrics import BridgeMetrics, MetricsEndpoint

        metrics = BridgeMetrics()
        endpoint = MetricsEndpoint(metrics.registry, address)
        self.bridge.use_metrics(metrics)
        self.metrics_endpoint = endpoint
        return endpoint

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the endpoint (served while enabled)."""
        return f"http://{self.listen}"

    @property
    def runtime_path(self) -> Path:
        return self.datadir / RUNTIME_FILE

    async def reload(self) -> Settings:
        """Re-read ``mcpclient.json`` and apply it (what SIGHUP does). Raises
        :class:`BridgeError` for a malformed file, keeping the settings in
        force. When the new settings are in force but the endpoint cannot be
        bound, that is logged as an error and the settings are returned (a
        later reload retries). The bridge logs the endpoint opening or
        closing when ``enabled`` changes."""
        before = self.bridge.settings
        try:
            settings = await self.bridge.reload_settings()
        except BridgeError as exc:
            if self.bridge.settings is before:
                raise
            settings = self.bridge.settings
            log.info("reloaded settings: %s", _describe(settings))
            log.error("the endpoint could not be opened: %s", exc)
            return settings
        log.info("reloaded settings: %s", _describe(settings))
        return settings

    async def run(
        self,
        *,
        handle_signals: bool = False,
        task_status: anyio.abc.TaskStatus[BridgeDaemon] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Connect to brclient, start the bridge and serve until cancelled
        (or, with ``handle_signals``, until SIGINT/SIGTERM; SIGHUP then
        reloads the settings). With ``tg.start(daemon.run)`` the started value
        is the daemon, once the listener (if enabled) is bound and the
        runtime file written; brclient may still be unreachable (the client
        retries with backoff). Raises :class:`BridgeError` when the address
        cannot be bound, another daemon runs on the same data directory, or
        another program consumes the same brclient's events (a second
        bridge or a harness: the one-consumer-per-brclient lock of
        :func:`brmcp.clientrpc.acquire_brclient`, taken before any stream
        opens; the error names the holder's pid). Runs once."""
        if self._ran:
            raise RuntimeError("BridgeDaemon.run can be called only once")
        self._ran = True
        self._stopping_at: float | None = None
        with contextlib.ExitStack() as locks:
            locks.enter_context(await anyio.to_thread.run_sync(self._lock_datadir))
            locks.enter_context(await anyio.to_thread.run_sync(self._lock_brclient))
            await self._run(handle_signals, task_status)
        _log_stopped(self._stopping_at)

    def _lock_datadir(self) -> FileLock:
        return acquire_datadir(self.datadir, LOCK_FILE, what="brmcp-bridge", error=BridgeError)

    def _lock_brclient(self) -> FileLock:
        return acquire_brclient(
            self.client.server_cert,
            self.client.url,
            what="brmcp-bridge",
            error=BridgeError,
            client_cert=self.client.client_cert,
            client_key=self.client.client_key,
        )

    async def _run(self, handle_signals: bool, task_status: anyio.abc.TaskStatus[BridgeDaemon]) -> None:
        other = await anyio.to_thread.run_sync(read_runtime, self.datadir)
        if other is not None:
            pid = other.get("pid")
            if pid != os.getpid() and runtime_stale_reason(other) is None:
                raise BridgeError(f"another brmcp-bridge (pid {pid}) is running on {self.datadir}")
        client = self.client
        async with client:
            with connection_signals(client) as connects:
                pms = client.pm_stream()
                progress = client.tip_progress()
                try:
                    await self.bridge.start()
                    async with anyio.create_task_group() as tg:
                        self._tg = tg
                        if self.notify_command:
                            self._unwatch = self.bridge.watch(self._on_change)
                        if self.metrics_endpoint is not None:
                            try:
                                await self.metrics_endpoint.start(tg)
                            except OSError as exc:
                                log.error("metrics endpoint not started: %s", exc)
                            else:
                                log.info("metrics at %s", self.metrics_endpoint.url)
                        if handle_signals:
                            await tg.start(self._signals, tg.cancel_scope)
                        tg.start_soon(self._pm_loop, pms)
                        tg.start_soon(self._progress_loop, progress)
                        tg.start_soon(
                            flush_on_connect,
                            connects,
                            [self._pm_ack, self._progress_ack],
                            self._on_connected,
                            "brclient connect",
                        )
                        await anyio.to_thread.run_sync(self._write_runtime, handle_signals)
                        self._log_state()
                        task_status.started(self)
                finally:
                    self._tg = None
                    self._unwatch()
                    pms.close()
                    progress.close()
                    try:
                        # Not shielded: Bridge.close exits task groups it
                        # entered here, which must be the innermost scopes.
                        await self.bridge.close()
                    finally:
                        with anyio.CancelScope(shield=True):
                            await anyio.to_thread.run_sync(self._remove_runtime)

    def _on_change(self) -> None:
        """A bridge change: start the notification command for each payment
        that has just been parked."""
        pending = self.bridge.pending_payments()
        tg = self._tg
        current = {p.id for p in pending}
        for payment in pending:
            if payment.id not in self._notified and tg is not None:
                tg.start_soon(self._notify, payment)
        self._notified = current

    async def _notify(self, payment: PendingPayment) -> None:
        """Run :attr:`notify_command` (split like a shell line, not run by a
        shell) for one parked payment, with its details in the environment:
        ``BRMCP_PAYMENT_ID``, ``BRMCP_BOT``, ``BRMCP_TOOL``, ``BRMCP_ATOMS``,
        ``BRMCP_APPROVE_COMMAND``. No secret is passed. A command that fails
        or runs longer than :data:`NOTIFY_TIMEOUT` s is logged and killed."""
        command = self.notify_command
        if not command:
            return
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            log.warning("approval notification command %r cannot be parsed: %s", command, exc)
            return
        env = {
            **os.environ,
            "BRMCP_PAYMENT_ID": payment.id,
            "BRMCP_BOT": payment.bot,
            "BRMCP_TOOL": payment.tool,
            "BRMCP_ATOMS": str(payment.atoms),
            "BRMCP_APPROVE_COMMAND": f"{self.bridge.cli_command} approvals approve {payment.id}",
        }
        try:
            with anyio.fail_after(NOTIFY_TIMEOUT):
                done = await anyio.run_process(argv, env=env, check=False)
        except TimeoutError:
            log.warning("approval notification command %r ran over %.0fs; killed", argv[0], NOTIFY_TIMEOUT)
            return
        except OSError as exc:
            log.warning("approval notification command %r failed to start: %s", argv[0], exc)
            return
        if done.returncode != 0:
            log.warning(
                "approval notification command %r exited with status %d for payment %s",
                argv[0],
                done.returncode,
                payment.id,
            )

    def _log_state(self) -> None:
        settings = self.bridge.settings
        if settings.enabled:
            log.info("settings in force: %s", _describe(settings))
        else:
            log.warning(
                "bridge disabled, no endpoint; to enable: %s settings set enabled=true",
                self.bridge.cli_command,
            )

    def _write_runtime(self, sighup: bool) -> None:
        try:
            write_runtime(self.datadir, listen=self.listen, url=self.base_url, sighup=sighup)
        except OSError as exc:
            log.error("cannot write %s (the CLI will not find this daemon): %s", self.runtime_path, exc)

    def _remove_runtime(self) -> None:
        remove_runtime(self.datadir)

    async def _on_connected(self) -> None:
        try:
            ident = await self.client.user_public_identity()
        except Exception as exc:
            log.warning("connected to brclient at %s; identity unknown: %s", self.client.url, exc)
            return
        log.info("connected to brclient at %s as %s (uid %s)", self.client.url, ident.nick, ident.uid)
        if ident.uid:
            self.bridge.set_own_uid(ident.uid)

    async def _pm_loop(self, pms: Subscription[ReceivedPM]) -> None:
        async for pm in pms:
            try:
                self.bridge.handle_pm(pm.uid, pm.message)
            except Exception:
                log.exception("PM %d from %s could not be handed to the bridge", pm.sequence_id, pm.uid)
            await self._pm_ack.ack(pm.sequence_id)

    async def _progress_loop(self, progress: Subscription[TipProgressEvent]) -> None:
        async for event in progress:
            if await self._on_progress(event):
                await self._progress_ack.ack(event.sequence_id)

    async def _on_progress(self, event: TipProgressEvent) -> bool:
        """Handle one tip-progress event; False when it must not be acked yet."""
        if not event.final:
            log.info(
                "tip of %d matoms to %s: attempt %d failed (%s); brclient retries",
                event.amount_matoms,
                event.uid,
                event.attempt,
                event.attempt_err,
            )
            # The attempt cannot complete now: the payment waiting for it
            # ends at once (its spend stays pending: it may still land). A
            # further retried attempt of a stalled tip changes nothing.
            self.matcher.stall(event.uid, event.amount_matoms, event.attempt_err)
            return True
        error = None if event.completed else (event.attempt_err or "tip attempt failed")
        written = anyio.Event()
        unwatch = self.bridge.watch(written.set)
        try:
            if self.matcher.resolve(event.uid, event.amount_matoms, error):
                # The payment waiting for this outcome writes it to the spend
                # log; the event is acked only after that write (or a bounded
                # wait), so a crash in between leaves it to be replayed and
                # the entry is never left pending for a tip that completed.
                with anyio.move_on_after(OUTCOME_WRITE_WAIT):
                    await written.wait()
                return True
        finally:
            unwatch()
        self.late_outcomes += 1
        try:
            atoms = atoms_from_milliatoms(event.amount_matoms)
            settled = await self.bridge.resolve_spend(event.uid, atoms, error)
        except BridgeError as exc:
            log.error("late tip outcome for %s not recorded: %s", event.uid, exc)
            return False
        if settled:
            log.info(
                "late tip outcome recorded: %d matoms to %s %s",
                event.amount_matoms,
                event.uid,
                "paid" if error is None else f"failed ({error})",
            )
        return True

    async def _signals(
        self, scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum == signal.SIGHUP:
                    try:
                        await self.reload()
                    except BridgeError as exc:
                        log.error("reload refused, keeping the previous settings: %s", exc)
                    continue
                log.info("%s: stopping", signal.Signals(signum).name)
                self._stopping_at = anyio.current_time()
                scope.cancel()
                return


def _nothing() -> None:
    return None


def _describe(settings: Settings) -> str:
    bots = len(settings.allowed_bots or ())
    return (
        f"enabled={str(settings.enabled).lower()} mode={settings.mode} "
        f"per_call_cap_atoms={settings.per_call_cap_atoms} per_day_cap_atoms={settings.per_day_cap_atoms} "
        f"allowed_bots={bots} prepay_bots={len(settings.prepay_bots or ())} "
        f"directories={len(settings.directories or ())}"
    )


def _log_stopped(since: float | None) -> None:
    """The last line of a stop a signal asked for, with how long it took."""
    if since is not None:
        log.info("stopped (%.1f s after the signal)", anyio.current_time() - since)
