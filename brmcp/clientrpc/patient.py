"""The daemon's PM sender (BRIDGE.md "Running the daemon"): the bridge's
:class:`~brmcp.PMSender` over a clientrpc :class:`~brmcp.clientrpc.Client`
that waits out a reconnect instead of failing at once, and the wait itself,
which the daemon's payer (:class:`~.tippayer.TipPayer`) shares.

Once a PM has waited :data:`RECONNECT_WAIT` s in vain, the sender says it
is offline (:meth:`PatientSender.offline_reason`, the bridge's
:class:`~._linkbase.OfflineAware`) until brclient is back: calls then fail
at once naming the bridge's own brclient, instead of being re-sent to the
bot until their deadline.
"""

from __future__ import annotations

import anyio

from brmcp._ops.clock import go_duration
from brmcp.clientrpc import Client, ClientrpcNotConnected
from brmcp.clientrpc.nicks import clientrpc_user_nick

__all__ = ["DEFAULT_OFFLINE_HINT", "RECONNECT_WAIT", "PatientSender", "await_connection"]

#: Seconds a payment or a PM waits for a clientrpc connection that is down
#: (brclient restarting, the client reconnecting) before it fails.
RECONNECT_WAIT = 30.0
#: How to check a brclient that is down, when the host gives no better hint.
DEFAULT_OFFLINE_HINT = "is brclient running, with its clientrpc enabled?"


class PatientSender:
    """The bridge's PM sender over a clientrpc :class:`Client`: a PM sent
    while the connection is down waits for it (at most ``wait`` seconds)
    instead of failing at once, so a call made during a reconnect goes
    through. A PM whose wait runs out raises
    :class:`~brmcp.clientrpc.ClientrpcNotConnected` naming brclient's URL;
    from then until brclient is connected again PMs fail so at once, and
    :meth:`offline_reason` says why nothing can be sent, ending with
    ``hint`` (how to check; the daemon names its log). Raises what
    ``Client.send_pm`` raises."""

    def __init__(
        self, client: Client, wait: float = RECONNECT_WAIT, *, hint: str = DEFAULT_OFFLINE_HINT
    ) -> None:
        self._client = client
        self._wait = wait
        self._hint = hint
        #: ``client.connections`` when a PM last waited out a reconnect in
        #: vain (None: none did): the outage it gave up in.
        self._gave_up: int | None = None

    async def send_pm(self, peer: str, text: str) -> None:
        client = self._client
        if self._gave_up is None or self._gave_up != client.connections:
            # Not given up on in this outage (if there is one): wait for it.
            await await_connection(client, self._wait)
        if not client.connected:
            self._gave_up = client.connections
            raise ClientrpcNotConnected(
                f"brclient at {client.url} not connected (waited {go_duration(self._wait)} for it)"
            )
        await client.send_pm(peer, text)

    def offline_reason(self) -> str | None:
        """None while brclient is connected, or while no PM has waited out
        the reconnect wait in vain since it last was; else one line for the
        agent: ``the bridge's brclient at wss://… is not connected (waited
        30s for it to reconnect; its last connection attempt: …); <hint>``.
        Names no secret."""
        client = self._client
        if client.connected or self._gave_up is None or self._gave_up != client.connections:
            return None
        last = client.last_error
        attempt = f"; its last connection attempt: {last}" if last is not None else ""
        return (
            f"the bridge's brclient at {client.url} is not connected (waited {go_duration(self._wait)} "
            f"for it to reconnect{attempt}); {self._hint}"
        )

    async def user_nick(self, uid: str) -> str:
        """brclient's nick for contact ``uid`` (the approvals page); does not
        wait for a reconnect. Raises what :func:`clientrpc_user_nick` raises."""
        return await clientrpc_user_nick(self._client, uid)


async def await_connection(client: Client, wait: float) -> None:
    """Wait (at most ``wait`` seconds) for a live connection of ``client``;
    returns either way (the caller checks ``client.connected``)."""
    if client.connected or wait <= 0:
        return
    with anyio.move_on_after(wait):
        try:
            await client.wait_connected()
        except ClientrpcNotConnected:
            return
