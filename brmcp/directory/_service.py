"""The directory: a brmcp harness serving the public and admin tools, plus
the client side that crawls and live-tests providers (docs/directory.md;
karamble/brmcp, ``directory/service.go``).

Use::

    async with Directory(DirectoryConfig(data_dir, policy, payer)) as directory:
        router = await directory.start(sender)
        # feed every PM to directory.handle_pm(peer, text)
        # feed every received tip to await directory.credit_tip(uid, matoms, seq)

The directory owns one task group: the pipeline runs, the invites after a
key exchange, the push-status notifications (statuspush.py) and the
maintenance sweep (every ``sweep_interval`` seconds on the config's clock).
Leaving the ``async with`` cancels them; a run cut off this way keeps its
stored state and continues at the next start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import anyio
import anyio.abc

from brmcp._ops.clock import Clock, SystemClock
from brmcp.server import Harness, HarnessConfig
from brmcp.server.chathelp import ChatHelp
from brmcp.transport.router import Router, RouterOptions
from brmcp.transport.sender import PMSender
from brmcp.wire import is_batch, is_envelope

from .db import ADMIN_LOG_FILENAME, AdminLog, DirectoryStore
from .model import SNAPSHOT_KEY_FILENAME, Policy, Signer, StatusPush
from .payer import Federation, Introducer, Payer, Pipeline, ProviderClient, Suggester, Timeouts
from .tools import ADMIN_TOOLS, register_admin_tools, register_public_tools

__all__ = ["SWEEP_INTERVAL", "Directory", "DirectoryConfig", "help_text"]

log = logging.getLogger("brmcp.directory")

#: Seconds between maintenance sweeps (Go's ``sweepInterval``).
SWEEP_INTERVAL = 60.0


@dataclass(slots=True)
class DirectoryConfig:
    """What a directory needs (Go's ``directory.Config``).

    * ``data_dir``: the harness's database (balances, calls, tips and the
      directory's tables, unless the policy's ``store`` names a PostgreSQL
      database), ``snapshotkey.json`` and ``adminlog.json``;
    * ``policy``: the terms (:class:`~.policy.Policy`);
    * ``payer``: settles the directory's outbound payments (tests,
      snapshot purchases);
    * ``introducer``: mediated key exchanges toward leads (None: a lead that
      cannot be reached is not pursued further);
    * ``suggester``: KX suggestions for ``introduce`` (None: the tool refuses);
    * ``self_uid``: the directory's own uid when known (it cannot list
      itself, nor become its own lead); see :meth:`Directory.set_self_uid`;
    * ``clock``: time for stamps, expiry, credit polls and the sweep;
    * ``router_options``: the harness router's transport settings;
    * ``timeouts``: the outbound client's bounds (:class:`~.client.Timeouts`);
    * ``sweep_interval``: seconds between maintenance sweeps (<= 0: none).
    """

    data_dir: str | os.PathLike[str]
    policy: Policy
    payer: Payer
    introducer: Introducer | None = None
    suggester: Suggester | None = None
    self_uid: str | None = None
    clock: Clock = field(default_factory=SystemClock)
    router_options: RouterOptions = field(default_factory=RouterOptions)
    timeouts: Timeouts = field(default_factory=Timeouts)
    sweep_interval: float = SWEEP_INTERVAL


def help_text(nick: str, uid: str, live: int) -> str:
    """The plain-chat orientation reply: what the directory is, its live
    listing count and how to reach it from an agent through brmcp-bridge."""
    plural = "" if live == 1 else "s"
    return (
        f"I am {nick or uid[:16]}, a directory of MCP tool providers on Bison Relay, currently listing "
        f"{live} verified provider{plural}. I do not read chat; connect an AI agent to use me.\n\n"
        "With brmcp's bridge (pip install brmcp) next to your own brclient:\n"
        f"1. brmcp-bridge settings set enabled=true allowed_bots={uid}\n"
        "2. brmcp-bridge\n"
        f"3. brmcp-bridge config-snippet {uid}\n\n"
        "Then: search finds tools (free), introduce connects you with a provider, register lists "
        "your own bot, and the policy tool shows my fees.\n\n(This reply comes at most once an hour.)"
    )


class Directory:
    """A running directory. Construction opens the data directory (the
    snapshot key is created on first use); raises
    :class:`brmcp.server.HarnessError` or
    :class:`~.snapshot.SnapshotError` naming the file that is unusable."""

    def __init__(self, config: DirectoryConfig) -> None:
        self.config = config
        self.policy = config.policy
        self.clock = config.clock
        data = Path(config.data_dir).expanduser()
        self.signer = Signer.load_or_create(data / SNAPSHOT_KEY_FILENAME)
        self._self_uid = config.self_uid
        self._nick = ""
        self._admin_tools = frozenset(ADMIN_TOOLS)
        self.harness = Harness(
            HarnessConfig(
                data_dir=data,
                store=self.policy.store,
                allow=lambda _peer: True,
                calls_per_minute=self.policy.calls_per_minute,
                tool_visible=self._tool_visible,
                router_options=config.router_options,
                name=self.policy.name,
                clock=config.clock.now,
            )
        )
        self.store = DirectoryStore(self.harness)
        self.status_push = StatusPush(self.harness, lambda uid: self.pipeline.status(uid))
        self.client = ProviderClient(
            lambda: self.harness.router,
            name=self.policy.name,
            clock=config.clock,
            payer=config.payer,
            store=self.store,
            timeouts=config.timeouts,
        )
        self.pipeline = Pipeline(
            store=self.store,
            client=self.client,
            policy=self.policy,
            clock=config.clock,
            self_uid=self.self_uid,
            on_change=self.status_push.changed,
        )
        self.federation = Federation(
            store=self.store,
            client=self.client,
            policy=self.policy,
            clock=config.clock,
            introducer=config.introducer,
            self_uid=self.self_uid,
        )
        self.admin_log = AdminLog(data / ADMIN_LOG_FILENAME, config.clock.now)
        self.chat_help = ChatHelp()
        register_public_tools(self.harness, self)
        register_admin_tools(self.harness, self)
        self.status_push.install()
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None

    # -- identity ----------------------------------------------------------------------

    def self_uid(self) -> str | None:
        """The directory's own uid, once known."""
        return self._self_uid

    def set_self_uid(self, uid: str, nick: str = "") -> None:
        """Record the directory's uid (and nick, for the chat reply) when
        the host learns it (brclient's identity)."""
        self._self_uid = uid
        self._nick = nick

    @property
    def public_key(self) -> str:
        """The hex ed25519 key snapshots are signed with."""
        return self.signer.public_hex

    def _tool_visible(self, peer: str, tool: str) -> bool:
        return tool not in self._admin_tools or self.policy.is_admin(peer)

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Directory:
        if self._stack is not None:
            raise RuntimeError("Directory already entered")
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await stack.enter_async_context(self.harness)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    def _unbind(self, tg: anyio.abc.TaskGroup) -> None:
        # Runs first on exit: nothing new starts, the outbound sessions close
        # without a word to the peers, then the tasks are cancelled.
        self.pipeline.bind(None)
        self.federation.bind(None)
        self.status_push.bind(None)
        self.client.close_all()
        tg.cancel_scope.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        return await stack.__aexit__(exc_type, exc_val, exc_tb)

    async def start(self, sender: PMSender) -> Router:
        """Serve: returns the router whose ``handle_pm`` the host feeds with
        every PM (or use :meth:`handle_pm`). Runs left crawling or testing
        continue, funding is re-checked and the sweep starts. Requires
        ``async with directory``."""
        if self._stack is None or self._tg is not None:
            raise RuntimeError(
                "enter the directory first: 'async with directory: await directory.start(sender)'"
            )
        router = await self.harness.start(sender)
        # Entered after the router, so it is left (its tasks cancelled) before it.
        await self._stack.enter_async_context(self.attached())
        return router

    @asynccontextmanager
    async def attached(self) -> AsyncIterator[None]:
        """Run the directory on a harness its host entered and started
        (``brmcp.server.run_bot`` does both for the ``brmcpdir`` daemon):
        the tables are created when missing, runs left crawling or testing
        continue, funding is re-checked and the sweep starts; leaving closes
        the outbound sessions silently and cancels the directory's tasks.
        Raises RuntimeError when the harness is not started or the
        directory already runs."""
        if self.harness.router is None or self._tg is not None:
            raise RuntimeError("attached() needs a started harness and a directory not yet running")
        await self.store.open()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                self.pipeline.bind(tg)
                self.federation.bind(tg)
                self.status_push.bind(tg)
                await self.pipeline.resume()
                if self.config.sweep_interval > 0:
                    tg.start_soon(self._sweeper, name="brmcpdir-sweep")
                yield
            finally:
                self._unbind(tg)
                self._tg = None

    @asynccontextmanager
    async def serve(self, sender: PMSender) -> AsyncIterator[Router]:
        """``async with directory.serve(sender) as router:`` enters, starts
        and closes the directory."""
        async with self:
            yield await self.start(sender)

    async def _sweeper(self) -> None:
        while True:
            await self.clock.sleep(self.config.sweep_interval)
            try:
                await self.sweep()
            except Exception:
                log.exception(
                    "maintenance sweep failed; the next one runs in %gs", self.config.sweep_interval
                )

    async def sweep(self) -> None:
        """One maintenance pass now (expiry, free re-crawls, funding)."""
        await self.pipeline.sweep()

    # -- the host's events ---------------------------------------------------------------

    @property
    def router(self) -> Router | None:
        return self.harness.router

    def handle_pm(self, peer: str, text: str) -> None:
        """Feed one PM (envelopes and batches; chat is ignored here, see
        :meth:`chat_reply`). Raises RuntimeError before :meth:`start`."""
        router = self.harness.router
        if router is None:
            raise RuntimeError("directory not started")
        router.handle_pm(peer, text)

    async def chat_reply(self, sender: str, text: str) -> str | None:
        """The orientation reply for a plain-chat PM from ``sender``, at most
        once per sender per hour (:class:`brmcp.server.chathelp.ChatHelp`);
        None for envelopes, for a sender answered within the hour, or
        before the directory knows its own uid."""
        me = self._self_uid
        if not me or is_envelope(text) or is_batch(text) or not self.chat_help.should_reply(sender):
            return None
        return help_text(self._nick, me, len(await self.store.listings()))

    async def credit_tip(self, from_uid: str, amount_matoms: int, sequence_id: int) -> int:
        """Credit a received tip to the sender's balance (any sender; once
        per tip, deduplicated by brclient's sequence id in the ledger's
        transaction) and re-check that sender's funding. Returns the atoms
        credited (0 for a redelivery). Raises ValueError for amounts or ids
        that do not fit 64 bits (nothing recorded)."""
        atoms = await self.harness.credit_tip(from_uid, amount_matoms, sequence_id)
        if atoms > 0:
            self.pipeline.changed(from_uid)
            await self.pipeline.poke_funding(from_uid)
        return atoms

    async def funding_changed(self, uid: str) -> None:
        """A tip from ``uid`` was credited by the host (``run_bot``'s
        ``on_tip_received``): re-check its funding. Before :meth:`attached`
        runs this does nothing; the start re-checks every registration."""
        if self._tg is not None:
            self.pipeline.changed(uid)
            await self.pipeline.poke_funding(uid)

    def notify_kx(self, uid: str) -> None:
        """A key exchange with ``uid`` completed (brclient's KX stream): a
        lead pursuit waiting on it sends its invite."""
        self.federation.notify_kx(uid)

    async def live_listings(self) -> int:
        """How many providers are listed now."""
        return len(await self.store.listings())
