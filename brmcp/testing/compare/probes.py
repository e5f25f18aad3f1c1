"""The probes: the same clientrpc conversations run against each network,
each reduced to an observation (a flat dict of JSON values) that does not
depend on uids, ports or exact timing, so two networks that behave alike give
equal observations. Timing shows only as a verdict with a wide margin
(e.g. ``paced`` when 20 back-to-back PMs take over a second).
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from ...clientrpc import Client, RPCError, Subscription
from .targets import Target

__all__ = ["PROBES", "Observation"]

Observation = dict[str, Any]
BIG_RANDOM_OK = 1_500_000  # bytes of random base64: under the real limit after compression
BIG_RANDOM_TOO_LARGE = 2_000_000
BIG_COMPRESSIBLE = 2_000_000


@dataclass(frozen=True, slots=True)
class _Raw:
    """A stream event kept as its raw params (JSON text, hashable for the
    client's de-duplication)."""

    text: str
    sequence_id: int


def _decode_raw(params: Any) -> _Raw:
    return _Raw(json.dumps(params, sort_keys=True), int(params.get("sequenceId", 0)))


def _raw(client: Client, method: str) -> Subscription[_Raw]:
    return client.subscribe(method, _decode_raw)


_ACK = {
    "ChatService.PMStream": "ChatService.AckReceivedPM",
    "PaymentsService.TipStream": "PaymentsService.AckTipReceived",
    "PaymentsService.TipProgress": "PaymentsService.AckTipProgress",
}


async def _fresh(client: Client, method: str) -> Subscription[_Raw]:
    """Open ``method`` and ack whatever earlier probes left unacked (the
    replay), so the probe sees only its own events."""
    sub = _raw(client, method)
    await sub.wait_open()
    while True:
        with anyio.move_on_after(0.5):
            ev = await sub.__anext__()
            await client.call(_ACK[method], {"sequenceId": str(ev.sequence_id)})
            continue
        return sub


async def _next(sub: Subscription[_Raw], limit: float = 10.0) -> dict[str, Any] | None:
    with anyio.move_on_after(limit):
        return dict(json.loads((await sub.__anext__()).text))
    return None


async def _error(fn: Callable[[], Awaitable[Any]]) -> str:
    """``"<code> <message>"`` of the error ``fn`` raises, or ``"ok"``.

    Go's protobuf (``internal/detrand``) picks a plain or a no-break space
    (U+00A0) after ``proto:`` in its error texts, fixed per binary: two
    builds of the same brclient differ. The space is normalized so the
    comparison does not depend on which build ran."""
    try:
        await fn()
    except RPCError as exc:
        return f"{exc.code} {exc.message}".replace("\u00a0", " ")
    return "ok"


async def _clients(target: Target) -> tuple[Client, Client]:
    a, b = target.client("alice"), target.client("bob")
    await a.__aenter__()
    await b.__aenter__()
    await a.wait_connected()
    await b.wait_connected()
    return a, b


async def _close(*clients: Client) -> None:
    for c in reversed(clients):  # task groups close in the reverse order of entry
        await c.__aexit__(None, None, None)


async def _tip_ready(target: Target) -> None:
    """Wait out TipUser's block after start-up (brclient's restart delay)."""
    await anyio.sleep(target.tip_restart_delay + 0.5)


async def _probe_pm_shape(target: Target) -> Observation:
    """A PM's event: keys, 64-bit values as strings, uid as base64, whole-second
    timestamps, the replay-log file index of its id."""
    a, b = await _clients(target)
    try:
        sub = await _fresh(b, "ChatService.PMStream")
        await a.send_pm(target.uid("bob"), "shape")
        ev = await _next(sub)
        assert ev is not None, "PM not delivered"
        return {
            "keys": sorted(ev),
            "msg": ev.get("msg"),
            "uid_is_sender": base64.b64decode(ev["uid"]).hex() == target.uid("alice"),
            "sequenceId_type": type(ev["sequenceId"]).__name__,
            "timestampMs_type": type(ev["timestampMs"]).__name__,
            "timestamp_whole_seconds": int(ev["timestampMs"]) % 1000 == 0,
            "file_index": int(ev["sequenceId"]) >> 32,
        }
    finally:
        await _close(a, b)


async def _probe_tips(target: Target) -> Observation:
    """Tip events and amounts: whole-atom rounding, event keys, completion."""
    await _tip_ready(target)
    a, b = await _clients(target)
    try:
        received = await _fresh(b, "PaymentsService.TipStream")
        progress = await _fresh(a, "PaymentsService.TipProgress")
        amounts: dict[str, Any] = {}
        keys: dict[str, Any] = {}
        for dcr in (0.0001, 1.5e-8, 1.234567e-5, 2.5e-9):
            await a.tip_user(target.uid("bob"), dcr, 1)
            tip = await _next(received, 15)
            prog = await _next(progress, 15)
            amounts[repr(dcr)] = tip.get("amountMatoms") if tip else None
            if tip and prog:
                keys = {"tip": sorted(tip), "progress": sorted(prog), "completed": prog.get("completed")}
        return {"received_matoms": amounts, **keys}
    finally:
        await _close(a, b)


async def _probe_tip_serialization(target: Target) -> Observation:
    """Three tips to one payee: completed one at a time (≈ 100 ms apart on a
    real client) or all together."""
    await _tip_ready(target)
    a, b = await _clients(target)
    try:
        progress = await _fresh(a, "PaymentsService.TipProgress")
        for _ in range(3):
            await a.tip_user(target.uid("bob"), 1e-6, 1)
        times = []
        for _ in range(3):
            if await _next(progress, 15) is not None:
                times.append(time.monotonic())
        spread = times[-1] - times[0] if len(times) == 3 else None
        # A real client completes them ≈ 100 ms apart (≈ 200 ms first to last).
        return {"completed": len(times), "one_at_a_time": spread is not None and spread >= 0.15}
    finally:
        await _close(a, b)


async def _probe_errors(target: Target) -> Observation:
    """Error replies and the order of TipUser's checks."""
    a, b = await _clients(target)
    bob = target.uid("bob")
    stranger = "ab" * 32
    try:
        return {
            "pm_unknown_user": await _error(lambda: a.send_pm(stranger, "x")),
            "pm_empty": await _error(lambda: a.call("ChatService.PM", {"user": bob, "msg": {"message": ""}})),
            "tip_zero": await _error(lambda: a.tip_user(bob, 0.0, 1)),
            "tip_zero_unknown_user": await _error(lambda: a.tip_user(stranger, 0.0, 1)),
            "tip_nan": await _error(
                lambda: a.call("PaymentsService.TipUser", {"user": bob, "dcrAmount": "NaN", "maxAttempts": 1})
            ),
            "tip_zero_attempts": await _error(
                lambda: a.call("PaymentsService.TipUser", {"user": bob, "dcrAmount": 0.0001})
            ),
            "params_not_object": await _error(lambda: a.call("ChatService.PM", [])),  # type: ignore[arg-type]
            "unknown_field": await _error(lambda: a.call("ChatService.PM", {"user": bob, "bogus": 1})),
            "unknown_method": await _error(lambda: a.call("ChatService.Nope", {})),
            "unknown_service": await _error(lambda: a.call("NopeService.Nope", {})),
        }
    finally:
        await _close(a, b)


async def _probe_sizes(target: Target) -> Observation:
    """The PM size limit (after compression on a real client) and the silent
    drop of a too-large compressible PM at the recipient."""
    a, b = await _clients(target)
    try:
        sub = await _fresh(b, "ChatService.PMStream")
        out: Observation = {}
        cases = {
            "random_1.5MB": base64.b64encode(os.urandom(BIG_RANDOM_OK * 3 // 4)).decode(),
            "random_2MB": base64.b64encode(os.urandom(BIG_RANDOM_TOO_LARGE * 3 // 4)).decode(),
            "compressible_2MB": "a" * BIG_COMPRESSIBLE,
        }
        for name, text in cases.items():
            sent = await _error(lambda text=text: a.send_pm(target.uid("bob"), text))  # type: ignore[misc]
            delivered = False
            if sent == "ok":
                ev = await _next(sub, 20)
                delivered = ev is not None and (ev.get("msg") or {}).get("message") == text
            # Sizes in the error text vary with compression: compare its words.
            out[name] = {"send": re.sub(r"[0-9]+", "N", sent), "delivered": delivered}
        return out
    finally:
        await _close(a, b)


async def _probe_pacing(target: Target) -> Observation:
    """20 back-to-back PMs: order and pacing (≈ 100 ms each on a real client)."""
    a, b = await _clients(target)
    try:
        sub = await _fresh(b, "ChatService.PMStream")
        began = time.monotonic()
        for i in range(20):
            await a.send_pm(target.uid("bob"), f"p{i}")
        got = []
        for _ in range(20):
            ev = await _next(sub, 15)
            if ev is None:
                break
            got.append((ev.get("msg") or {}).get("message"))
        took = time.monotonic() - began
        return {"in_order": got == [f"p{i}" for i in range(20)], "paced": took >= 1.0}
    finally:
        await _close(a, b)


async def _probe_restart_ids(target: Target) -> Observation:
    """Unacked events replay after a brclient restart; ids keep growing."""
    a, b = await _clients(target)
    try:
        sub = await _fresh(b, "ChatService.PMStream")
        await a.send_pm(target.uid("bob"), "acked")
        first = await _next(sub)
        assert first is not None
        await b.ack_received_pm(int(first["sequenceId"]))
        await a.send_pm(target.uid("bob"), "unacked")
        second = await _next(sub)
        assert second is not None
    finally:
        await _close(a, b)
    await target.restart("bob")
    a, b = await _clients(target)
    try:
        sub = _raw(b, "ChatService.PMStream")
        replayed = await _next(sub, 5)
        await a.send_pm(target.uid("bob"), "after")
        after = await _next(sub)
        while after is not None and (after.get("msg") or {}).get("message") != "after":
            after = await _next(sub)
        assert after is not None
        return {
            "replayed_unacked": replayed is not None
            and (replayed.get("msg") or {}).get("message") == "unacked",
            "ids_grow_across_restart": int(after["sequenceId"]) > int(second["sequenceId"]),
        }
    finally:
        await _close(a, b)


async def _probe_tipuser_after_start(target: Target) -> Observation:
    """TipUser right after a brclient start blocks until its restart delay passed."""
    await target.restart("alice")
    a, b = await _clients(target)
    try:
        began = time.monotonic()
        await a.tip_user(target.uid("bob"), 1e-6, 1)
        took = time.monotonic() - began
        # Both networks run with a 2 s restart delay (the fake only when realistic).
        return {"blocks": took >= 1.0}
    finally:
        await _close(a, b)


async def _probe_offline(target: Target) -> Observation:
    """PMs to an offline user are accepted and delivered on return; a PM from
    a user that is off the relay waits until it is back."""
    a, b = await _clients(target)
    try:
        sub = await _fresh(b, "ChatService.PMStream")
        await target.offline("bob")
        to_offline = await _error(lambda: a.send_pm(target.uid("bob"), "while away"))
        early = await _next(sub, 1.0)
        await target.online("bob")
        later = await _next(sub, 15)
        await target.offline("alice")
        from_offline = "blocks"
        with anyio.move_on_after(1.5) as scope:
            from_offline = await _error(lambda: a.send_pm(target.uid("bob"), "sent while off"))
        if scope.cancelled_caught:
            from_offline = "blocks"
        await target.online("alice")
        return {
            "pm_to_offline_user": to_offline,
            "delivered_while_offline": early is not None,
            "delivered_on_return": later is not None,
            "pm_from_offline_user": from_offline,
        }
    finally:
        await _close(a, b)


async def _probe_no_wallet(target: Target) -> Observation:
    """A tip to a payee without a wallet (run on a network where bob has none)."""
    await _tip_ready(target)
    a, b = await _clients(target)
    try:
        received = await _fresh(b, "PaymentsService.TipStream")
        progress = await _fresh(a, "PaymentsService.TipProgress")
        await a.tip_user(target.uid("bob"), 0.0001, 3)
        tip = await _next(received, 10)
        prog = await _next(progress, 10)
        return {
            "payee_tip_matoms": tip.get("amountMatoms", "0") if tip else None,
            "tipper_completed": bool(prog and prog.get("completed")),
            "tipper_will_retry": bool(prog and prog.get("willRetry")),
            "tipper_attempt_err": prog.get("attemptErr") if prog else None,
        }
    finally:
        await _close(a, b)


#: Probe name -> (function, needs a network where bob has no wallet).
PROBES: dict[str, tuple[Callable[[Target], Awaitable[Observation]], bool]] = {
    "pm_shape": (_probe_pm_shape, False),
    "tips": (_probe_tips, False),
    "tip_serialization": (_probe_tip_serialization, False),
    "errors": (_probe_errors, False),
    "sizes": (_probe_sizes, False),
    "pacing": (_probe_pacing, False),
    "restart_ids": (_probe_restart_ids, False),
    "tipuser_after_start": (_probe_tipuser_after_start, False),
    "offline": (_probe_offline, False),
    "no_wallet": (_probe_no_wallet, True),
}
