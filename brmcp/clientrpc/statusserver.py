"""KX suggestions through brclientd's status server (docs/clientrpc.md §KX
suggestions).

clientrpc has no method for the client library's ``SuggestKX`` (send
``invitee`` a suggestion to key-exchange with ``target``, introduced by this
user); brclientd exposes it on its status server instead:
``POST <brstatusurl>/contacts/suggest-kx`` with the JSON body
``{"invitee": "<hex uid>", "target": "<hex uid>"}``, over the same mutual TLS
as clientrpc (brclient's ``rpc.cert`` as the only CA, the client pair
presented). HTTP 204 or 200 is success; any other status is a refusal
(karamble/brmcp, ``cmd/brmcpdir/main.go``: ``statusClient.Suggest``). A stock
brclient has no status server: a host without ``brstatusurl`` cannot suggest.
"""

from __future__ import annotations

import json
import os
import ssl
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from .config import BotConfig
from .errors import ClientrpcConfigError, StatusServerError, StatusServerUnavailable
from .tls import client_ssl_context
from .types import check_uid

__all__ = [
    "DEFAULT_STATUS_TIMEOUT",
    "NO_STATUS_URL",
    "SUGGEST_KX_PATH",
    "StatusClient",
    "check_status_url",
]

#: The status server's KX-suggestion endpoint, below ``brstatusurl``.
SUGGEST_KX_PATH = "/contacts/suggest-kx"
#: Seconds one request may take, connection included (the Go reference's 30 s).
DEFAULT_STATUS_TIMEOUT = 30.0
#: The refusal of a host without ``brstatusurl``.
NO_STATUS_URL = (
    "this host cannot send KX suggestions: set brstatusurl in the bot config to the URL of "
    "brclientd's status server (https://host:port); a stock brclient has none"
)
#: Bytes of a refusal's body kept in the error (the Go reference's 512).
_DETAIL_BYTES = 512


def check_status_url(url: str) -> str:
    """``url`` without trailing slashes when it is an ``https://host[:port][/path]``
    URL; raises :class:`ClientrpcConfigError` naming the key ``brstatusurl``,
    the value and the allowed form otherwise."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ClientrpcConfigError(f"brstatusurl {url!r}: {exc} (https://host:port)") from None
    if parts.scheme != "https":
        raise ClientrpcConfigError(
            f"brstatusurl {url!r}: the scheme must be https (the status server uses clientrpc's mutual TLS)"
        )
    if not parts.hostname:
        raise ClientrpcConfigError(f"brstatusurl {url!r}: no host (https://host:port)")
    if parts.query or parts.fragment:
        raise ClientrpcConfigError(f"brstatusurl {url!r}: no query or fragment allowed (https://host:port)")
    return url.rstrip("/")


class StatusClient:
    """A client of brclientd's status server at ``url`` (``brstatusurl``).

    ``server_cert``/``client_cert``/``client_key``: the clientrpc certificate
    files (``servercertpath``, ``clientcertpath``, ``clientkeypath``), or
    ``ssl_context`` ready-made (a :class:`~brmcp.clientrpc.Client` shares its
    own); ``timeout``: seconds per request. Raises
    :class:`ClientrpcConfigError` (one line, naming the key or file) for a
    malformed URL or unusable certificate files. Each request opens its own
    connection: nothing stays open between suggestions.
    """

    def __init__(
        self,
        url: str,
        *,
        server_cert: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = DEFAULT_STATUS_TIMEOUT,
    ) -> None:
        self.url = check_status_url(url)
        if ssl_context is None:
            if server_cert is None or client_cert is None or client_key is None:
                raise ClientrpcConfigError(
                    "brstatusurl: the status server needs servercertpath, clientcertpath and clientkeypath"
                )
            ssl_context = client_ssl_context(server_cert, client_cert, client_key)
        if timeout <= 0:
            raise ValueError(f"timeout {timeout!r}: must be > 0 seconds")
        self._ssl = ssl_context
        self.timeout = timeout

    @classmethod
    def from_config(cls, cfg: BotConfig, **kwargs: Any) -> StatusClient:
        """A status client for a bot config (``brstatusurl`` and the three
        certificate paths); ``kwargs``: ``timeout``. Raises
        :class:`StatusServerUnavailable` when ``brstatusurl`` is not set,
        :class:`ClientrpcConfigError` when it or a certificate path is unusable."""
        if not cfg.brstatusurl:
            raise StatusServerUnavailable(NO_STATUS_URL)
        return cls(
            cfg.brstatusurl,
            server_cert=os.path.expanduser(cfg.servercertpath),
            client_cert=os.path.expanduser(cfg.clientcertpath),
            client_key=os.path.expanduser(cfg.clientkeypath),
            **kwargs,
        )

    @property
    def suggest_kx_url(self) -> str:
        """The endpoint :meth:`suggest_kx` posts to."""
        return self.url + SUGGEST_KX_PATH

    async def suggest_kx(self, invitee: str, target: str) -> None:
        """Have brclientd send ``invitee`` a suggestion to key-exchange with
        ``target`` (both user ids, 64 hex characters, sent lowercase; both
        must be contacts of this user, and accepting it is a mediated KX
        through this user). Returns on HTTP 204 or 200.

        Raises ``ValueError`` naming the argument for a malformed or repeated
        uid (nothing sent); :class:`StatusServerError` for any other status
        (``status``, and the body's first 512 bytes as ``detail``) or when the
        server cannot be reached or does not answer within ``timeout``
        seconds (``status`` None)."""
        invitee_hex, target_hex = check_uid(invitee, "invitee"), check_uid(target, "target")
        if invitee_hex == target_hex:
            raise ValueError(f"invitee and target are the same user {invitee_hex}: they must differ")
        body = json.dumps({"invitee": invitee_hex, "target": target_hex}, separators=(",", ":"))
        url = self.suggest_kx_url
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as session,
                session.post(
                    url, data=body, headers={"Content-Type": "application/json"}, ssl=self._ssl
                ) as resp,
            ):
                status = resp.status
                detail = await resp.content.read(_DETAIL_BYTES)
        except TimeoutError:
            raise StatusServerError(url, None, f"no answer within {self.timeout:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise StatusServerError(url, None, _one_line(exc)) from None
        if status not in (200, 204):
            raise StatusServerError(url, status, " ".join(detail.decode("utf-8", "replace").split()))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
