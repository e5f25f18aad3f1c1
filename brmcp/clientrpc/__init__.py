"""A client for brclient's clientrpc (JSON-RPC 2.0 over a mutually
authenticated TLS websocket), with the typed PM/tip/KX messages, KX
suggestions through brclientd's status server and the bisonbotkit-style bot
config. Protocol facts: docs/clientrpc.md.

Units: 1 DCR = 1e8 atoms = 1e11 milliatoms; tips are received and reported in
milliatoms (``amount_matoms``) and sent as a float DCR amount.
"""

from .brclientlock import acquire_brclient
from .client import (
    MAX_IN_FLIGHT,
    STREAM_EOF_CODE,
    Backoff,
    Client,
    ConnectedCallback,
    DisconnectedCallback,
    Subscription,
)
from .config import (
    DEFAULT_BRRPCURL,
    BotConfig,
    brclient_appdata_dir,
    load_bot_config,
    load_or_create_bot_config,
    write_bot_config,
)
from .errors import (
    ClientrpcConfigError,
    ClientrpcConnectError,
    ClientrpcConnectionError,
    ClientrpcConnectionLost,
    ClientrpcError,
    ClientrpcNotConnected,
    ClientrpcProtocolError,
    RPCError,
    StatusServerError,
    StatusServerUnavailable,
)
from .protojson import ProtojsonError
from .statusserver import StatusClient
from .tls import check_server_certificate, client_ssl_context
from .types import (
    ATOMS_PER_DCR,
    MATOMS_PER_ATOM,
    MESSAGE_MODE_ME,
    MESSAGE_MODE_NORMAL,
    Event,
    KXCompleted,
    PublicIdentity,
    ReceivedPM,
    ReceivedTip,
    TipProgressEvent,
    VersionResponse,
    atoms_to_dcr,
    dcr_to_matoms,
)

__all__ = [
    "ATOMS_PER_DCR",
    "DEFAULT_BRRPCURL",
    "MATOMS_PER_ATOM",
    "MAX_IN_FLIGHT",
    "MESSAGE_MODE_ME",
    "MESSAGE_MODE_NORMAL",
    "STREAM_EOF_CODE",
    "Backoff",
    "BotConfig",
    "Client",
    "ClientrpcConfigError",
    "ClientrpcConnectError",
    "ClientrpcConnectionError",
    "ClientrpcConnectionLost",
    "ClientrpcError",
    "ClientrpcNotConnected",
    "ClientrpcProtocolError",
    "ConnectedCallback",
    "DisconnectedCallback",
    "Event",
    "KXCompleted",
    "ProtojsonError",
    "PublicIdentity",
    "RPCError",
    "ReceivedPM",
    "ReceivedTip",
    "StatusClient",
    "StatusServerError",
    "StatusServerUnavailable",
    "Subscription",
    "TipProgressEvent",
    "VersionResponse",
    "acquire_brclient",
    "atoms_to_dcr",
    "brclient_appdata_dir",
    "check_server_certificate",
    "client_ssl_context",
    "dcr_to_matoms",
    "load_bot_config",
    "load_or_create_bot_config",
    "write_bot_config",
]
