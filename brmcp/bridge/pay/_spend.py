"""The spend log ``mcpspend.json`` (BRIDGE.md §Spend log and approvals).

A JSON array of entries, oldest first, each with the keys (in this order)
``ts`` (unix seconds), ``bot`` (payee uid), ``tool``, ``rail`` (``"tip"``),
``atoms``, ``status`` (``pending`` | ``paid`` | ``failed``; omitted when
empty), ``err`` (omitted when empty), then this implementation's additions
``prepay`` (``true`` on a prepayment, else omitted) and ``callKey`` (the
logical call's ``brmcp/callKey``, omitted when unknown), ``argsHash`` (the
sha256 hex of the call's arguments as canonical JSON, :func:`arguments_hash`;
omitted when unknown), ``scheduled`` and ``answered`` (``true`` once the
call that took the entry over after a restart or an expired tip wait was
answered under its callKey: the entry is then never taken over again).
The Go reference (karamble/brmcp
``bridge/``) reads the same file and ignores the added keys; entries without
a status were written by older versions and count as paid. The entry, with
its callKey, tool and argsHash, is on disk (fsynced) before money moves, so
after a crash the agent's identical call (same bot, tool and argsHash)
takes over that callKey instead of paying again (BRIDGE.md §Failures).

The rolling day total is the sum of entries with ``ts ≥ now - 86400`` whose
status is not ``failed``: pending payments count, so a payment whose outcome
is unknown, or that brclient may still complete, uses up budget until its
late outcome arrives (:meth:`SpendLog.resolve`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from brmcp._ops import gojson as _gojson
from brmcp.bridge.base import BridgeError, read_text, write_atomic

__all__ = [
    "BOT_REPLAY_SECONDS",
    "DAY_SECONDS",
    "PRUNE_THRESHOLD",
    "SPEND_FILE",
    "STATUS_FAILED",
    "STATUS_PAID",
    "STATUS_PENDING",
    "BotBalance",
    "InDoubtSpend",
    "SpendEntry",
    "SpendLog",
    "SpendSummary",
    "arguments_hash",
]

#: Marks a ``failed`` entry that older versions wrote for a tip brclient
#: still retried (they did not count it); a late completion of such an entry
#: still turns it paid. This version keeps those tips ``pending`` instead.
MAY_LAND = "may still land"
#: File name inside the bridge's data directory.
SPEND_FILE = "mcpspend.json"
STATUS_PENDING = "pending"
STATUS_PAID = "paid"
STATUS_FAILED = "failed"
#: Length of the rolling spending window in seconds.
DAY_SECONDS = 24 * 60 * 60
#: How long a bot replays a call's outcome to its callKey (WIRE.md §callKey):
#: an unanswered paid entry older than this is not taken over after a restart.
BOT_REPLAY_SECONDS = 30 * 60
#: The log is pruned only while it holds more entries than this.
PRUNE_THRESHOLD = 1000

_FIELDS: dict[str, _gojson.Kind] = {
    "ts": "int64",
    "bot": "string",
    "tool": "string",
    "rail": "string",
    "atoms": "int64",
    "status": "string",
    "err": "string",
    "prepay": "bool",
    "callKey": "string",
    "scheduled": "bool",
    "argsHash": "string",
    "answered": "bool",
}


def arguments_hash(arguments: Mapping[str, Any] | None) -> str:
    """The ``argsHash`` of a call's ``arguments`` (None counts as ``{}``):
    the sha256 hex (64 characters) of their canonical JSON (keys sorted, no
    spaces, non-ASCII kept as UTF-8). Two calls with equal arguments get the
    same hash whatever the key order the agent sent."""
    text = json.dumps(
        dict(arguments or {}), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class SpendEntry:
    """One payment attempt: ``ts`` unix seconds when it was launched,
    ``bot`` the payee uid, ``tool`` the tool that asked, ``rail`` ``"tip"``,
    ``atoms`` the amount, ``status`` and ``err`` as in the module docs;
    ``prepay`` marks a prepayment (BRIDGE.md §Pay alongside and prepay): money sent ahead of
    need, written ``"prepay": true`` (omitted otherwise; the Go reference
    ignores the key); ``call_key`` is the ``brmcp/callKey`` (32 hex) of the
    logical call the payment was for, written ``"callKey"`` (omitted when
    None: entries of older versions and of the Go reference, and payments
    made for no one call)."""

    ts: int
    bot: str
    tool: str
    rail: str = "tip"
    atoms: int = 0
    status: str = ""
    err: str = ""
    prepay: bool = False
    call_key: str | None = None
    #: The wallet took the payment (brclient's ``TipUser`` returned: the tip
    #: is stored and its outcome will be reported), written
    #: ``"scheduled": true``; False also for entries of older versions.
    scheduled: bool = False
    #: :func:`arguments_hash` of the call's arguments, written ``"argsHash"``
    #: (None: entries of older versions and of the Go reference, prepayments).
    args_hash: str | None = None
    #: The call that took this entry over (:meth:`SpendLog.mark_answered`)
    #: was answered under its callKey, written ``"answered": true``: a later
    #: identical call is a new call, not a retry of that one, so the entry
    #: is never taken over again (its own outcome still settles it).
    answered: bool = False

    @property
    def counts(self) -> bool:
        """True unless the payment definitely failed (pending, paid and
        legacy entries use up budget)."""
        return self.status != STATUS_FAILED

    def to_dict(self) -> dict[str, Any]:
        """The JSON object in the Go key order, empty status/err omitted."""
        out: dict[str, Any] = {
            "ts": self.ts,
            "bot": self.bot,
            "tool": self.tool,
            "rail": self.rail,
            "atoms": self.atoms,
        }
        if self.status:
            out["status"] = self.status
        if self.err:
            out["err"] = self.err
        if self.prepay:
            out["prepay"] = True
        if self.call_key is not None:
            out["callKey"] = self.call_key
        if self.scheduled:
            out["scheduled"] = True
        if self.args_hash is not None:
            out["argsHash"] = self.args_hash
        if self.answered:
            out["answered"] = True
        return out


@dataclass(frozen=True, slots=True)
class BotBalance:
    """A bot's report of this user's prepaid balance there: ``atoms`` from
    the latest receipt (``brmcp/balanceAtoms``) or ``payment_required``
    refusal it sent, at ``ts`` (unix seconds, the bridge clock). Kept in
    memory only (not part of ``mcpspend.json``)."""

    atoms: int
    ts: int


@dataclass(frozen=True, slots=True)
class SpendSummary:
    """A copy of the log (oldest first) and its rolling 24-hour total in
    atoms (failed entries excluded)."""

    entries: tuple[SpendEntry, ...]
    day_total_atoms: int

    def to_dict(self) -> dict[str, Any]:
        return {"entries": [e.to_dict() for e in self.entries], "day_total_atoms": self.day_total_atoms}


class _Row:
    """A log slot; ``live`` while this process is still paying it;
    ``adopted`` while a call has claimed it (:meth:`SpendLog.in_doubt`);
    ``settled`` is set once :meth:`SpendLog.resolve` decided it."""

    __slots__ = ("adopted", "entry", "inherited", "live", "settled")

    def __init__(self, entry: SpendEntry, live: bool) -> None:
        self.entry = entry
        self.live = live
        self.adopted = False
        #: An earlier process left it with its call not known answered:
        #: pending (its payment was in flight; it may have been settled
        #: since), or paid for a call of known tool and arguments (the
        #: process may have died before the result reached the agent); and
        #: no call of this process has taken it over yet.
        known_call = entry.call_key is not None and entry.args_hash is not None
        self.inherited = (
            not live
            and not entry.answered
            and (entry.status == STATUS_PENDING or (entry.status == STATUS_PAID and known_call))
        )
        self.settled: anyio.Event | None = None

    def settle(self, entry: SpendEntry) -> None:
        self.entry = entry
        if self.settled is not None:
            self.settled.set()


class InDoubtSpend:
    """A ``pending`` spend entry whose payment this process is not making
    right now: written by an earlier process (a crash or stop while the tip
    was in flight), or whose tip wait ran out or whose tip brclient retries
    later. Its money may or may not have moved; a late tip outcome settles
    it (:meth:`SpendLog.resolve`).

    The attributes read the entry as it is now: :attr:`bot`, :attr:`tool`,
    :attr:`atoms`, :attr:`ts` (unix seconds), :attr:`call_key` (None for
    entries of older versions), :attr:`prepay`, :attr:`status` and
    :attr:`err`; :attr:`adopted` is True while a call has claimed it
    (:meth:`brmcp.bridge.pay._settle.Settler.adopt`). Handles compare equal when
    they name the same entry."""

    __slots__ = ("_row",)

    def __init__(self, row: _Row) -> None:
        self._row = row

    @property
    def entry(self) -> SpendEntry:
        """The entry as it is now (a copy; it changes when settled)."""
        return self._row.entry

    @property
    def bot(self) -> str:
        return self._row.entry.bot

    @property
    def tool(self) -> str:
        return self._row.entry.tool

    @property
    def atoms(self) -> int:
        return self._row.entry.atoms

    @property
    def ts(self) -> int:
        return self._row.entry.ts

    @property
    def call_key(self) -> str | None:
        return self._row.entry.call_key

    @property
    def args_hash(self) -> str | None:
        """:func:`arguments_hash` of the arguments of the call it paid for
        (None for entries of older versions and prepayments)."""
        return self._row.entry.args_hash

    @property
    def answered(self) -> bool:
        """The call that took the entry over was answered (:attr:`SpendEntry.answered`)."""
        return self._row.entry.answered

    @property
    def scheduled(self) -> bool:
        """The wallet took the payment before the process that made it stopped."""
        return self._row.entry.scheduled

    @property
    def prepay(self) -> bool:
        return self._row.entry.prepay

    @property
    def status(self) -> str:
        """``pending`` until a late outcome settles it ``paid`` or ``failed``."""
        return self._row.entry.status

    @property
    def err(self) -> str:
        return self._row.entry.err

    @property
    def settled(self) -> bool:
        """True once the entry is no longer pending."""
        return self._row.entry.status != STATUS_PENDING

    @property
    def adopted(self) -> bool:
        return self._row.adopted

    async def wait_settled(self) -> str:
        """Wait until a late outcome settles the entry; returns its status
        (``paid`` or ``failed``). Cancellable; bound it with a timeout (a
        payment brclient never reports stays pending)."""
        row = self._row
        while row.entry.status == STATUS_PENDING:
            if row.settled is None:
                row.settled = anyio.Event()
            await row.settled.wait()
        return row.entry.status

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InDoubtSpend) and other._row is self._row

    def __hash__(self) -> int:
        return id(self._row)

    def __repr__(self) -> str:
        entry = self._row.entry
        return (
            f"<InDoubtSpend {entry.atoms} atoms to {entry.bot[:8]} for {entry.tool!r}"
            f" ts={entry.ts} status={entry.status}{' adopted' if self._row.adopted else ''}>"
        )


class SpendTicket:
    """Handle to an entry added by :meth:`SpendLog.launch`."""

    __slots__ = ("_row",)

    def __init__(self, row: _Row) -> None:
        self._row = row

    @property
    def entry(self) -> SpendEntry:
        """The entry as it is now (it changes when the payment ends or a
        late outcome settles it)."""
        return self._row.entry

    @property
    def live(self) -> bool:
        """True while this process is still making the payment."""
        return self._row.live


class SpendLog:
    """The in-memory spend log and its file. Not safe for concurrent
    mutation: the caller serializes access (the bridge holds a lock across
    the cap check, the reservation and the write)."""

    def __init__(self, path: Path, entries: list[SpendEntry] | None = None) -> None:
        self.path = path
        self._rows = [_Row(e, False) for e in entries or ()]

    @classmethod
    def load(cls, path: Path) -> SpendLog:
        """Read the log (missing file or ``null``: empty). Raises
        :class:`BridgeError` ``parse <path>: …`` for malformed content."""
        try:
            text = read_text(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise BridgeError(f"read {path}: {exc}") from None
        if text is None:
            return cls(path)
        try:
            raw = _gojson.decode_struct_list(_gojson.loads(text), _FIELDS, struct="spend entries")
        except _gojson.GoJSONError as exc:
            raise BridgeError(f"parse {path}: {exc}") from None
        entries = [
            SpendEntry(
                ts=item.get("ts", 0),
                bot=item.get("bot", ""),
                tool=item.get("tool", ""),
                rail=item.get("rail", ""),
                atoms=item.get("atoms", 0),
                status=item.get("status", ""),
                err=item.get("err", ""),
                prepay=item.get("prepay", False),
                call_key=item.get("callKey") or None,
                scheduled=item.get("scheduled", False),
                args_hash=item.get("argsHash") or None,
                answered=item.get("answered", False),
            )
            for item in raw
        ]
        return cls(path, entries)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def entries(self) -> tuple[SpendEntry, ...]:
        return tuple(row.entry for row in self._rows)

    def day_total(self, now: int) -> int:
        """Atoms spent in the rolling 24 hours ending at ``now`` (unix
        seconds): entries with ``ts ≥ now - 86400`` that are not failed."""
        since = now - DAY_SECONDS
        return sum(r.entry.atoms for r in self._rows if r.entry.ts >= since and r.entry.counts)

    def summary(self, now: int) -> SpendSummary:
        return SpendSummary(self.entries, self.day_total(now))

    def launch(
        self,
        *,
        ts: int,
        bot: str,
        tool: str,
        atoms: int,
        prepay: bool = False,
        call_key: str | None = None,
        args_hash: str | None = None,
    ) -> SpendTicket:
        """Append a ``pending`` tip entry for a payment this process is about
        to make (``prepay``: a prepayment; ``call_key``: the logical call's
        ``brmcp/callKey``, recorded as ``"callKey"``; ``args_hash``: its
        :func:`arguments_hash`, recorded as ``"argsHash"``); it stays invisible to
        :meth:`resolve` and :meth:`in_doubt` until :meth:`finish`."""
        row = _Row(
            SpendEntry(
                ts=ts,
                bot=bot,
                tool=tool,
                rail="tip",
                atoms=atoms,
                status=STATUS_PENDING,
                prepay=prepay,
                call_key=call_key,
                args_hash=args_hash,
            ),
            True,
        )
        self._rows.append(row)
        return SpendTicket(row)

    def mark_scheduled(self, ticket: SpendTicket) -> None:
        """Record that the wallet took the payment of a live entry
        (:attr:`SpendEntry.scheduled`)."""
        row = ticket._row
        row.entry = dataclasses.replace(row.entry, scheduled=True)

    def withdraw(self, ticket: SpendTicket) -> None:
        """Remove an entry whose payment was never started."""
        row = ticket._row
        self._rows = [r for r in self._rows if r is not row]

    def finish(self, ticket: SpendTicket, status: str, err: str = "") -> None:
        """Record the outcome of a live payment: ``paid`` (``err`` is then a
        note, e.g. that its agent went away), ``failed`` with ``err``, or
        ``pending`` (outcome unknown, or the tip may still land: it stays
        counted and becomes claimable by :meth:`resolve` and listed by
        :meth:`in_doubt`; ``err`` says why)."""
        row = ticket._row
        row.live = False
        row.entry = dataclasses.replace(row.entry, status=status, err=err)

    def resolve(self, payee: str, atoms: int, err: str | None) -> bool:
        """Settle the oldest pending entry (not being paid right now) for
        exactly ``atoms`` to ``payee`` (case-insensitive), preferring one the
        wallet took (:attr:`SpendEntry.scheduled`): ``paid`` when
        ``err`` is None, else ``failed`` with ``err`` (the Go reference's
        ``ResolveSpend``). Pending entries include those whose tip brclient
        retries later. A late completion also claims a ``failed`` entry that
        an older version wrote with "may still land" when no pending one
        matches. Legacy entries are never claimed. Returns False when nothing
        matches."""
        wanted = payee.lower()
        claimable = [
            row
            for row in self._rows
            if not row.live and row.entry.atoms == atoms and row.entry.bot.lower() == wanted
        ]
        pending = [r for r in claimable if r.entry.status == STATUS_PENDING]
        # An entry the wallet took (scheduled) is the one a tip outcome can
        # belong to; one whose process stopped before that may have no tip.
        row = next((r for r in pending if r.entry.scheduled), None) or next(iter(pending), None)
        if row is None and err is None:
            row = next(
                (r for r in claimable if r.entry.status == STATUS_FAILED and MAY_LAND in r.entry.err), None
            )
        if row is None:
            return False
        if err is None:
            row.settle(dataclasses.replace(row.entry, status=STATUS_PAID, err=""))
        else:
            row.settle(dataclasses.replace(row.entry, status=STATUS_FAILED, err=err))
        return True

    def mark_answered(self, entry: InDoubtSpend) -> bool:
        """Record that the call which took ``entry`` over was answered under
        its callKey (:attr:`SpendEntry.answered`): it is no longer inherited
        and is never taken over again. Returns False when it already was
        (nothing to write)."""
        row = entry._row
        row.inherited = False
        if row.entry.answered:
            return False
        row.entry = dataclasses.replace(row.entry, answered=True)
        return True

    def mark_key_answered(self, call_key: str) -> bool:
        """Record that the logical call ``call_key`` (32 hex) was answered
        with its result: no entry paid under that callKey, to any bot (a
        pool's members too), is taken over again, in this process or after
        a restart. Each one gets :attr:`SpendEntry.answered` on disk: one
        still ``pending`` (brclient has not confirmed its tip, although the
        bot already ran the call paid alongside), and a ``paid`` one, which
        a restarted process would otherwise take for a call that died
        between its payment and its result. Returns True when an entry
        changed (the log must be written)."""
        changed = False
        for row in self._rows:
            if row.entry.call_key != call_key:
                continue
            row.inherited = False
            if row.entry.status != STATUS_FAILED and not row.entry.answered:
                row.entry = dataclasses.replace(row.entry, answered=True)
                changed = True
        return changed

    def paying(self, payee: str, atoms: int) -> bool:
        """True while this process is making a payment of exactly ``atoms``
        to ``payee`` (case-insensitive): a late outcome for it may come
        before its entry is finished."""
        wanted = payee.lower()
        return any(r.live and r.entry.atoms == atoms and r.entry.bot.lower() == wanted for r in self._rows)

    def in_doubt(self, bot: str) -> list[InDoubtSpend]:
        """The ``pending`` entries to ``bot`` (case-insensitive) that this
        process is not paying right now, oldest first: written by an earlier
        process, or whose tip wait ran out, or whose tip brclient retries
        later (see :class:`InDoubtSpend`)."""
        wanted = bot.lower()
        return [
            InDoubtSpend(r)
            for r in self._rows
            if not r.live and r.entry.status == STATUS_PENDING and r.entry.bot.lower() == wanted
        ]

    def inherited(self, bot: str) -> list[InDoubtSpend]:
        """The entries to ``bot`` (case-insensitive) an earlier process left
        without knowing their call answered, that have not failed since,
        oldest first: ``pending`` when this process loaded the log (their
        payment was in flight; a late outcome may have settled them
        ``paid`` since), or ``paid`` with a callKey and argsHash but not
        ``answered`` (the process stopped between the payment and the
        result)."""
        wanted = bot.lower()
        return [
            InDoubtSpend(r)
            for r in self._rows
            if r.inherited and r.entry.status != STATUS_FAILED and r.entry.bot.lower() == wanted
        ]

    def prune(self, now: int) -> int:
        """Drop old entries while the log holds more than 1000: at most
        ``len - 1000`` of the oldest, stopping at the first entry that is in
        the rolling window or pending. Returns how many were dropped."""
        excess = len(self._rows) - PRUNE_THRESHOLD
        if excess <= 0:
            return 0
        since = now - DAY_SECONDS
        dropped = 0
        for row in self._rows[:excess]:
            if row.entry.ts >= since or row.entry.status == STATUS_PENDING:
                break
            dropped += 1
        if dropped:
            del self._rows[:dropped]
        return dropped

    def to_json(self) -> str:
        """The file content: Go's ``MarshalIndent`` with two spaces."""
        return _gojson.dumps([r.entry.to_dict() for r in self._rows], indent=True)

    def prepare(self, now: int) -> str:
        """Prune (see :meth:`prune`) and return the file content to write."""
        self.prune(now)
        return self.to_json()

    def write(self, content: str) -> None:
        """Write ``content`` (from :meth:`prepare`) atomically with mode 0600.
        Raises :class:`BridgeError` naming the path."""
        try:
            write_atomic(self.path, content)
        except OSError as exc:
            raise BridgeError(f"write {self.path}: {exc}") from None
