"""The typed brclient calls of :class:`~brmcp.clientrpc.Client`: the unary
requests a PM/tip bot makes (version, identity, PM, tip, the acks), the
key-exchange calls a directory makes (``MediateKX``, ``AckKXCompleted``) and
the four event streams (PMs, tips, tip progress, completed KXs), on top
of the client's two primitives ``call`` and ``subscribe`` (docs/clientrpc.md §Methods brmcp calls).

Units: tips are sent as a float DCR amount and received in milliatoms
(docs/clientrpc.md §Units).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .errors import ClientrpcProtocolError
from .protojson import ProtojsonError
from .subscription import Subscription
from .types import (
    ACK_KX_COMPLETED,
    ACK_RECEIVED_PM,
    ACK_TIP_PROGRESS,
    ACK_TIP_RECEIVED,
    KX_STREAM,
    MEDIATE_KX,
    PM,
    PM_STREAM,
    TIP_PROGRESS,
    TIP_STREAM,
    TIP_USER,
    USER_PUBLIC_IDENTITY,
    VERSION,
    Event,
    KXCompleted,
    PublicIdentity,
    ReceivedPM,
    ReceivedTip,
    TipProgressEvent,
    VersionResponse,
    ack_params,
    check_uid,
    mediate_kx_params,
    pm_params,
    tip_user_params,
)

__all__ = ["BrclientMethods"]

E = TypeVar("E", bound=Event)
R = TypeVar("R")


def _decode_result(method: str, decode: Callable[[Any], R], result: Any) -> R:
    try:
        return decode(result)
    except (ProtojsonError, ValueError, TypeError) as exc:
        raise ClientrpcProtocolError(f"{method}: malformed result from brclient: {exc}") from None


class BrclientMethods(ABC):
    """The typed calls; a subclass provides :meth:`call` and :meth:`subscribe`."""

    @abstractmethod
    async def call(self, method: str, params: Mapping[str, Any]) -> Any:
        """Send one request and return its decoded ``result``."""

    @abstractmethod
    def subscribe(self, method: str, decode: Callable[[Any], E], unacked_from: int = 0) -> Subscription[E]:
        """Open the stream ``method``, now and after every reconnect."""

    # -- streams ------------------------------------------------------------------------

    def pm_stream(self, unacked_from: int = 0) -> Subscription[ReceivedPM]:
        """``ChatService.PMStream``: PMs received by this brclient, from every
        stored event with id > ``unacked_from`` (0: all not yet acked)."""
        return self.subscribe(PM_STREAM, ReceivedPM.from_wire, unacked_from)

    def tip_stream(self, unacked_from: int = 0) -> Subscription[ReceivedTip]:
        """``PaymentsService.TipStream``: tips received (amounts in milliatoms)."""
        return self.subscribe(TIP_STREAM, ReceivedTip.from_wire, unacked_from)

    def tip_progress(self, unacked_from: int = 0) -> Subscription[TipProgressEvent]:
        """``PaymentsService.TipProgress``: progress of tips this brclient sends."""
        return self.subscribe(TIP_PROGRESS, TipProgressEvent.from_wire, unacked_from)

    def kx_stream(self, unacked_from: int = 0) -> Subscription[KXCompleted]:
        """``ChatService.KXStream``: key exchanges this brclient completed (a
        new contact or a reset), from every stored event with id >
        ``unacked_from`` (0: all not yet acked). Ack each with
        :meth:`ack_kx_completed` once handled, as for PMs and tips."""
        return self.subscribe(KX_STREAM, KXCompleted.from_wire, unacked_from)

    # -- requests -----------------------------------------------------------------------

    async def version(self) -> VersionResponse:
        """``VersionService.Version``. Raises :class:`ClientrpcProtocolError`
        for a result that does not decode."""
        result = await self.call(VERSION, {})
        return _decode_result(VERSION, VersionResponse.from_wire, result)

    async def user_public_identity(self) -> PublicIdentity:
        """``ChatService.UserPublicIdentity``: this brclient's own name, nick and uid."""
        result = await self.call(USER_PUBLIC_IDENTITY, {})
        return _decode_result(USER_PUBLIC_IDENTITY, PublicIdentity.from_wire, result)

    async def send_pm(self, uid_hex: str, text: str) -> None:
        """``ChatService.PM`` to ``uid_hex`` (64 lowercase hex; brclient also
        accepts a nick or a >4-character uid prefix). Returns once brclient has
        queued the PM for the relay. :class:`RPCError` texts include
        ``user <x> not found`` and ``msg is empty``."""
        await self.call(PM, pm_params(uid_hex, text))

    async def tip_user(self, uid_hex: str, dcr_amount: float, max_attempts: int) -> None:
        """``PaymentsService.TipUser``: tip ``dcr_amount`` **DCR** (a float; use
        :func:`~brmcp.clientrpc.atoms_to_dcr` for atoms) to ``uid_hex``, trying the
        invoice request up to ``max_attempts`` (>= 1) times. Returns when the tip
        is scheduled, not paid: watch :meth:`tip_progress`. Errors include
        ``maxAttempts N <= 0`` and ``user <x> not found``."""
        await self.call(TIP_USER, tip_user_params(uid_hex, dcr_amount, max_attempts))

    async def ack_received_pm(self, sequence_id: int) -> None:
        """``ChatService.AckReceivedPM``: delete PMs up to and including
        ``sequence_id`` from brclient's log, for every client (global, destructive)."""
        await self.call(ACK_RECEIVED_PM, ack_params(sequence_id))

    async def ack_tip_received(self, sequence_id: int) -> None:
        """``PaymentsService.AckTipReceived`` (the received-tips log; not
        AckTipProgress, which older bisonbotkit called by mistake)."""
        await self.call(ACK_TIP_RECEIVED, ack_params(sequence_id))

    async def ack_tip_progress(self, sequence_id: int) -> None:
        """``PaymentsService.AckTipProgress``: clear the tip-progress log up to ``sequence_id``."""
        await self.call(ACK_TIP_PROGRESS, ack_params(sequence_id))

    async def ack_kx_completed(self, sequence_id: int) -> None:
        """``ChatService.AckKXCompleted``: clear the ``kx`` log up to and
        including ``sequence_id`` (global, destructive, like the other acks)."""
        await self.call(ACK_KX_COMPLETED, ack_params(sequence_id))

    async def mediate_kx(self, mediator: str, target: str) -> None:
        """``ChatService.MediateKX`` (brclient's ``/mi <mediator> <target>``):
        ask ``mediator``, a contact, to introduce this user to ``target``, so
        that the two key-exchange through it. Both are user ids, 64 hex
        characters (sent lowercase). Returns once brclient has queued the
        request for the mediator, not when the exchange completes: watch
        :meth:`kx_stream` for the ``KXCompleted`` of ``target`` (it never
        comes when the mediator does not know ``target``). Raises
        ``ValueError`` naming the argument for a malformed uid, before
        anything is sent; :class:`RPCError` texts include ``user <x> not
        found`` (the mediator is not a contact) and ``cannot request mediate
        identity: already havesession with target <x>`` (brclient's text,
        space missing: ``target`` is already a contact)."""
        mediator_hex = check_uid(mediator, "mediator")
        target_hex = check_uid(target, "target")
        if mediator_hex == target_hex:
            raise ValueError(f"mediator and target are the same user {mediator_hex}: they must differ")
        await self.call(MEDIATE_KX, mediate_kx_params(mediator_hex, target_hex))
