"""A fake Bison Relay for tests and demos: :class:`FakeRelay` (users, contacts,
store-and-forward on the in-memory fabric, simulated tips) and
:class:`FakeBRClient` (brclient's clientrpc server, faithful on the wire, over
TLS on loopback). ``brmcp-fakebr`` runs a relay with one fake brclient per user.
"""

from .certs import BRClientCerts, ensure_brclient_certs
from .relay import FakeRelay, KXSuggestion, Mediation, TipFailure
from .replaylog import ReplayLog, sequence_id
from .server import (
    CODE_EOF,
    CODE_INTERNAL,
    CODE_INVALID_PARAMS,
    KIND_KX,
    KIND_PM,
    KIND_TIP_PROGRESS,
    KIND_TIP_RECEIVED,
    FakeBRClient,
    RPCFault,
)

__all__ = [
    "CODE_EOF",
    "CODE_INTERNAL",
    "CODE_INVALID_PARAMS",
    "KIND_KX",
    "KIND_PM",
    "KIND_TIP_PROGRESS",
    "KIND_TIP_RECEIVED",
    "BRClientCerts",
    "FakeBRClient",
    "FakeRelay",
    "KXSuggestion",
    "Mediation",
    "RPCFault",
    "ReplayLog",
    "TipFailure",
    "ensure_brclient_certs",
    "sequence_id",
]
