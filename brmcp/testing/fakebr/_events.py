"""Stream events of a fake brclient: each is appended to its kind's replay
log (``(file << 32) | offset`` ids, docs/clientrpc.md §Acks and replay) and broadcast to every
open stream of that kind; the ``emit_*`` injectors are also the relay's way
to deliver PMs and tips (server.py documents the behaviour)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TypeVar

from ...clientrpc.protojson import dumps
from ...clientrpc.types import ReceivedPM, ReceivedTip, TipProgressEvent
from ._limits import MAX_MSG_SIZE, RM_OVERHEAD
from ._protocol import KIND_PM, KIND_TIP_PROGRESS, KIND_TIP_RECEIVED
from ._state import _FakeState

__all__ = ["_Events"]

log = logging.getLogger("brmcp.testing.fakebr")

Ev = TypeVar("Ev", ReceivedPM, ReceivedTip, TipProgressEvent)


class _Events(_FakeState):
    """The event injectors of :class:`~.server.FakeBRClient`."""

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
        self._changed()
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
                nick=self.relay.nicks.get(from_uid, "") if nick is None else nick,
                message=message,
                mode=mode,
                timestamp_ms=int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
                sequence_id=0,
            ),
        )

    def emit_received_tip(
        self, from_uid: str, amount_matoms: int, *, sequence_id: int | None = None
    ) -> ReceivedTip:
        """Log a received tip (milliatoms) and broadcast it. ``sequence_id``
        overrides the id the log would give it (hostile-brclient tests)."""
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
        """Log a tip-progress event for a tip to ``to_uid`` and broadcast it."""
        return self._emit(
            KIND_TIP_PROGRESS,
            TipProgressEvent(
                sequence_id=0,
                uid=to_uid,
                nick=self.relay.nicks.get(to_uid, "") if nick is None else nick,
                amount_matoms=amount_matoms,
                completed=completed,
                attempt=attempt,
                attempt_err=attempt_err,
                will_retry=will_retry,
            ),
        )

    def _receive_pm(self, from_uid: str, text: str, timestamp_ms: int) -> None:
        if len(text.encode("utf-8")) + RM_OVERHEAD > MAX_MSG_SIZE:
            # brclient's decompression is limited to the max message size: a
            # compressible PM the sender accepted is dropped here, silently.
            log.warning("fakebr: %s dropped a PM of %d bytes (zlib read limit)", self.nick, len(text))
            return
        self.emit_pm(from_uid, text, timestamp_ms=timestamp_ms)
