"""The free catalog (brmcp/server/catalog/_catalog.py) and its mirroring through the
bridge (brmcp/bridge/agent/_mirror.py, subscriptions.py, link.py, http.py) under
hostile input:

* an unknown-resource error does not echo the caller's whole URI in
  ``data`` (a 16 MiB URI of control characters would come back several
  times larger);
* a bot flooding ``notifications/resources/updated`` for URIs nobody
  subscribed to gets a bounded number of unsubscribes queued, not one task
  per URI each waiting its turn on the subscription lock;
* a DELETE the SDK refuses leaves that live session's subscriptions, and
  the bot's, in place;
* a subscription table holds at most 2 KiB per URI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from brmcp.bridge.links import MAX_PENDING_DROPS
from tests.bridge.test_mirror import Inbox, agent, mirror, subscribe
from tests.kit.bridge import BOT, INIT, auth, until
from tests.kit.harness import ALICE, served
from tests.server.test_catalog import catalog_harness

# -- harness ---------------------------------------------------------------------------


async def test_unknown_resource_error_does_not_echo_a_huge_uri(tmp_path: Path) -> None:
    uri = "x://" + "\x01" * 200_000
    async with served(catalog_harness(tmp_path)) as srv, srv.client(ALICE) as session:
        with pytest.raises(MCPError) as info:
            await session.read_resource(uri)
    error = info.value.error
    assert error.code == types.INVALID_PARAMS
    assert error.message.startswith('unknown resource "x://\x01')
    assert isinstance(error.data, dict)
    assert error.data["uri"].startswith("x://\x01")
    assert error.data["uri"].endswith("…")
    # The answer stays small whatever the caller sent.
    assert len(json.dumps(error.model_dump(mode="json"))) < 4096


# -- bridge ----------------------------------------------------------------------------


class _HostileBot:
    """A bare SDK bot declaring resources with subscribe. Each
    ``resources/list`` sends ``flood`` updates for URIs nobody subscribed
    to (fresh ones each time), then a prompts list_changed as a marker;
    unsubscribes wait for ``unsub_gate``."""

    def __init__(self, flood: int = 0) -> None:
        self.flood = flood
        self.sent = 0
        self.subs: list[str] = []
        self.unsubs: list[str] = []
        self.unsub_gate = anyio.Event()

    def server(self) -> Server[Any]:
        async def list_resources(
            ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
        ) -> types.ListResourcesResult:
            for _ in range(self.flood):
                self.sent += 1
                uri = f"junk://{self.sent}"
                params_ = types.ResourceUpdatedNotificationParams(uri=uri)
                await ctx.session.send_notification(types.ResourceUpdatedNotification(params=params_))
            await ctx.session.send_notification(types.PromptListChangedNotification())
            return types.ListResourcesResult(resources=[])

        async def list_prompts(
            ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
        ) -> types.ListPromptsResult:
            return types.ListPromptsResult(prompts=[])

        async def sub(
            ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
        ) -> types.EmptyResult:
            self.subs.append(params.uri)
            return types.EmptyResult()

        async def unsub(
            ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
        ) -> types.EmptyResult:
            self.unsubs.append(params.uri)
            await self.unsub_gate.wait()
            return types.EmptyResult()

        return Server(
            "hostile-bot",
            version="1",
            on_list_resources=list_resources,
            on_list_prompts=list_prompts,
            on_subscribe_resource=sub,
            on_unsubscribe_resource=unsub,
        )


async def test_an_update_flood_for_unwatched_uris_queues_few_unsubscribes(tmp_path: Path) -> None:
    bot = _HostileBot(flood=50)
    inbox = Inbox()
    async with mirror(tmp_path, server=bot.server()) as env, agent(env, inbox) as session:
        # Rounds below the router's inbox size; the marker shows each was relayed.
        for round_ in range(1, 5):
            await session.list_resources()
            await inbox.wait_for("notifications/prompts/list_changed", round_)
        assert bot.sent == 200
        await until(lambda: len(bot.unsubs) == 1)  # the first unsubscribe is stalled at the bot
        # The rest of the pending set waits behind it on the subscription
        # lock, so none of them can reach the bot while it is stalled.
        link = env.bridge.link(BOT)
        assert link is not None
        lock = link.subscriptions.lock
        await until(lambda: lock.statistics().tasks_waiting == MAX_PENDING_DROPS - 1)
        assert len(bot.unsubs) == 1
        bot.unsub_gate.set()
        # The subscription lock is fair: once this subscribe is through,
        # every unsubscribe queued before it has been sent.
        await subscribe(session, "watched://1")
        assert bot.subs == ["watched://1"]
        assert 1 <= len(bot.unsubs) <= MAX_PENDING_DROPS


async def test_a_refused_delete_keeps_the_session_subscriptions(tmp_path: Path) -> None:
    bot = _HostileBot()
    bot.unsub_gate.set()
    async with mirror(tmp_path, server=bot.server()) as env:
        address = env.bridge.listen_address
        assert address is not None
        async with httpx2.AsyncClient(base_url=f"http://{address[0]}:{address[1]}", timeout=30) as http:
            url = f"/mcp/{BOT}"
            answer = await http.post(url, json=INIT, headers=auth())
            headers = {
                **auth(),
                "mcp-session-id": answer.headers["mcp-session-id"],
                "mcp-protocol-version": "2025-11-25",
            }
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await http.post(url, json=initialized, headers=headers)
            body = {"jsonrpc": "2.0", "id": 2, "method": "resources/subscribe", "params": {"uri": "w://1"}}
            assert (await http.post(url, json=body, headers=headers)).status_code == 200
            link = env.bridge.link(BOT)
            assert link is not None
            assert link.subscriptions.uris() == ["w://1"]

            refused = await http.delete(url, headers={**headers, "mcp-protocol-version": "1999-01-01"})
            assert refused.status_code >= 400
            # The bridge decides on a DELETE as soon as the SDK has answered
            # it, without waiting on anything; a later request of the same
            # session, answered, comes after that decision.
            ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
            assert (await http.post(url, json=ping, headers=headers)).status_code == 200
            assert link.subscriptions.uris() == ["w://1"]
            assert bot.unsubs == []

            # The session is still alive; a proper DELETE ends it and releases the URI.
            assert (await http.delete(url, headers=headers)).status_code == 200
            assert link.subscriptions.uris() == []
            await until(lambda: bot.unsubs == ["w://1"])


async def test_subscribing_a_huge_uri_is_refused_by_the_harness(tmp_path: Path) -> None:
    """A subscription table holds at most 2 KiB per URI, whatever a peer sends."""
    from brmcp.server.catalog import MAX_SUBSCRIBED_URI_BYTES

    uri = "notes://a/" + "b" * MAX_SUBSCRIBED_URI_BYTES
    async with served(catalog_harness(tmp_path)) as srv, srv.client(ALICE) as session:
        with pytest.raises(MCPError) as info:
            await subscribe(session, uri)
        assert info.value.error.code == types.INVALID_PARAMS
        assert f"longer than {MAX_SUBSCRIBED_URI_BYTES} bytes" in info.value.error.message
        await subscribe(session, "notes://a/b")  # an ordinary URI still subscribes


async def test_subscribing_a_huge_uri_is_refused_by_the_bridge(tmp_path: Path) -> None:
    """The bridge refuses it before anything reaches the bot."""
    from brmcp.bridge.links import MAX_URI_BYTES

    async with mirror(tmp_path, harness=catalog_harness(tmp_path / "bot")) as env, agent(env) as session:
        with pytest.raises(MCPError) as info:
            await subscribe(session, "memo://" + "x" * MAX_URI_BYTES)
        assert info.value.error.code == types.INVALID_PARAMS
        assert f"longer than {MAX_URI_BYTES} bytes" in info.value.error.message
        assert env.count("resources/subscribe") == 0
