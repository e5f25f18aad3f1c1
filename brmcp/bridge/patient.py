"""The daemon's PM sender (BRIDGE.md "Running the daemon"): the bridge's
:class:`~brmcp.PMSender` over a clientrpc :class:`~brmcp.clientrpc.Client`
that waits out a reconnect instead of failing at once, and the wait itself,
which the daemon's payer (:class:`~.tippayer.TipPayer`) shares.
"""

from __future__ import annotations

import anyio

from ..clientrpc import Client, ClientrpcNotConnected
from .ui.nicks import clientrpc_user_nick

__all__ = ["RECONNECT_WAIT", "PatientSender", "await_connection"]

#: Seconds a payment or a PM waits for a clientrpc connection that is down
#: (brclient restarting, the client reconnecting) before it fails.
RECONNECT_WAIT = 30.0


class PatientSender:
    """The bridge's PM sender over a clientrpc :class:`Client`: a PM sent
    while the connection is down waits for it (at most ``wait`` seconds)
    instead of failing at once, so a call made during a reconnect goes
    through. Raises what ``Client.send_pm`` raises."""

    def __init__(self, client: Client, wait: float = RECONNECT_WAIT) -> None:
        self._client = client
        self._wait = wait

    async def send_pm(self, peer: str, text: str) -> None:
        await await_connection(self._client, self._wait)
        await self._client.send_pm(peer, text)

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
