"""Typed clientrpc messages: the events and results a PM/tip bot handles, their
protojson form, the method names and the request params.

Units (docs/clientrpc.md §Units): 1 DCR = 1e8 atoms = 1e11 milliatoms (matoms).
Received tips and tip progress carry ``amount_matoms``; ``TipUser`` takes a
float ``dcrAmount`` in DCR. brmcp credits ``amount_matoms // 1000`` atoms
(floor; WIRE.md §Payments).

User ids are 64 lowercase hex characters in this API; on the wire they are the
raw 32 bytes in standard base64 (events) or the hex string (``user`` params).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar

from ..protocol.units import ATOMS_PER_DCR, MILLIATOMS_PER_ATOM, atoms_from_milliatoms
from .protojson import (
    ProtojsonError,
    decode_bool,
    decode_bytes,
    decode_int,
    decode_string,
    encode_bytes,
    encode_int64,
    field,
)

__all__ = [
    "ACK_KX_COMPLETED",
    "ACK_RECEIVED_PM",
    "ACK_TIP_PROGRESS",
    "ACK_TIP_RECEIVED",
    "ATOMS_PER_DCR",
    "KX_STREAM",
    "MATOMS_PER_ATOM",
    "MEDIATE_KX",
    "MESSAGE_MODE_ME",
    "MESSAGE_MODE_NORMAL",
    "PM",
    "PM_STREAM",
    "TIP_PROGRESS",
    "TIP_STREAM",
    "TIP_USER",
    "USER_PUBLIC_IDENTITY",
    "VERSION",
    "Event",
    "KXCompleted",
    "PublicIdentity",
    "ReceivedPM",
    "ReceivedTip",
    "TipProgressEvent",
    "VersionResponse",
    "ack_params",
    "atoms_to_dcr",
    "check_uid",
    "dcr_to_matoms",
    "mediate_kx_params",
    "pm_params",
    "stream_params",
    "tip_user_params",
]

# -- method names (docs/clientrpc.md §Methods brmcp calls) --------------------------------

VERSION = "VersionService.Version"
USER_PUBLIC_IDENTITY = "ChatService.UserPublicIdentity"
PM = "ChatService.PM"
PM_STREAM = "ChatService.PMStream"
ACK_RECEIVED_PM = "ChatService.AckReceivedPM"
TIP_USER = "PaymentsService.TipUser"
TIP_STREAM = "PaymentsService.TipStream"
ACK_TIP_RECEIVED = "PaymentsService.AckTipReceived"
TIP_PROGRESS = "PaymentsService.TipProgress"
ACK_TIP_PROGRESS = "PaymentsService.AckTipProgress"
MEDIATE_KX = "ChatService.MediateKX"
KX_STREAM = "ChatService.KXStream"
ACK_KX_COMPLETED = "ChatService.AckKXCompleted"

MESSAGE_MODE_NORMAL = "MESSAGE_MODE_NORMAL"
MESSAGE_MODE_ME = "MESSAGE_MODE_ME"
_MESSAGE_MODES = {0: MESSAGE_MODE_NORMAL, 1: MESSAGE_MODE_ME}

#: Milliatoms in one atom; it and ``ATOMS_PER_DCR`` are :mod:`brmcp.protocol.units`' constants.
MATOMS_PER_ATOM = MILLIATOMS_PER_ATOM


def atoms_to_dcr(atoms: int) -> float:
    """Atoms as the float DCR amount ``TipUser`` takes (``atoms / 1e8``, as bisonbotkit's PayTip)."""
    return atoms / ATOMS_PER_DCR


def dcr_to_matoms(dcr_amount: float) -> int:
    """A float DCR amount in milliatoms, rounded to the nearest integer (``dcr * 1e11``)."""
    return round(dcr_amount * ATOMS_PER_DCR * MATOMS_PER_ATOM)


def _uid_hex(raw: bytes, name: str) -> str:
    if len(raw) != 32:
        raise ProtojsonError(f"field {name}: a user id is 32 bytes, got {len(raw)}")
    return raw.hex()


def _uid_bytes(uid_hex: str) -> bytes:
    try:
        raw = bytes.fromhex(uid_hex)
    except ValueError as exc:
        raise ValueError(f"uid {uid_hex!r} is not hex") from exc
    if len(raw) != 32:
        raise ValueError(f"uid {uid_hex!r} is not 64 hex characters")
    return raw


def check_uid(uid: str, name: str) -> str:
    """``uid`` as 64 lowercase hex characters (a BR user id), for the argument
    called ``name``; raises ``ValueError`` naming the argument, the value and
    the allowed form otherwise (upper-case hex is accepted and lowered)."""
    if not isinstance(uid, str) or len(uid) != 64 or any(c not in "0123456789abcdef" for c in uid.lower()):
        raise ValueError(f"{name} {uid!r} is not a user id: expected 64 hex characters (32 bytes)")
    return uid.lower()


def _mapping(params: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise ProtojsonError(f"{what}: expected a JSON object, got {type(params).__name__}")
    return params


class Event(Protocol):
    """What every stream event has: its id in brclient's per-type replay log."""

    @property
    def sequence_id(self) -> int: ...


E = TypeVar("E", bound=Event)


# -- events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReceivedPM:
    """A PM received by this brclient (``ChatService.PMStream`` notification).

    ``uid``: sender, 64 lowercase hex (from the base64 ``uid`` bytes);
    ``nick``: sender's nick or local alias; ``message``: the text (``""`` when the
    event has no ``msg``); ``mode``: ``MESSAGE_MODE_NORMAL`` or ``MESSAGE_MODE_ME``;
    ``timestamp_ms``: the relay server's timestamp, ms since the epoch;
    ``sequence_id``: id in the ``pm`` log, acked with ``ChatService.AckReceivedPM``.
    """

    uid: str
    nick: str
    message: str
    mode: str
    timestamp_ms: int
    sequence_id: int

    @classmethod
    def from_wire(cls, params: Any) -> Self:
        """Decode protojson params; raises :class:`ProtojsonError` on a bad shape."""
        p = _mapping(params, "ReceivedPM")
        msg = field(p, "msg")
        message, mode = "", MESSAGE_MODE_NORMAL
        if msg is not None:
            m = _mapping(msg, "ReceivedPM.msg")
            message = decode_string(field(m, "message"), "msg.message")
            raw_mode = field(m, "mode")
            if isinstance(raw_mode, str):
                mode = raw_mode
            elif raw_mode is not None:
                number = decode_int(raw_mode, "msg.mode", signed=True, bits=32)
                mode = _MESSAGE_MODES.get(number, str(number))
        return cls(
            uid=_uid_hex(decode_bytes(field(p, "uid"), "uid"), "uid"),
            nick=decode_string(field(p, "nick"), "nick"),
            message=message,
            mode=mode,
            timestamp_ms=decode_int(field(p, "timestampMs", "timestamp_ms"), "timestampMs", signed=True),
            sequence_id=decode_int(field(p, "sequenceId", "sequence_id"), "sequenceId"),
        )

    def to_wire(self) -> dict[str, Any]:
        """protojson params in brclient's field order, defaults omitted."""
        out: dict[str, Any] = {"uid": encode_bytes(_uid_bytes(self.uid))}
        if self.nick:
            out["nick"] = self.nick
        msg: dict[str, Any] = {}
        if self.message:
            msg["message"] = self.message
        if self.mode and self.mode != MESSAGE_MODE_NORMAL:
            msg["mode"] = self.mode
        out["msg"] = msg
        if self.timestamp_ms:
            out["timestampMs"] = encode_int64(self.timestamp_ms)
        if self.sequence_id:
            out["sequenceId"] = encode_int64(self.sequence_id)
        return out


@dataclass(frozen=True, slots=True)
class ReceivedTip:
    """A tip received by this brclient (``PaymentsService.TipStream`` notification).

    ``uid``: the tipper, 64 lowercase hex; ``amount_matoms``: amount received in
    **milliatoms**; ``sequence_id``: id in the ``tipstream`` log, acked with
    ``PaymentsService.AckTipReceived``.
    """

    uid: str
    amount_matoms: int
    sequence_id: int

    @property
    def atoms(self) -> int:
        """The amount in whole atoms, floored, as the harness credits it
        (:func:`brmcp.protocol.units.atoms_from_milliatoms`: 0 for an amount
        <= 0; WIRE.md §Payments)."""
        return atoms_from_milliatoms(self.amount_matoms)

    @classmethod
    def from_wire(cls, params: Any) -> Self:
        """Decode protojson params; raises :class:`ProtojsonError` on a bad shape."""
        p = _mapping(params, "ReceivedTip")
        return cls(
            uid=_uid_hex(decode_bytes(field(p, "uid"), "uid"), "uid"),
            amount_matoms=decode_int(field(p, "amountMatoms", "amount_matoms"), "amountMatoms", signed=True),
            sequence_id=decode_int(field(p, "sequenceId", "sequence_id"), "sequenceId"),
        )

    def to_wire(self) -> dict[str, Any]:
        """protojson params in brclient's field order, defaults omitted."""
        out: dict[str, Any] = {"uid": encode_bytes(_uid_bytes(self.uid))}
        if self.amount_matoms:
            out["amountMatoms"] = encode_int64(self.amount_matoms)
        if self.sequence_id:
            out["sequenceId"] = encode_int64(self.sequence_id)
        return out


@dataclass(frozen=True, slots=True)
class TipProgressEvent:
    """Progress of a tip *this* brclient sends (``PaymentsService.TipProgress``).

    ``uid``/``nick``: the tip's target (uid 64 lowercase hex); ``amount_matoms``:
    milliatoms; ``attempt``: the invoice-request attempt count; ``attempt_err``:
    the failure text (``""`` on success); the event is final when ``completed``
    or not ``will_retry`` (:attr:`final`). No field links it to a ``TipUser``
    call: correlate by ``(uid, amount_matoms)`` (docs/clientrpc.md §Events).
    ``sequence_id``: id in the ``tipprogress`` log, acked with
    ``PaymentsService.AckTipProgress``.
    """

    sequence_id: int
    uid: str
    nick: str
    amount_matoms: int
    completed: bool = False
    attempt: int = 0
    attempt_err: str = ""
    will_retry: bool = False

    @property
    def final(self) -> bool:
        """True for a terminal event: paid, or failed without a further retry."""
        return self.completed or not self.will_retry

    @classmethod
    def from_wire(cls, params: Any) -> Self:
        """Decode protojson params; raises :class:`ProtojsonError` on a bad shape."""
        p = _mapping(params, "TipProgressEvent")
        return cls(
            sequence_id=decode_int(field(p, "sequenceId", "sequence_id"), "sequenceId"),
            uid=_uid_hex(decode_bytes(field(p, "uid"), "uid"), "uid"),
            nick=decode_string(field(p, "nick"), "nick"),
            amount_matoms=decode_int(field(p, "amountMatoms", "amount_matoms"), "amountMatoms", signed=True),
            completed=decode_bool(field(p, "completed"), "completed"),
            attempt=decode_int(field(p, "attempt"), "attempt", signed=True, bits=32),
            attempt_err=decode_string(field(p, "attemptErr", "attempt_err"), "attemptErr"),
            will_retry=decode_bool(field(p, "willRetry", "will_retry"), "willRetry"),
        )

    def to_wire(self) -> dict[str, Any]:
        """protojson params in brclient's field order, defaults omitted."""
        out: dict[str, Any] = {}
        if self.sequence_id:
            out["sequenceId"] = encode_int64(self.sequence_id)
        out["uid"] = encode_bytes(_uid_bytes(self.uid))
        if self.nick:
            out["nick"] = self.nick
        if self.amount_matoms:
            out["amountMatoms"] = encode_int64(self.amount_matoms)
        if self.completed:
            out["completed"] = True
        if self.attempt:
            out["attempt"] = self.attempt
        if self.attempt_err:
            out["attemptErr"] = self.attempt_err
        if self.will_retry:
            out["willRetry"] = True
        return out


@dataclass(frozen=True, slots=True)
class KXCompleted:
    """A completed key exchange of this brclient (``ChatService.KXStream``
    notification): a new contact, or a reset of an existing one.

    ``uid``: the other user, 64 lowercase hex (from the base64 ``uid``
    bytes); ``nick``: their nick; ``initial_rendezvous``: the raw initial
    rendezvous point of the exchange (``b""`` when brclient sent none);
    ``sequence_id``: id in the ``kx`` log, acked with
    ``ChatService.AckKXCompleted``. Field numbers and JSON names: bisonrelay's
    ``clientrpc/clientrpc.proto`` (``message KXCompleted``).
    """

    sequence_id: int
    uid: str
    nick: str
    initial_rendezvous: bytes = b""

    @classmethod
    def from_wire(cls, params: Any) -> Self:
        """Decode protojson params; raises :class:`ProtojsonError` on a bad shape."""
        p = _mapping(params, "KXCompleted")
        return cls(
            sequence_id=decode_int(field(p, "sequenceId", "sequence_id"), "sequenceId"),
            uid=_uid_hex(decode_bytes(field(p, "uid"), "uid"), "uid"),
            nick=decode_string(field(p, "nick"), "nick"),
            initial_rendezvous=decode_bytes(
                field(p, "initialRendezvous", "initial_rendezvous"), "initialRendezvous"
            ),
        )

    def to_wire(self) -> dict[str, Any]:
        """protojson params in brclient's field order, defaults omitted."""
        out: dict[str, Any] = {}
        if self.sequence_id:
            out["sequenceId"] = encode_int64(self.sequence_id)
        out["uid"] = encode_bytes(_uid_bytes(self.uid))
        if self.nick:
            out["nick"] = self.nick
        if self.initial_rendezvous:
            out["initialRendezvous"] = encode_bytes(self.initial_rendezvous)
        return out


# -- results -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublicIdentity:
    """``ChatService.UserPublicIdentity`` result: this brclient's own identity.

    ``sig_key``: the raw signature public key; ``identity``: the raw 32-byte
    user id (:attr:`uid` is its lowercase hex).
    """

    name: str
    nick: str
    sig_key: bytes
    identity: bytes

    @property
    def uid(self) -> str:
        """This user's id, 64 lowercase hex characters."""
        return self.identity.hex()

    @classmethod
    def from_wire(cls, result: Any) -> Self:
        """Decode a protojson result; raises :class:`ProtojsonError` on a bad shape."""
        r = _mapping(result, "PublicIdentity")
        return cls(
            name=decode_string(field(r, "name"), "name"),
            nick=decode_string(field(r, "nick"), "nick"),
            sig_key=decode_bytes(field(r, "sigKey", "sig_key"), "sigKey"),
            identity=decode_bytes(field(r, "identity"), "identity"),
        )

    def to_wire(self) -> dict[str, Any]:
        """protojson result in brclient's field order, defaults omitted."""
        out: dict[str, Any] = {}
        if self.name:
            out["name"] = self.name
        if self.nick:
            out["nick"] = self.nick
        if self.sig_key:
            out["sigKey"] = encode_bytes(self.sig_key)
        if self.identity:
            out["identity"] = encode_bytes(self.identity)
        return out


@dataclass(frozen=True, slots=True)
class VersionResponse:
    """``VersionService.Version`` result (brclient's ``app_name`` is ``"brclient"``)."""

    app_version: str
    go_runtime: str
    app_name: str

    @classmethod
    def from_wire(cls, result: Any) -> Self:
        """Decode a protojson result; raises :class:`ProtojsonError` on a bad shape."""
        r = _mapping(result, "VersionResponse")
        return cls(
            app_version=decode_string(field(r, "appVersion", "app_version"), "appVersion"),
            go_runtime=decode_string(field(r, "goRuntime", "go_runtime"), "goRuntime"),
            app_name=decode_string(field(r, "appName", "app_name"), "appName"),
        )

    def to_wire(self) -> dict[str, Any]:
        """protojson result in brclient's field order, defaults omitted."""
        out: dict[str, Any] = {}
        if self.app_version:
            out["appVersion"] = self.app_version
        if self.go_runtime:
            out["goRuntime"] = self.go_runtime
        if self.app_name:
            out["appName"] = self.app_name
        return out


# -- request params (never any key brclient does not know: unknown keys are -32602) ------


def pm_params(user: str, message: str) -> dict[str, Any]:
    """``PMRequest``: ``{"user": <hex uid or nick>, "msg": {"message": <text>}}``."""
    out: dict[str, Any] = {}
    if user:
        out["user"] = user
    out["msg"] = {"message": message} if message else {}
    return out


def tip_user_params(user: str, dcr_amount: float, max_attempts: int) -> dict[str, Any]:
    """``TipUserRequest``: ``user``, ``dcrAmount`` (float DCR), ``maxAttempts`` (int32)."""
    out: dict[str, Any] = {}
    if user:
        out["user"] = user
    if dcr_amount:
        out["dcrAmount"] = float(dcr_amount)
    if max_attempts:
        out["maxAttempts"] = int(max_attempts)
    return out


def mediate_kx_params(mediator: str, target: str) -> dict[str, Any]:
    """``MediateKXRequest``: ``{"mediator": <hex uid or nick>, "target": <hex uid>}``
    (both proto ``string`` fields, 1 and 2)."""
    out: dict[str, Any] = {}
    if mediator:
        out["mediator"] = mediator
    if target:
        out["target"] = target
    return out


def ack_params(sequence_id: int) -> dict[str, Any]:
    """``AckRequest``: ``{"sequenceId": "<uint64>"}`` (``{}`` for 0, a no-op ack)."""
    return {"sequenceId": encode_int64(sequence_id)} if sequence_id else {}


def stream_params(unacked_from: int) -> dict[str, Any]:
    """``PMStreamRequest``/``TipStreamRequest``/``TipProgressRequest``/``KXStreamRequest``:
    ``{"unackedFrom": "<uint64>"}``, ``{}`` for 0 (everything not yet acked)."""
    return {"unackedFrom": encode_int64(unacked_from)} if unacked_from else {}
