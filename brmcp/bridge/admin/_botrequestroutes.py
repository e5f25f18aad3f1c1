"""The admin API routes of add-bot requests (BRIDGE.md §Admin surface;
:mod:`.botrequests`), behind the admin token like every ``/admin/…`` route:

* ``GET /admin/bot-requests`` → ``{"pending": [{"id", "uid", "reason",
  "via", "agent", "requestedAt", "expiresAt", "contact"}…], "recent":
  [{"id", "uid", "outcome", "endedAt"}…]}`` (times in unix seconds;
  ``contact`` true, false or null; ``outcome`` ``"approved"``,
  ``"denied"``, ``"timed out"`` or ``"withdrawn"``; recent newest first);
* ``POST /admin/bot-requests/<id>`` with ``{"approve": true|false}`` →
  ``{"id", "outcome"}``; 404 for an unknown id, 409 for a request that
  already ended (or while ``mcpclient.json`` fails to load), 400 for a body
  that is not exactly that object, 500 when the settings cannot be written.
"""

from __future__ import annotations

import json
from typing import Any

from brmcp.bridge.base import BridgeError, SettingsFileBroken, read_body, send_json
from brmcp.bridge.find import BotRequestQueue, RequestEnded, UnknownRequest

__all__ = ["MAX_RECENT", "bot_request_handler"]

#: Ended requests listed by ``GET /admin/bot-requests``.
MAX_RECENT = 32
_BODY_LIMIT = 4096


async def bot_request_handler(
    queue: BotRequestQueue, parts: list[str], method: str, receive: Any, send: Any
) -> bool:
    """Serve ``/admin/bot-requests`` (``parts``: the path below ``/admin``).
    False when the path is not one of these routes."""
    if not parts or parts[0] != "bot-requests" or len(parts) > 2:
        return False
    if len(parts) == 1:
        if method != "GET":
            await send_json(send, 405, {"error": "use GET"})
            return True
        await send_json(
            send,
            200,
            {
                "pending": [r.to_dict() for r in queue.pending()],
                "recent": [e.to_dict() for e in queue.recent(MAX_RECENT)],
            },
        )
        return True
    if method != "POST":
        await send_json(send, 405, {"error": "use POST"})
        return True
    body, extra = await read_body(receive, _BODY_LIMIT)
    if body is None:
        if not extra:
            await send_json(send, 413, {"error": "request body too large"})
        return True
    try:
        decision = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError):
        decision = None
    if (
        not isinstance(decision, dict)
        or set(decision) != {"approve"}
        or not isinstance(decision["approve"], bool)
    ):
        await send_json(send, 400, {"error": 'body must be {"approve": true} or {"approve": false}'})
        return True
    try:
        ended = await queue.decide(parts[1], decision["approve"])
    except UnknownRequest:
        await send_json(
            send, 404, {"error": "unknown bot request: nothing with that ID waits for a decision"}
        )
        return True
    except RequestEnded as exc:
        await send_json(send, 409, {"error": str(exc)})
        return True
    except SettingsFileBroken as exc:
        await send_json(send, 409, {"error": str(exc)})
        return True
    except BridgeError as exc:
        await send_json(send, 500, {"error": str(exc)})
        return True
    await send_json(send, 200, {"id": ended.request.id, "outcome": ended.outcome})
    return True
