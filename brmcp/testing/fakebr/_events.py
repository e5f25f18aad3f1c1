"""The stream events of a fake brclient: one replay log per kind (``(file
<< 32) | offset`` ids, docs/clientrpc.md §Acks and replay), the open
streams each event is broadcast to, the ``emit_*`` injectors (also the
relay's way to deliver PMs and tips), and the logs' persistence across
restarts on one root (server.py documents the behaviour)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ...clientrpc.protojson import dumps
from ...clientrpc.types import KXCompleted, ReceivedPM, ReceivedTip, TipProgressEvent
from ._conn import Conn, Stream
from ._limits import MAX_MSG_SIZE, RM_OVERHEAD
from ._protocol import KIND_KX, KIND_PM, KIND_TIP_PROGRESS, KIND_TIP_RECEIVED, STREAMS
from ._state import Changes, Settings
from .replaylog import ReplayLog

__all__ = ["LOGS_FILE", "EventLog"]

log = logging.getLogger("brmcp.testing.fakebr")

#: Where the replay logs persist between runs on the same root.
LOGS_FILE = "fakebr-replaylogs.json"

Ev = TypeVar("Ev", ReceivedPM, ReceivedTip, TipProgressEvent, KXCompleted)


class EventLog:
    """The replay logs (``logs``, by kind) and open streams of one fake.

    ``settings``: the fake's identity (``uid`` for the saved logs, ``nick``
    in log lines); ``changes``: signalled on every event, ack and stream
    change; ``nicks``: uid → nick on the relay, the default nick of an
    event's peer.
    """

    def __init__(self, settings: Settings, changes: Changes, nicks: Mapping[str, str]) -> None:
        self._settings = settings
        self._changes = changes
        self._nicks = nicks
        self.logs: dict[str, ReplayLog[Any]] = {k: ReplayLog(k) for k in STREAMS.values()}
        self._streams: dict[str, list[Stream]] = {k: [] for k in STREAMS.values()}

    # -- events ------------------------------------------------------------------------

    def _emit(self, kind: str, event: Ev, sequence_id: int | None = None) -> Ev:
        replay = self.logs[kind]
        line = dumps(event.to_wire())  # the stored line, before its id is known
        seq = replay.next_id(len(line.encode("utf-8")))
        if sequence_id is not None:
            seq = sequence_id
        stored = dataclasses.replace(event, sequence_id=seq)
        replay.append(seq, stored)
        params = stored.to_wire()
        for stream in list(self._streams[kind]):
            stream.conn.notify(stream.method, params)
        self._changes.changed()
        return stored

    def emit_pm(
        self,
        from_uid: str,
        message: str,
        *,
        nick: str | None = None,
        timestamp_ms: int | None = None,
        mode: str = "MESSAGE_MODE_NORMAL",
    ) -> ReceivedPM:
        """Log a received PM (as if it came from ``from_uid``) and broadcast it."""
        return self._emit(
            KIND_PM,
            ReceivedPM(
                uid=from_uid,
                nick=self._nicks.get(from_uid, "") if nick is None else nick,
                message=message,
                mode=mode,
                timestamp_ms=int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
                sequence_id=0,
            ),
        )

    def emit_received_tip(
        self, from_uid: str, amount_matoms: int, *, sequence_id: int | None = None
    ) -> ReceivedTip:
        """Log a received tip (milliatoms) and broadcast it; ``sequence_id``
        overrides the id the log would give it."""
        return self._emit(
            KIND_TIP_RECEIVED,
            ReceivedTip(uid=from_uid, amount_matoms=amount_matoms, sequence_id=0),
            sequence_id,
        )

    def emit_tip_progress(
        self,
        to_uid: str,
        amount_matoms: int,
        *,
        nick: str | None = None,
        completed: bool = False,
        attempt: int = 0,
        attempt_err: str = "",
        will_retry: bool = False,
    ) -> TipProgressEvent:
        """Log a tip-progress event for a tip to ``to_uid`` (milliatoms) and broadcast it."""
        return self._emit(
            KIND_TIP_PROGRESS,
            TipProgressEvent(
                sequence_id=0,
                uid=to_uid,
                nick=self._nicks.get(to_uid, "") if nick is None else nick,
                amount_matoms=amount_matoms,
                completed=completed,
                attempt=attempt,
                attempt_err=attempt_err,
                will_retry=will_retry,
            ),
        )

    def emit_kx_completed(
        self, uid: str, *, nick: str | None = None, initial_rendezvous: bytes = b""
    ) -> KXCompleted:
        """Log a completed KX with ``uid`` and broadcast it; ``nick`` defaults
        to that user's on the relay."""
        return self._emit(
            KIND_KX,
            KXCompleted(
                sequence_id=0,
                uid=uid,
                nick=self._nicks.get(uid, "") if nick is None else nick,
                initial_rendezvous=initial_rendezvous,
            ),
        )

    def receive_pm(self, from_uid: str, text: str, timestamp_ms: int) -> None:
        """A PM the relay delivered: logged, or dropped when its text is over
        the max message size (brclient's decompression is limited to it, so
        a compressible PM the sender accepted is dropped here, silently)."""
        if len(text.encode("utf-8")) + RM_OVERHEAD > MAX_MSG_SIZE:
            log.warning(
                "fakebr: %s dropped a PM of %d bytes (zlib read limit)", self._settings.nick, len(text)
            )
            return
        self.emit_pm(from_uid, text, timestamp_ms=timestamp_ms)

    def ack(self, kind: str, sequence_id: int) -> None:
        """brclient's ack: drop every event of ``kind`` up to ``sequence_id``."""
        self.logs[kind].ack(sequence_id)
        self._changes.changed()

    # -- streams -----------------------------------------------------------------------

    def open_stream(self, stream: Stream, unacked_from: int) -> None:
        """Replay the events of the stream's kind after ``unacked_from`` and
        register it for live events, in one step (no event falls between)."""
        conn = stream.conn
        for event in self.logs[stream.kind].after(unacked_from):
            conn.notify(stream.method, event.to_wire())
        self._streams[stream.kind].append(stream)
        conn.streams.append(stream)
        self._changes.changed()

    def close_stream(self, stream: Stream) -> None:
        """Unregister ``stream`` (idempotent)."""
        if stream in self._streams[stream.kind]:
            self._streams[stream.kind].remove(stream)
        if stream in stream.conn.streams:
            stream.conn.streams.remove(stream)

    def forget_conn(self, conn: Conn) -> None:
        """Unregister every stream of a closed connection."""
        for streams in self._streams.values():
            streams[:] = [s for s in streams if s.conn is not conn]

    def streams(self, kind: str) -> list[Stream]:
        """The open streams of ``kind``, in opening order (a copy)."""
        return list(self._streams[kind])

    def end_streams(self, kind: str | None, code: int, message: str) -> int:
        """End the open streams (of ``kind``, or all) with ``(code, message)``;
        returns how many ended."""
        ended = 0
        for k, streams in self._streams.items():
            if kind is not None and k != kind:
                continue
            for stream in list(streams):
                stream.end = (code, message)
                stream.ended.set()
                ended += 1
        return ended

    # -- persistence -------------------------------------------------------------------

    def load(self, root: Path) -> None:
        """Reload the replay logs a previous fake with this uid left under
        ``root`` (brclient's logs live on disk: ids keep growing across
        restarts); a missing, foreign or damaged file is ignored."""
        try:
            saved = json.loads((root / LOGS_FILE).read_text())
        except (OSError, ValueError):
            return
        if not isinstance(saved, dict) or saved.get("uid") != self._settings.uid:
            return
        decoders: dict[str, Callable[[Any], Any]] = {
            KIND_PM: ReceivedPM.from_wire,
            KIND_TIP_RECEIVED: ReceivedTip.from_wire,
            KIND_TIP_PROGRESS: TipProgressEvent.from_wire,
            KIND_KX: KXCompleted.from_wire,
        }
        for kind, log_state in (saved.get("logs") or {}).items():
            decode = decoders.get(kind)
            if decode is None:
                continue
            try:
                self.logs[kind].restore(log_state, _by_value(decode))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("fakebr: %s: ignoring saved %s replay log: %s", self._settings.nick, kind, exc)

    def save(self, root: Path) -> None:
        """Write the replay logs under ``root`` (a failure is logged)."""
        state = {
            "uid": self._settings.uid,
            "logs": {kind: rl.state(lambda ev: ev.to_wire()) for kind, rl in self.logs.items()},
        }
        try:
            root.mkdir(parents=True, exist_ok=True)
            (root / LOGS_FILE).write_text(json.dumps(state))
        except OSError as exc:
            log.warning("fakebr: %s: cannot save the replay logs: %s", self._settings.nick, exc)


def _by_value(decode: Callable[[Any], Any]) -> Callable[[Any, int], Any]:
    """A :meth:`ReplayLog.restore` decoder that needs only the stored value."""

    def restore(value: Any, _seq: int) -> Any:
        return decode(value)

    return restore
