"""What one bot link knows of its bot and keeps across restarts (BRIDGE.md
§Eras and snapshots): the tool snapshot in force (:mod:`._toolsnap`), the
bot's era and capabilities, and the snapshot written to the store with the
round-trip time measured to the bot (:mod:`._retry`), so that after a restart
``tools/list`` is served with no PM and re-sends start from a measured RTT.
:class:`~._link.BotLink` builds the sessions on it."""

from __future__ import annotations

import logging

import anyio
import anyio.abc
import anyio.to_thread
from mcp.types import ServerCapabilities, Tool

from brmcp._ops.clock import Clock
from brmcp.protocol.pool import PoolAnnouncement

from ._retry import RttEstimator
from ._snapshots import BotSnapshot, Era, SnapshotStore
from ._toolsnap import ToolSnapshot

__all__ = ["RTT_SAVE_INTERVAL", "RTT_SAVE_RATIO", "LinkTools"]

log = logging.getLogger("brmcp.bridge")


#: Least seconds (on the link's clock) between two snapshot writes made
#: because the measured RTT moved (:meth:`BotLink._rtt_sampled`); other
#: snapshot writes carry the RTT too.
RTT_SAVE_INTERVAL = 600.0
#: The measured RTO is written again once it is this many times the one on
#: disk, or less than its inverse.
RTT_SAVE_RATIO = 1.5


class LinkTools:
    """The tool snapshot, era and capabilities of the bot ``uid``, and their
    persistence in ``_store`` (set up by :class:`~._link.BotLink`)."""

    uid: str
    rtt: RttEstimator
    _clock: Clock
    _tg: anyio.abc.TaskGroup
    _store: SnapshotStore | None
    _closed: bool
    _toolsnap: ToolSnapshot
    #: The RTO of the RTT last put in a snapshot, and when (link clock).
    _rtt_saved: float | None
    _rtt_saved_at: float | None

    @property
    def tools(self) -> list[Tool] | None:
        """The last snapshot (None before the first one), possibly stale."""
        return self._toolsnap.tools

    @property
    def marks_refusals(self) -> bool:
        """True when the tool list in force said ``"brmcp/marksRefusals":
        true`` (see :attr:`.ToolSnapshot.marks_refusals`)."""
        return self._toolsnap.marks_refusals

    @property
    def receipt_key(self) -> str | None:
        """The receipt key (64 hex) the bot announced in the tool list in
        force (``brmcp/receiptKey``, WIRE.md §Signed receipts), or None."""
        return getattr(self._toolsnap.tools, "receipt_key", None)

    @property
    def pool(self) -> PoolAnnouncement | None:
        """The pool this bot announced itself a member of in the tool list
        in force (``brmcp/pool``, WIRE.md §Pools), or None: none announced,
        or an announcement that does not hold for this bot (its own uid not
        among the members, or a key other than its ``brmcp/receiptKey``)."""
        pool = getattr(self._toolsnap.tools, "pool", None)
        if not isinstance(pool, PoolAnnouncement) or not pool.lists(self.uid) or pool.key != self.receipt_key:
            return None
        return pool

    @property
    def tools_bytes(self) -> int:
        """UTF-8 bytes of the JSON of the snapshot's tools (0 before the
        first; see :attr:`.ToolSnapshot.tools_bytes`)."""
        return self._toolsnap.tools_bytes

    @property
    def refreshes(self) -> int:
        """Refreshes of the tool snapshot that reached the bot."""
        return self._toolsnap.refreshes

    def tool(self, name: str) -> Tool | None:
        """The snapshot's tool ``name`` (None: not listed)."""
        return self._toolsnap.tool(name)

    def fixed_price(self, name: str) -> int | None:
        """The fixed price of tool ``name`` in atoms (``brmcp/priceAtoms``,
        a whole number > 0), else None (free, dynamic, unknown)."""
        return self._toolsnap.fixed_price(name)

    @property
    def stale(self) -> bool:
        """True when the snapshot is not known to be current (see
        :attr:`.ToolSnapshot.stale`)."""
        return self._toolsnap.stale

    def doubt_tools(self) -> bool:
        """The snapshot may be wrong (an agent called a tool it lacks, or the
        bot does not know a tool it lists): the next :meth:`refresh` asks
        the bot, at most once per ``RECHECK_INTERVAL`` seconds. Returns True
        when it will (see :meth:`.ToolSnapshot.doubt_tools`)."""
        return self._toolsnap.doubt_tools()

    async def refresh(self) -> list[Tool]:
        """Return the tool snapshot, fetched with ``tools/list`` when there is
        none yet (see :meth:`.ToolSnapshot.refresh`). Raises
        :class:`LinkError` (:class:`~._linkbase.ToolListTooLarge` for a list
        over a bound)."""
        return await self._toolsnap.refresh()

    def _rtt_sampled(self) -> None:
        """A round trip to the bot was just measured: persist the RTT with
        the snapshot when none is on disk or the RTO moved by
        :data:`RTT_SAVE_RATIO` since, at most once per
        :data:`RTT_SAVE_INTERVAL` (other snapshot writes carry it too)."""
        measured = self.rtt.measured
        saved = self._rtt_saved
        if measured is None or self._store is None or self._closed:
            return
        if saved is not None and saved / RTT_SAVE_RATIO <= measured <= saved * RTT_SAVE_RATIO:
            return
        now = self._clock.now()
        if self._rtt_saved_at is not None and now - self._rtt_saved_at < RTT_SAVE_INTERVAL:
            return
        if self._toolsnap.record() is None:
            return  # nothing to write yet: the first snapshot will carry it
        self._rtt_saved_at = now
        self._schedule_save()

    def snapshot(self) -> BotSnapshot | None:
        """What would be persisted now (None before the era is known): the
        tool snapshot (:meth:`.ToolSnapshot.record`) with the RTT measured
        to the bot (:meth:`.retry.RttEstimator.record`), which
        :meth:`_rtt_sampled` then counts as the one on disk."""
        snapshot = self._toolsnap.record()
        if snapshot is not None:
            snapshot.rtt = self.rtt.record()
            self._rtt_saved = self.rtt.measured
        return snapshot

    def _schedule_save(self) -> None:
        """Write :meth:`snapshot` to the store in a task (when there is a
        store, something to write, and the link is open)."""
        store, snapshot = self._store, self.snapshot()
        if store is None or snapshot is None or self._closed:
            return
        self._tg.start_soon(_save, store, snapshot)

    @property
    def era(self) -> Era | None:
        """The bot's era as far as known (None: not yet contacted)."""
        return self._toolsnap.era

    @property
    def capabilities(self) -> ServerCapabilities | None:
        """The capabilities the bot declared in its last ``initialize`` (None
        before the first); a reset keeps them until the next session's."""
        return self._toolsnap.capabilities


async def _save(store: SnapshotStore, snapshot: BotSnapshot) -> None:
    try:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(store.save, snapshot)
    except (OSError, ValueError) as exc:  # ValueError: over MAX_SNAPSHOT_BYTES
        log.warning("bot %s: snapshot not written: %s", snapshot.bot[:8], exc)
