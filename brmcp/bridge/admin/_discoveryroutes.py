"""The admin API routes of discovery (BRIDGE.md §Finding bots through
directories): ``/admin/find``, ``/admin/contact/<uid>``,
``/admin/introduce`` and ``/admin/wait-kx``, answered with
:class:`~.discovery.Discovery`."""

from __future__ import annotations

import json
import logging
from typing import Any

from brmcp.bridge.base import is_uid, send_json
from brmcp.bridge.find import (
    KX_TIMEOUT,
    MAX_KX_TIMEOUT,
    ContactsUnavailable,
    Discovery,
    DiscoveryError,
    find_args,
    read_json_object,
)
from brmcp.protocol.toolerrors import internal_error_text

__all__ = ["discovery_handler"]

log = logging.getLogger("brmcp.bridge")


def _uid_arg(body: dict[str, Any], key: str, *, optional: bool = False) -> str | None:
    value = body.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not is_uid(value.strip()):
        raise DiscoveryError(400, f"{key}: {json.dumps(value)[:80]} is not a 64-hex Bison Relay uid")
    return value.strip().lower()


async def discovery_handler(
    discovery: Discovery, route: str, parts: list[str], method: str, receive: Any, send: Any
) -> bool:
    """Serve ``/admin/find`` (POST ``{query, tags, maxPriceAtoms}`` →
    :meth:`FindResult.to_dict`), ``/admin/contact/<uid>`` (GET → ``{uid,
    contact}``, ``contact`` true, false or null), ``/admin/introduce``
    (POST ``{uid, via}`` → ``{uid, via, suggested, note}``) and
    ``/admin/wait-kx`` (POST ``{uid, timeout_secs}`` → ``{uid, contact:
    true}``, 504 when the time ran out). False when ``route`` is none of
    these. Errors are ``{"error"}`` with :attr:`DiscoveryError.status`."""
    if route not in ("find", "contact", "introduce", "wait-kx"):
        return False
    try:
        if route == "contact":
            if len(parts) != 2:
                raise DiscoveryError(404, "use /admin/contact/<uid>")
            if method != "GET":
                raise DiscoveryError(405, "use GET")
            uid = _uid_arg({"uid": parts[1]}, "uid")
            assert uid is not None
            try:
                contact = await discovery.contact(uid)
            except ContactsUnavailable as exc:
                raise DiscoveryError(503, str(exc)) from None
            await send_json(send, 200, {"uid": uid, "contact": contact})
            return True
        if len(parts) != 1:
            raise DiscoveryError(404, "not found")
        if method != "POST":
            raise DiscoveryError(405, "use POST")
        body = await read_json_object(receive, send)
        if body is None:
            return True
        if route == "find":
            query, tags, price = find_args(body)
            found = await discovery.find(query, tags=tags, max_price_atoms=price)
            await send_json(send, 200, found.to_dict())
        elif route == "introduce":
            provider = _uid_arg(body, "uid")
            assert provider is not None
            introduction = await discovery.introduce(provider, _uid_arg(body, "via", optional=True))
            await send_json(send, 200, introduction.to_dict())
        else:
            provider = _uid_arg(body, "uid")
            assert provider is not None
            timeout = body.get("timeout_secs", KX_TIMEOUT)
            if (
                isinstance(timeout, bool)
                or not isinstance(timeout, (int, float))
                or not 0 < timeout <= MAX_KX_TIMEOUT
            ):
                raise DiscoveryError(
                    400,
                    f"timeout_secs: {json.dumps(timeout)[:40]} must be a number in (0, {MAX_KX_TIMEOUT:.0f}]",
                )
            if not await discovery.wait_kx(provider, float(timeout)):
                raise DiscoveryError(
                    504,
                    f"no key exchange with {provider} within {float(timeout):.0f} s: accept the KX "
                    "suggestion in brclient (type the /mi command it shows), then run the command again",
                )
            await send_json(send, 200, {"uid": provider, "contact": True})
    except DiscoveryError as exc:
        await send_json(send, exc.status, {"error": str(exc)})
    except Exception as exc:
        # Not a refusal of ours: the short text out, the traceback to the log.
        await send_json(send, 500, {"error": internal_error_text(f"/admin/{route}", exc, log)})
    return True
