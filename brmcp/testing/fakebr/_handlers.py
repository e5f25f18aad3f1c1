"""The unary clientrpc methods of a fake brclient: strict params decoding,
then brclient's checks and error texts in its order (Version,
UserPublicIdentity, UserNick, PM, TipUser, MediateKX, the four acks; docs/clientrpc.md
§Methods brmcp calls, §Error texts). Both transports (the websocket
sessions and the POST endpoint) run them through :class:`MethodTable`."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import anyio

from ...clientrpc.types import PublicIdentity
from ._events import EventLog
from ._limits import MAX_MSG_SIZE, estimated_wire_size, whole_atoms_matoms
from ._protocol import (
    ACKS,
    CODE_INTERNAL,
    CODE_INVALID_PARAMS,
    STREAMS,
    RPCFault,
    go_float,
    go_percent_f,
    method_name,
)
from ._state import Controls, Settings
from .params import ParamsError, decode_params
from .relay import FakeRelay, Mediation, RelayMember

__all__ = ["MethodTable"]


class MethodTable:
    """The method handlers of one fake brclient; each returns the protojson
    result or raises :class:`RPCFault`.

    ``settings``: the brclient played (identity, ``TipUser`` guards, speed
    options), read at each call; ``relay``: contacts, nicks, PM delivery and
    tips; ``events``: the replay logs the acks apply to; ``controls``: held
    methods and queued tip failures; ``member``: this user on the relay (the
    tipper of its ``TipUser`` calls).
    """

    def __init__(
        self,
        settings: Settings,
        relay: FakeRelay,
        events: EventLog,
        controls: Controls,
        member: RelayMember,
    ) -> None:
        self._settings = settings
        self._relay = relay
        self._events = events
        self._controls = controls
        self._member = member
        self._started_at = 0.0

    def mark_started(self) -> None:
        """The fake started now: ``tip_restart_delay`` counts from here."""
        self._started_at = time.monotonic()

    def public_identity(self) -> PublicIdentity:
        """``UserPublicIdentity``: name, nick, signature key and uid."""
        s = self._settings
        return PublicIdentity(name=s.name, nick=s.nick, sig_key=s.sig_key, identity=bytes.fromhex(s.uid))

    def decode(self, name: str, params: Any, present: bool) -> dict[str, Any]:
        """Strict protojson params of ``name`` (``Service.Method``); RPCFault
        -32602 ``unable to decode params: ...``."""
        try:
            return decode_params(name, params, present=present)
        except ParamsError as exc:
            raise RPCFault(CODE_INVALID_PARAMS, f"unable to decode params: {exc}") from None

    async def execute(self, method: str, params: Any, present: bool) -> Any:
        """Run a unary method (``method`` as sent, suffix included); returns
        the protojson result or raises :class:`RPCFault`."""
        name = method_name(method)
        if name in STREAMS:
            raise RPCFault(CODE_INTERNAL, "fakebr: streams need the websocket transport")
        request = self.decode(name, params, present)
        await self._controls.pass_hold(name)
        if name == "VersionService.Version":
            return self._settings.version.to_wire()
        if name == "ChatService.UserPublicIdentity":
            return self.public_identity().to_wire()
        if name == "ChatService.UserNick":
            nick = self._user_nick(request)
            return {"nick": nick} if nick else {}
        if name == "ChatService.PM":
            await self._pm(request)
            return {}
        if name == "PaymentsService.TipUser":
            await self._tip_user(request)
            return {}
        if name == "ChatService.MediateKX":
            self.mediate_kx(str(request.get("mediator", "")), str(request.get("target", "")))
            return {}
        kind = ACKS.get(name)
        if kind is not None:
            self._events.ack(kind, int(request.get("sequence_id", 0)))
            return {}
        raise RPCFault(CODE_INTERNAL, "unknown method")  # pragma: no cover - MESSAGES and handlers agree

    def _user_nick(self, request: Mapping[str, Any]) -> str:
        """brclient's ``UserNick``: the raw ``uid`` when it is 32 bytes, else
        ``hexUid`` when it is 64 bytes long (Go's hex decoding and its error
        text), else ``invalid uid and hex_uid``; then the nick of that
        contact, or ``user <uid> not found`` for anyone else (this user
        itself included: brclient looks in its address book)."""
        raw: bytes = request.get("uid", b"")
        hex_uid = str(request.get("hex_uid", ""))
        if len(raw) == 32:
            uid = raw.hex()
        elif len(hex_uid.encode("utf-8")) == 64:
            uid = go_hex_decode(hex_uid).hex()
        else:
            raise RPCFault(CODE_INTERNAL, "invalid uid and hex_uid")
        if uid not in self._relay.contacts(self._settings.uid):
            raise RPCFault(CODE_INTERNAL, f"user {uid} not found")
        return self._relay.nicks.get(uid, "")

    def _user_by_nick(self, user: str) -> str:
        """brclient's ``UserByNick``: a contact whose nick matches (case-insensitively,
        standing in for brclient's collator), else one whose hex id starts with
        ``user`` when that is longer than 4 characters."""
        contacts = self._relay.contacts(self._settings.uid)
        wanted = user.casefold()
        for uid in contacts:
            if self._relay.nicks.get(uid, "").casefold() == wanted:
                return uid
        if len(user) > 4:
            for uid in contacts:
                if uid.startswith(user):
                    return uid
        raise RPCFault(CODE_INTERNAL, f"user {user} not found")

    async def _pm(self, request: Mapping[str, Any]) -> None:
        target = self._user_by_nick(str(request.get("user", "")))
        msg = request.get("msg")
        if msg is None:
            raise RPCFault(CODE_INTERNAL, "msg is nil")
        text = str(msg.get("message", ""))
        if not text:
            raise RPCFault(CODE_INTERNAL, "msg is empty")
        estimate = estimated_wire_size(text)
        if estimate > MAX_MSG_SIZE:
            raise RPCFault(
                CODE_INTERNAL,
                "cannot enqueue message rpc.RMPrivateMessage estimated as larger than max message size "
                f"{estimate} > {MAX_MSG_SIZE}: RM is too large",
            )
        # A brclient that is off the relay holds the call until it is back.
        await self._relay.wait_online(self._settings.uid)
        try:
            # Paced (pm_pacing > 0), the call returns once the relay queued
            # the PM; the fabric's faults and refusals come after (FakeRelay.send_pm).
            await self._relay.send_pm(self._settings.uid, target, text, pacing=self._settings.pm_pacing)
        except Exception as exc:  # unpaced: the fabric's size limit or an injected link failure
            raise RPCFault(CODE_INTERNAL, str(exc)) from None

    def mediate_kx(self, mediator: str, target: str) -> Mediation:
        """brclient's ``MediateKX``: the mediator by ``UserByNick`` (``user <x>
        not found``), the target parsed as a hex user id (Go's hex and
        ``invalid ShortID length: N`` errors), refused when the target is
        already a contact (brclient's text, its missing space included);
        then the request goes to the relay, which completes or drops it in
        the background (:meth:`FakeRelay.start_mediate_kx`)."""
        mediator_uid = self._user_by_nick(mediator)
        raw = go_hex_decode(target)
        if len(raw) != 32:
            raise RPCFault(CODE_INTERNAL, f"invalid ShortID length: {len(raw)}")
        target_uid = raw.hex()
        me = self._settings.uid
        if target_uid == me or self._relay.are_contacts(me, target_uid):
            raise RPCFault(
                CODE_INTERNAL,
                f"cannot request mediate identity: already havesession with target {target_uid}",
            )
        return self._relay.start_mediate_kx(me, mediator_uid, target_uid)

    async def _tip_user(self, request: Mapping[str, Any]) -> None:
        """brclient's order: the user, the remote-tip guards, then the amount
        and attempts, then the wait for the tip subsystem (the restart delay),
        then the amount's conversion to whole atoms."""
        user = str(request.get("user", ""))
        target = self._user_by_nick(user)
        dcr_amount = float(request.get("dcr_amount", 0.0))
        settings = self._settings
        if not settings.allow_remote_send_tip:
            raise RPCFault(CODE_INTERNAL, "remote tip sending not allowed")
        cap = settings.max_remote_send_tip_amt
        if cap > 0 and dcr_amount > cap:
            raise RPCFault(CODE_INTERNAL, f"tip exceeds max limit: {go_float(cap)}")
        if dcr_amount <= 0:
            raise RPCFault(CODE_INTERNAL, f"cannot pay user {go_percent_f(dcr_amount)} <= 0")
        max_attempts = int(request.get("max_attempts", 0))
        if max_attempts <= 0:
            raise RPCFault(CODE_INTERNAL, f"maxAttempts {max_attempts} <= 0")
        ready = self._started_at + settings.tip_restart_delay - time.monotonic()
        if ready > 0:
            await anyio.sleep(ready)
        if math.isnan(dcr_amount) or math.isinf(dcr_amount):
            raise RPCFault(CODE_INTERNAL, "invalid coin amount")
        failure = self._controls.next_tip_failure()
        self._relay.start_tip(self._member, target, whole_atoms_matoms(dcr_amount), max_attempts, failure)


def go_hex_decode(text: str) -> bytes:
    """Go's ``hex.DecodeString``: the bytes, or an :class:`RPCFault` with Go's
    text for the first byte that is not a hex digit (``encoding/hex: invalid
    byte: U+0067 'g'``), or for an odd length once the digits are good."""
    data = text.encode("utf-8")
    for byte in data[: len(data) - len(data) % 2]:
        if chr(byte) not in "0123456789abcdefABCDEF":
            shown = f"U+{byte:04X}" + (f" '{chr(byte)}'" if chr(byte).isprintable() else "")
            raise RPCFault(CODE_INTERNAL, f"encoding/hex: invalid byte: {shown}")
    if len(data) % 2:
        last = data[-1:]
        if last and chr(last[0]) not in "0123456789abcdefABCDEF":
            shown = f"U+{last[0]:04X}" + (f" '{chr(last[0])}'" if chr(last[0]).isprintable() else "")
            raise RPCFault(CODE_INTERNAL, f"encoding/hex: invalid byte: {shown}")
        raise RPCFault(CODE_INTERNAL, "encoding/hex: odd length hex string")
    return bytes.fromhex(data.decode("ascii"))
