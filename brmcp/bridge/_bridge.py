"""The client bridge: a local MCP endpoint per bot, under the user's spending
policy (BRIDGE.md).

Stock MCP agents connect to ``http://127.0.0.1:PORT/mcp/<bot uid>`` with a
bearer token and see an ordinary MCP server; behind it the bridge relays over
Bison Relay PMs and pays for tools within the caps the user set.

This module is the composition root: it builds the rooms' parts (links,
payments, finding, the agent and admin surfaces) and runs them. The settings
and the owned endpoint are kept by :class:`~._settingskeeper.SettingsKeeper`,
the payments and the finding the admin surface reads by
:class:`~._paydesk.PayDesk` and :class:`~._finddesk.FindDesk`; the host's
input is :class:`~._config.BridgeConfig`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from mcp.types import Implementation

from brmcp._ops.listener import (
    SHUTDOWN_GRACE,
    OwnedListener,
    parse_listen_address,
)
from brmcp.bridge.admin import ConfigSnippet, admin_handler, config_snippet
from brmcp.bridge.admin.ui import UISessions, ui_handler
from brmcp.bridge.agent import AgentDiscovery, BotProxy, BridgeApp
from brmcp.bridge.base import (
    ADMIN_TOKEN_FILE,
    DEFAULT_LISTEN,
    SETTINGS_FILE,
    load_settings,
)
from brmcp.bridge.find import (
    RECEIPTS_FILE,
    BotRequestQueue,
    Discovery,
    ReceiptBook,
)
from brmcp.bridge.links import (
    BotLink,
    BotSnapshot,
    SnapshotStore,
    relay_estimator,
)
from brmcp.bridge.pay import (
    SPEND_FILE,
    Funding,
    Pools,
    Settler,
    SpendLog,
)
from brmcp.transport.router import Router

from ._admintoken import load_admin_token
from ._config import BridgeConfig
from ._finddesk import FindDesk
from ._paydesk import PayDesk
from ._settingskeeper import SettingsKeeper

__all__ = ["ADMIN_TOKEN_FILE", "DEFAULT_LISTEN", "Bridge", "BridgeConfig"]

log = logging.getLogger("brmcp.bridge")


class Bridge(SettingsKeeper, FindDesk, PayDesk):
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
        self._admin_token = await anyio.to_thread.run_sync(load_admin_token, self._data_dir)
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

    def _approval_hint(self, payment_id: str) -> str:
        """How the user decides a parked payment (logged when it parks)."""
        command = f"{self.cli_command} approvals"
        page = ""
        if self._listener is not None:
            page = f", or on the approvals page (login link: {self.cli_command} ui)"
        return f"approve with: {command} approve {payment_id} (or: {command} deny {payment_id}){page}"

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

    def link(self, uid: str) -> BotLink | None:
        """The link to bot ``uid`` if one was built (observability)."""
        return self._links.get(uid.lower())

    # -- the approvals page and agent configuration ----------------------------------

    @property
    def ui_sessions(self) -> UISessions:
        """Login tickets and browser sessions of the approvals page."""
        return self._ui_sessions

    def clock_now(self) -> float:
        """The bridge clock's time (unix seconds)."""
        return self._clock.now()

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
