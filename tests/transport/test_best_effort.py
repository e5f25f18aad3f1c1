"""A notification (progress, logging, list_changed) is best effort: a PM
brclient cannot take drops it and keeps the session, so the call it was
about still gets its response. A request's or a response's failed PM
closes the session as before (BRIDGE.md §Failures, "brclient goes away
during a paid call")."""

from __future__ import annotations

from typing import Any

import anyio
import mcp.types as types
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.server import Server, ServerRequestContext
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCNotification, JSONRPCRequest, JSONRPCResponse
from trio.testing import MockClock

from brmcp import Conn, Router, SendError
from brmcp.testing import Fabric, LinkDownError
from tests.kit import ALICE, BOT, until
from tests.kit.transport import session

PEER = BOT


class _ProgressBot:
    """A server whose one tool reports progress ``steps`` times while
    brclient refuses exactly the PM of each of those notifications, then
    answers ``done``."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.router: Router | None = None
        self.fail_next: Any = None
        self.conns: list[Conn] = []
        self.server: Server[Any] = Server("progress-bot", version="1.0", on_call_tool=self._call)

    async def _call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        router = self.router
        assert router is not None
        for step in range(self.steps):
            # brclient lost its link for exactly this notification's PM.
            self.fail_next(BOT, count=1)
            wanted = router.stats.notifications_dropped + 1
            await ctx.session.report_progress(step + 1, self.steps)

            def dropped(wanted: int = wanted) -> bool:
                return router.stats.notifications_dropped == wanted

            await until(dropped)
        return types.CallToolResult(content=[types.TextContent(type="text", text="done")])

    async def accept(self, conn: Conn) -> None:
        self.conns.append(conn)
        await self.server.run(
            conn.read_stream, conn.write_stream, self.server.create_initialization_options()
        )


async def test_a_progress_notification_brclient_refuses_leaves_the_session_and_its_answer() -> None:
    bot = _ProgressBot(steps=3)
    async with (
        Fabric() as fabric,
        fabric.router(BOT, accept=bot.accept) as server,
        fabric.router(ALICE) as client,
        session(client, BOT) as s,
    ):
        bot.router = server
        bot.fail_next = fabric.fail_sends
        params = types.CallToolRequestParams.model_validate(
            {"name": "slow", "arguments": {}, "_meta": {"progressToken": "p-1"}}
        )
        result = await s.send_request(types.CallToolRequest(params=params), types.CallToolResult)
        assert not result.is_error
        assert result.content == [types.TextContent(type="text", text="done")]
        # Every progress PM failed and was dropped; the session lived on.
        assert server.stats.notifications_dropped == 3
        assert server.stats.send_failures == 0
        assert not bot.conns[0].closed
        assert bot.conns[0].error is None
        # ...and keeps serving: a second call on the same session is answered.
        again = await s.send_request(types.CallToolRequest(params=params), types.CallToolResult)
        assert again.content == [types.TextContent(type="text", text="done")]
        assert server.stats.notifications_dropped == 6


class _Flaky:
    """A PMSender that refuses the PMs whose 0-based index is in ``refused``."""

    def __init__(self, refused: set[int]) -> None:
        self.refused = refused
        self.handed = 0
        self.texts: list[str] = []

    async def send_pm(self, peer: str, text: str) -> None:
        index = self.handed
        self.handed += 1
        if index in self.refused:
            raise LinkDownError(f"brclient not connected (PM {index})")
        self.texts.append(text)


def _message(kind: str, n: int) -> JSONRPCNotification | JSONRPCRequest | JSONRPCResponse:
    if kind == "notification":
        return JSONRPCNotification(
            jsonrpc="2.0", method="notifications/progress", params={"progressToken": 1, "progress": n}
        )
    if kind == "request":
        return JSONRPCRequest(jsonrpc="2.0", id=n, method="tools/list")
    return JSONRPCResponse(jsonrpc="2.0", id=n, result={})


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(["notification", "request", "response"]), min_size=1, max_size=12),
    refused=st.sets(st.integers(min_value=0, max_value=11), max_size=6),
)
def test_only_a_failed_request_or_response_closes_the_session(kinds: list[str], refused: set[int]) -> None:
    """Messages written one after the other, each a one-part PM, brclient
    refusing the PMs in ``refused``: the session closes exactly at the
    first refused request or response; every refused notification before
    that is counted in ``notifications_dropped`` and nothing else."""

    async def main() -> None:
        brclient = _Flaky(refused)
        async with Router(brclient) as router:
            conn = router.dial(PEER)
            dropped = 0
            closed_at: int | None = None
            for n, kind in enumerate(kinds):
                if closed_at is not None:
                    break
                try:
                    await conn.write_stream.send(SessionMessage(_message(kind, n)))
                except anyio.BrokenResourceError:
                    pass
                await router._outbox.drained()
                if n in refused:
                    if kind == "notification":
                        dropped += 1
                        assert not conn.closed
                    else:
                        closed_at = n
                        assert conn.closed
                        assert isinstance(conn.error, SendError)
                else:
                    assert not conn.closed
            assert router.stats.notifications_dropped == dropped
            assert router.stats.send_failures == (0 if closed_at is None else 1)
            last = len(kinds) if closed_at is None else closed_at + 1
            assert len(brclient.texts) == sum(1 for n in range(last) if n not in refused)

    anyio.run(main, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})
