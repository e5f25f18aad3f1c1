"""The client bridge: a local MCP endpoint per bot, under the user's spending
policy (BRIDGE.md).

Stock MCP agents connect to ``http://127.0.0.1:PORT/mcp/<bot uid>`` with a
bearer token and see an ordinary MCP server; behind it the bridge relays over
Bison Relay PMs and pays for tools within the caps the user set.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread
from mcp.types import Implementation

from brmcp._ops.clock import Clock, SystemClock
from brmcp._ops.listener import (
    SHUTDOWN_GRACE,
    ListenerLimits,
    OwnedListener,
    bind_failure_hint,
    parse_listen_address,
)
from brmcp.bridge.admin import ConfigSnippet, admin_handler, config_snippet
from brmcp.bridge.admin.ui import UISessions, ui_handler
from brmcp.bridge.agent import MAX_BODY_BYTES, AgentDiscovery, BotProxy, BridgeApp
from brmcp.bridge.base import (
    SETTINGS_FILE,
    BridgeError,
    Settings,
    SettingsFileBroken,
    broken_file_refusal,
    cli_command,
    describe_changes,
    load_settings,
    mint_token,
    read_text,
    save_settings,
    settings_file_problem,
    with_allowed,
    write_atomic,
)
from brmcp.bridge.find import (
    RECEIPTS_FILE,
    BotRequestQueue,
    Contacts,
    Discovery,
    Introduction,
    ReceiptBook,
    ReceiptCall,
    record_receipt,
)
from brmcp.bridge.links import (
    CONNECT_TIMEOUT,
    BotLink,
    BotSnapshot,
    RetryPolicy,
    SnapshotStore,
    relay_estimator,
)
from brmcp.bridge.pay import (
    SPEND_FILE,
    BotBalance,
    Funding,
    Payer,
    PendingPayment,
    Pools,
    Settler,
    SpendLog,
    SpendSummary,
)
from brmcp.protocol.receipts import SIGNED_RECEIPT_KEY
from brmcp.transport.router import Router, RouterOptions
from brmcp.transport.sender import PMSender

if TYPE_CHECKING:
    from brmcp.metrics import BridgeMetrics

__all__ = ["ADMIN_TOKEN_FILE", "DEFAULT_LISTEN", "Bridge", "BridgeConfig"]

log = logging.getLogger("brmcp.bridge")

#: The daemon's default endpoint address.
DEFAULT_LISTEN = "127.0.0.1:8891"
#: File (in the data directory) holding the admin surface's bearer token.
ADMIN_TOKEN_FILE = "mcpadmin.token"


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """What the host supplies (BRIDGE.md §Embedding the library in another daemon).

    * ``data_dir``: directory for ``mcpclient.json`` (settings),
      ``mcpspend.json`` (spend log) and ``mcpadmin.token``. Required.
    * ``sender``: the host's :class:`~brmcp.PMSender`. Required.
    * ``payer``: :class:`~brmcp.bridge.Payer`; ``pay(uid, atoms)`` returns
      only once the payment is confirmed. Required.
    * ``listen``: ``"host:port"`` on loopback for a listener the bridge owns
      and binds only while enabled; None when the host serves
      :attr:`Bridge.asgi_app` itself. Port 0 picks a free port.
    * ``name``: the MCP client name (version ``"1"``) and the prefix of
      refusal notes.
    * ``router_options``: transport settings for the bridge's router.
    * ``clock``: time source for timestamps, the spending window, approval
      timeouts and credit polls.
    * ``max_body_bytes``: largest MCP request body accepted (413 above).
    * ``connect_timeout``: seconds allowed for initialize (re-sent on the
      backoff meanwhile) and for the ``tools/list`` snapshot.
    * ``retry``: re-send timing and the initialize answer timeout
      (BRIDGE.md §Deadlines and re-sends).
    * ``uid``: this bridge's own BR uid, named in the hint an agent gets
      when a bot does not answer (None: not known).
    * ``listener_limits``: header-read and keep-alive timeouts and the
      connection cap of the owned listener (BRIDGE.md "Listener limits").
    """

    data_dir: str | os.PathLike[str]
    sender: PMSender
    payer: Payer
    listen: str | None = None
    name: str = "brmcp-bridge"
    router_options: RouterOptions = field(default_factory=RouterOptions)
    clock: Clock = field(default_factory=SystemClock)
    max_body_bytes: int = MAX_BODY_BYTES
    connect_timeout: float = CONNECT_TIMEOUT
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    uid: str | None = None
    listener_limits: ListenerLimits = field(default_factory=ListenerLimits)


def _http_url(bound: tuple[str, int] | None, address: str) -> str:
    """``http://host:port`` of a bound listener (``address`` when unknown)."""
    if bound is None:
        return f"http://{address}"
    host, port = bound
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Bridge:
    """The client bridge. Construction loads the state files and opens no
    socket and sends nothing; raises ValueError for a bad config and
    :class:`BridgeError` naming the file for an unreadable or malformed
    ``mcpclient.json`` / ``mcpspend.json``.

    Use ``async with Bridge(config) as bridge:`` (or :meth:`start` and
    :meth:`close` from the same task) and feed every PM to
    :meth:`handle_pm`.
    """

    def __init__(self, config: BridgeConfig) -> None:
        if not config.data_dir:
            raise ValueError("brmcp bridge: BridgeConfig.data_dir is required")
        if config.sender is None:
            raise ValueError("brmcp bridge: BridgeConfig.sender is required")
        if config.payer is None:
            raise ValueError("brmcp bridge: BridgeConfig.payer is required")
        if not config.name:
            raise ValueError("brmcp bridge: BridgeConfig.name must not be empty")
        if config.max_body_bytes <= 0:
            raise ValueError("brmcp bridge: BridgeConfig.max_body_bytes must be > 0")
        if config.listen is not None:
            parse_listen_address(config.listen)
        self.config = config
        self._clock = config.clock
        self._own_uid: str | None = config.uid
        #: This bridge's ``brmcp/callerEpoch`` (WIRE.md §Pay alongside): new at
        #: every start, so a bot drops calls held for the process before it.
        self._epoch = secrets.token_hex(8)
        self._data_dir = Path(config.data_dir)
        self._settings_path = self._data_dir / SETTINGS_FILE
        self._settings = load_settings(self._settings_path)
        spend = SpendLog.load(self._data_dir / SPEND_FILE)
        self._settler = Settler(
            spend=spend,
            payer=config.payer,
            clock=config.clock,
            settings=self._current,
            approval_hint=self._approval_hint,
        )
        self._router = Router(config.sender, allow=self._allow_peer, options=config.router_options)
        self._client_info = Implementation(name=config.name, version="1")
        self._snapshot_store = SnapshotStore(self._data_dir)
        #: Signed receipts of the bots' results (BRIDGE.md §Signed receipts).
        self._receipts = ReceiptBook(self._data_dir / RECEIPTS_FILE, clock=config.clock.now)
        #: Receipts that could not be written to the book (each logged).
        self.receipt_failures = 0
        self._snapshots: dict[str, BotSnapshot] = {}
        self._links: dict[str, BotLink] = {}
        self._proxies: dict[str, BotProxy] = {}
        #: Bot pools: membership, spreading, failover, one balance (:mod:`.pools`).
        self._pools = Pools(
            self._live_link,
            self._allow_peer,
            self._open_link,
            settler=self._settler,
            settings=self._current,
            spawn=self._spawn,
        )
        self._ui_sessions = UISessions()
        self._discovery = Discovery(self)
        self._bot_requests = BotRequestQueue(self, config.clock, on_change=self._settler._changed)
        self._agent_discovery = AgentDiscovery(self, max_body_bytes=config.max_body_bytes)
        self._app = BridgeApp(
            self,
            admin_handler(self),
            ui=ui_handler(self),
            max_body_bytes=config.max_body_bytes,
            discover=self._agent_discovery,
        )
        self._listener: OwnedListener | None = None
        self._listener_token = ""
        self._reconcile_lock = anyio.Lock()
        self._commit_lock = anyio.Lock()
        self._admin_token = ""
        self._tg: anyio.abc.TaskGroup | None = None
        self._started = False
        self._router_entered = False
        self._closed = False

    # -- lifecycle --------------------------------------------------------------

    async def __aenter__(self) -> Bridge:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the bridge's tasks and, when enabled with ``listen`` set,
        bind the listener. Raises :class:`BridgeError` when the admin token
        file cannot be written or the address cannot be bound; after a bind
        error the bridge stays usable (settings can be changed to retry) and
        must still be closed."""
        if self._started or self._closed:
            raise RuntimeError("Bridge.start: already started or closed")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        await self._router.__aenter__()
        self._router_entered = True
        self._started = True
        self._admin_token = await anyio.to_thread.run_sync(self._load_admin_token)
        self._snapshots = await anyio.to_thread.run_sync(self._snapshot_store.load_all)
        # Round trips measured by an earlier run are the relay's first guess
        # for every bot, including one contacted for the first time.
        shared = relay_estimator(self._router, self.config.retry)
        for snapshot in self._snapshots.values():
            if snapshot.rtt is not None:
                shared.seed(*snapshot.rtt)
        await self._reconcile()

    async def close(self) -> None:
        """Answer every agent call in flight, then stop the listener, end
        every HTTP session, close every BR session and the router, and
        cancel the bridge's tasks. Idempotent; call from the task that
        called :meth:`start`.

        Each call in flight ends with an error saying the bridge is stopping
        and what was paid for it (a payment parked for approval is
        withdrawn, nothing paid; one in flight completes first), and the
        answers are written to the agents' streams, for at most
        :data:`~.listener.SHUTDOWN_GRACE` seconds, before any HTTP session
        ends."""
        if self._closed:
            return
        self._closed = True
        for proxy in self._proxies.values():
            proxy.stop()
        # Shielded: close usually runs under cancellation, and the answers
        # must still be written.
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_GRACE):
            if self._app.calls_in_flight:
                log.info("stopping: answering %d agent call(s) in flight", self._app.calls_in_flight)
            await self._app.calls_answered()
        self._app.drop_all()
        for link in self._links.values():
            link.close()
        listener, self._listener = self._listener, None
        if listener is not None:
            # Shielded: close usually runs under cancellation, and an
            # interrupted stop would leave the task group below unexited.
            with anyio.CancelScope(shield=True):
                await listener.stop()
        self._router.close()
        tg, self._tg = self._tg, None
        if tg is not None:
            tg.cancel_scope.cancel()
            try:
                if self._router_entered:
                    await self._router.__aexit__(None, None, None)
            finally:
                await tg.__aexit__(None, None, None)
                self._receipts.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def handle_pm(self, peer: str, text: str) -> None:
        """Feed one inbound PM (every PM; chat is ignored). Never blocks."""
        self._router.handle_pm(peer, text)

    @property
    def router(self) -> Router:
        """The bridge's client-role router (read its stats; do not close it)."""
        return self._router

    @property
    def asgi_app(self) -> BridgeApp:
        """The ASGI app serving ``/mcp/<uid>`` and ``/admin/…``. Mount it at
        the root of a loopback-only server when ``listen`` is None."""
        return self._app

    @property
    def listen_address(self) -> tuple[str, int] | None:
        """The owned listener's bound (host, port), or None when not listening."""
        listener = self._listener
        return listener.address if listener is not None else None

    @property
    def admin_token(self) -> str:
        """The admin surface's bearer token (empty before :meth:`start`)."""
        return self._admin_token

    @property
    def cli_command(self) -> str:
        """How hints and the approvals page name the command line:
        ``brmcp-bridge``, plus ``--datadir <data dir>`` unless it is the default."""
        return cli_command(self._data_dir)

    # -- settings -----------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings in force."""
        return self._settings

    def _current(self) -> Settings:
        return self._settings

    def _approval_hint(self, payment_id: str) -> str:
        """How the user decides a parked payment (logged when it parks)."""
        command = f"{self.cli_command} approvals"
        page = ""
        if self._listener is not None:
            page = f", or on the approvals page (login link: {self.cli_command} ui)"
        return f"approve with: {command} approve {payment_id} (or: {command} deny {payment_id}){page}"

    def _allow_peer(self, peer: str) -> bool:
        return self._settings.allows(peer)

    async def apply_settings(self, settings: Settings) -> Settings:
        """Apply and persist ``settings`` hot (BRIDGE.md §Settings): defaults
        are applied, allowed bots validated, a 32-hex token minted when
        enabled without one; the file is written atomically (mode 0600);
        links of de-listed bots are closed; the owned listener is started,
        stopped, or restarted when the token changed (which cuts every
        stream opened under the old token). Returns the applied settings.

        Raises :class:`SettingsError` (invalid), :class:`SettingsFileBroken`
        (``mcpclient.json`` was edited and fails to load: it is not
        overwritten) or :class:`BridgeError` (write failed) with the prior
        settings still in force; a :class:`BridgeError` from binding the
        listener leaves the new settings applied and persisted."""
        applied = await self._commit_settings(lambda _current: settings, source="apply_settings")
        await self._reconcile()
        return applied

    async def update_settings(self, change: Callable[[Settings], Settings], *, source: str) -> Settings:
        """Apply ``change`` (the settings in force → the new settings) to the
        settings current when it holds the bridge's one settings lock, then
        commit the result as :meth:`apply_settings` does (without touching
        the listener: call :meth:`apply_settings` or a reload for that).
        Changes made at the same moment compose: the end state is that of
        some serial order of them (BRIDGE.md §Settings). ``change`` must not
        block; returning its argument itself writes nothing. ``source``
        names the writer in the log. Returns the settings in force. Raises
        what ``change`` raises, and what :meth:`apply_settings` raises, with
        the prior settings in force."""
        return await self._commit_settings(change, source=source)

    async def reload_settings(self) -> Settings:
        """Re-read ``mcpclient.json`` (edited by hand or by another process)
        and apply it without rewriting it: no token is minted. Raises
        :class:`BridgeError` for a malformed file (nothing changes)."""
        async with self._commit_lock:
            # Read under the lock: a file read before a concurrent commit and
            # installed after it would undo that commit.
            loaded = await anyio.to_thread.run_sync(load_settings, self._settings_path)
            self._install(loaded, source=f"reload of {self._settings_path}")
        await self._reconcile()
        return loaded

    async def _commit_settings(self, change: Callable[[Settings], Settings], *, source: str) -> Settings:
        # The one writer of the settings: every change is read-modify-write
        # against the settings in force once the lock is held, so two changes
        # at the same moment cannot each build on a copy taken before the
        # other's commit (which would silently drop one of them).
        async with self._commit_lock:
            current = self._settings
            candidate = change(current)
            if candidate is current:
                return current
            settings = candidate.normalized()
            settings.validate()
            if settings.enabled and not settings.token:
                settings = settings.replace(token=mint_token())
            # A hand edit that fails to load (its reload was refused) holds
            # other changes too: writing the settings in force over it would
            # lose them.
            problem = await anyio.to_thread.run_sync(settings_file_problem, self._settings_path)
            if problem is not None:
                raise SettingsFileBroken(broken_file_refusal(problem))
            # Shielded: once the file is written, memory must follow it.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(save_settings, self._settings_path, settings)
                self._install(settings, source=source)
        return settings

    def _install(self, settings: Settings, *, source: str) -> None:
        previous = self._settings
        self._settings = settings
        changes = describe_changes(previous, settings)
        if changes:
            log.info("settings changed (%s): %s", source, changes)
        for uid in list(self._links):
            if not settings.allows(uid):
                self._app.drop(uid)
                self._links.pop(uid).close()
                self._proxies.pop(uid, None)
        if not settings.enabled or settings.token != previous.token:
            self._app.drop_all()

    def _schedule_reconcile(self) -> None:
        tg = self._tg
        if tg is not None:
            tg.start_soon(self._reconcile_logged)

    async def _reconcile_logged(self) -> None:
        try:
            await self._reconcile()
        except BridgeError as exc:
            log.error("%s", exc)

    async def _reconcile(self) -> None:
        """Bring the owned listener in line with the settings."""
        async with self._reconcile_lock:
            address = self.config.listen
            tg = self._tg
            if address is None or tg is None or self._closed:
                return
            settings = self._settings
            listener = self._listener
            restart = False
            if listener is not None and (not settings.enabled or settings.token != self._listener_token):
                self._listener = None
                bound = listener.address
                await listener.stop()
                restart = settings.enabled
                if not settings.enabled:
                    log.info("bridge disabled: endpoint %s closed", _http_url(bound, address))
            if settings.enabled and self._listener is None:
                listener = OwnedListener(self._app, address, self.config.listener_limits)
                try:
                    bound = await listener.start(tg)
                except OSError as exc:
                    raise BridgeError(
                        f"listen {address}: {exc}{bind_failure_hint(exc, self.cli_command)}"
                    ) from None
                self._listener = listener
                self._listener_token = settings.token
                url = _http_url(bound, address)
                if restart:
                    log.info("bridge token changed: endpoint %s restarted, agent streams cut", url)
                else:
                    log.info("bridge enabled: endpoint open at %s/mcp/<bot uid>", url)

    def _load_admin_token(self) -> str:
        path = self._data_dir / ADMIN_TOKEN_FILE
        try:
            text = read_text(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise BridgeError(f"read {path}: {exc}") from None
        if text is not None:
            token = text.strip()
            if len(token) < 16 or any(ch.isspace() for ch in token):
                raise BridgeError(f"parse {path}: expected one token of at least 16 characters")
            return token
        token = mint_token()
        try:
            write_atomic(path, token + "\n")
        except OSError as exc:
            raise BridgeError(f"write {path}: {exc}") from None
        return token

    # -- bots ---------------------------------------------------------------------

    def _task_group(self) -> anyio.abc.TaskGroup:
        tg = self._tg
        if tg is None or self._closed:
            raise RuntimeError("bridge is not running")
        return tg

    def _proxy(self, uid: str) -> BotProxy:
        """The mirror server of bot ``uid`` (lowercase), built on first use."""
        proxy = self._proxies.get(uid)
        if proxy is not None and not proxy.link.closed:
            return proxy
        snapshot = self._snapshots.pop(uid, None)
        if proxy is not None:
            snapshot = proxy.link.snapshot() or snapshot
        link = BotLink(
            uid,
            self._router,
            self._task_group(),
            self._client_info,
            connect_timeout=self.config.connect_timeout,
            store=self._snapshot_store,
            snapshot=snapshot,
            clock=self._clock,
            retry=self.config.retry,
            own_uid=self._own_uid,
        )
        funding = Funding(uid, self._settler, self._current, link.fixed_price, link.spawn)
        proxy = BotProxy(
            link,
            self._settler,
            self._clock,
            self.config.name,
            funding=funding,
            settings=self._current,
            epoch=self._epoch,
        )
        proxy.payments.on_result = lambda tool, arguments, key, meta, member: self._on_result(
            member, arguments, key, meta
        )
        proxy.payments.pools = self._pools
        self._links[uid] = link
        self._proxies[uid] = proxy
        return proxy

    def _live_link(self, uid: str) -> BotLink | None:
        """The open link of allowed bot ``uid``, or None."""
        link = self._links.get(uid)
        if link is None or link.closed or not self._allow_peer(uid):
            return None
        return link

    def _open_link(self, uid: str) -> BotLink | None:
        """The link of allowed bot ``uid``, built if needed; None while the
        bridge is not running."""
        if self._tg is None or self._closed or not self._allow_peer(uid):
            return None
        return self._proxy(uid).link

    def _spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        self._task_group().start_soon(fn, *args)

    @property
    def pools(self) -> Pools:
        """The bridge's bot pools (:mod:`.pools`)."""
        return self._pools

    def _on_result(self, link: BotLink, arguments: dict[str, Any] | None, key: str, meta: Any) -> None:
        """A result of ``link``'s bot went to its agent: keep its signed
        receipt, if any, in the book in the background
        (BRIDGE.md §Signed receipts); a failure is logged and counted, never the agent's."""
        tg = self._tg
        if tg is None or self._closed or not isinstance(meta, dict) or SIGNED_RECEIPT_KEY not in meta:
            return

        def expected() -> ReceiptCall:
            return ReceiptCall.of(
                announced=link.receipt_key, caller=link.own_uid, arguments=arguments, call_key=key, meta=meta
            )

        async def keep() -> None:
            if not await record_receipt(self._receipts, link.uid, meta, expected):
                self.receipt_failures += 1

        tg.start_soon(keep)

    @property
    def receipts(self) -> ReceiptBook:
        """The receipt book (:mod:`.receipts`; blocking: call it off the event loop)."""
        return self._receipts

    def set_own_uid(self, uid: str) -> None:
        """Name this bridge's own BR uid (64 hex, as brclient reported it) in
        the hint an agent gets from a bot that does not answer (BRIDGE.md
        §Deadlines and re-sends, "Unanswered bots"), for links built now and
        later; a daemon calls it once connected to brclient."""
        self._own_uid = uid
        for link in self._links.values():
            link.own_uid = uid

    @property
    def discovery(self) -> Discovery:
        """Find and introductions through the configured directories
        (:mod:`.discovery`; BRIDGE.md §Finding bots through directories)."""
        return self._discovery

    @property
    def bot_requests(self) -> BotRequestQueue:
        """Add-bot requests of agents waiting for the user (:mod:`.botrequests`)."""
        return self._bot_requests

    async def allow_bot(self, uid: str) -> None:
        """Put ``uid`` on ``allowed_bots`` through the settings commit (as the
        admin API's settings change, which ``brmcp-bridge add`` uses), and
        change nothing else; nothing when it is already there. Raises
        :class:`SettingsFileBroken` or :class:`BridgeError` (nothing changed)."""
        await self._commit_settings(
            lambda current: with_allowed(current, [uid]), source="bot request approved"
        )

    async def bot_contact(self, uid: str) -> bool | None:
        """Whether this bridge's brclient has a key exchange with ``uid``
        (:meth:`.Discovery.contact`)."""
        return await self._discovery.contact(uid)

    async def introduce_bot(self, uid: str, via: str | None) -> Introduction:
        """A directory's introduction toward ``uid`` (:meth:`.Discovery.introduce`)."""
        return await self._discovery.introduce(uid, via)

    def use_contacts(self, contacts: Contacts | None) -> None:
        """Tell discovery how to learn whether a user is a contact of this
        bridge's brclient (the daemon passes
        :class:`~.discovery.ClientrpcContacts`); None: it cannot tell."""
        self._discovery.contacts = contacts

    def link(self, uid: str) -> BotLink | None:
        """The link to bot ``uid`` if one was built (observability)."""
        return self._links.get(uid.lower())

    # -- payments -------------------------------------------------------------------

    def pending_payments(self) -> list[PendingPayment]:
        """Payments waiting for approval, sorted by ``created`` then ``id``."""
        return self._settler.approvals.pending()

    def resolve_payment(self, payment_id: str, approve: bool) -> bool:
        """Approve or deny a parked payment; False for an unknown id. The
        first decision wins."""
        return self._settler.approvals.resolve(payment_id, approve)

    def spend_log(self) -> SpendSummary:
        """A copy of the spend log and its rolling 24-hour total (atoms,
        failed entries excluded)."""
        return self._settler.summary()

    def bot_balances(self) -> dict[str, BotBalance]:
        """The balance each bot last reported for this user (lowercase uid →
        :class:`BotBalance`), from the receipts on paid results and from
        ``payment_required`` refusals seen since the bridge started."""
        return self._settler.balances()

    def watch(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` from the event loop whenever a payment is
        parked or decided or the spend log changes (the approvals page and
        the daemon's notification hook use it); returns the function that
        removes the listener."""
        return self._settler.watch(listener)

    def use_metrics(self, metrics: BridgeMetrics) -> None:
        """Count calls, payments and errors in ``metrics`` from now on, and
        export the router's sessions and reassembly bytes and the number of
        waiting approvals through it."""
        self._settler.metrics = metrics
        metrics.watch_router(lambda: self._router)
        metrics.watch_pending(lambda: len(self._settler.approvals.pending()))

    @property
    def change_version(self) -> int:
        """A counter bumped on every change :meth:`watch` reports."""
        return self._settler.version

    @property
    def ui_sessions(self) -> UISessions:
        """Login tickets and browser sessions of the approvals page."""
        return self._ui_sessions

    def clock_now(self) -> float:
        """The bridge clock's time (unix seconds)."""
        return self._clock.now()

    async def resolve_spend(self, payee: str, atoms: int, err: str | BaseException | None) -> bool:
        """Record a late outcome for a pending payment (e.g. a tip confirmed
        after the wait budget, or after a restart): claims the oldest pending
        entry of exactly ``atoms`` atoms to ``payee`` (case-insensitive);
        ``err`` None marks it paid, otherwise failed with the error text.
        Returns False when nothing matches. Raises :class:`BridgeError` when
        the log cannot be written."""
        text = None if err is None else (str(err) or type(err).__name__)
        return await self._settler.resolve(payee, atoms, text)

    def config_snippet(self, uid: str, base_url: str | None = None) -> ConfigSnippet:
        """Agent configuration for bot ``uid``: ``.mcp.json`` and the
        ``claude mcp add`` line with URL and token. ``base_url`` defaults to
        the owned listener's address. Raises ValueError for a malformed uid
        or when no base URL is known."""
        if base_url is None:
            address = self.listen_address
            if address is None:
                raise ValueError("the bridge is not listening; pass base_url")
            host, port = address
            base_url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        return config_snippet(uid, base_url, self._settings.token)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._started else "new"
        return f"<Bridge {self.config.name} {state} bots={len(self._links)}>"
