"""The plain-chat reply of ``brmcp-serve``: a plain-chat PM (not a brmcp
envelope) gets one how-to-connect reply per sender per hour, with bounded
memory for the senders it remembers."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from brmcp import Router, wire
from brmcp.serve import write_serve_config
from brmcp.server.chathelp import DEFAULT_TEXT, ChatHelp, render
from brmcp.testing.fakebr import FakeBRClient
from tests.kit.clientrpc import FAST
from tests.kit.serve import Caller, serve_network, until

UID_A = "a" * 64
UID_B = "b" * 64


# -- the plain-chat reply -------------------------------------------------------------------


def test_chat_help_throttles_per_sender_per_hour_with_bounded_memory() -> None:
    now = [0.0]
    helper = ChatHelp(max_senders=3, clock=lambda: now[0])
    assert helper.should_reply(UID_A)
    assert not helper.should_reply(UID_A.upper())
    now[0] = 3599.0
    assert not helper.should_reply(UID_A)
    now[0] = 3600.0
    assert helper.should_reply(UID_A)
    for n in range(5):
        assert helper.should_reply(f"{n}" * 64)
    assert len(helper) == 3  # bounded: the oldest senders are dropped
    assert helper.should_reply(UID_A)  # dropped, so answered again
    with pytest.raises(ValueError, match="max_senders"):
        ChatHelp(max_senders=0)
    text = render(DEFAULT_TEXT, bot_uid=UID_B, bot_nick="bot", sender_uid=UID_A, allowed=False)
    assert f"brmcp-bridge settings set enabled=true allowed_bots={UID_B}" in text
    assert f"brmcp-bridge config-snippet {UID_B}" in text
    assert f"your uid ({UID_A}) is not among them" in text
    assert "not among them" not in render(
        DEFAULT_TEXT, bot_uid=UID_B, bot_nick="", sender_uid=UID_A, allowed=True
    )
    assert render('{"x": 1} {bot_uid}', bot_uid="u", bot_nick="", sender_uid="", allowed=True) == '{"x": 1} u'


@contextlib.asynccontextmanager
async def _chat_inbox(fake: FakeBRClient) -> AsyncIterator[tuple[Caller, list[str]]]:
    """An MCP caller on ``fake`` (envelopes feed its router) that also keeps
    the plain-chat PMs it receives."""
    chats: list[str] = []
    async with fake.client(**FAST) as client, Router(client) as router, anyio.create_task_group() as tg:
        pms = client.pm_stream()

        async def feed() -> None:
            async for pm in pms:
                if wire.is_envelope(pm.message):
                    router.handle_pm(pm.uid, pm.message)
                else:
                    chats.append(pm.message)
                with contextlib.suppress(Exception):
                    await client.ack_received_pm(pm.sequence_id)

        tg.start_soon(feed)
        await client.wait_connected()
        await pms.wait_open()
        yield Caller(fake, client, router), chats
        tg.cancel_scope.cancel()


async def _round_trip(caller: Caller, bot_uid: str) -> None:
    """An MCP exchange from the same sender: the bot handled every earlier PM of it."""
    async with caller.session(bot_uid) as session:
        await session.initialize()
        await session.list_tools()


async def test_a_plain_chat_pm_gets_one_reply_per_hour(tmp_path: Path) -> None:
    with anyio.fail_after(120):
        async with serve_network(tmp_path, extra=("carol",)) as env:
            app, bot = env.app, env.bot
            carol = env.others[0]
            async with (
                _chat_inbox(env.alice) as (alice, alice_chats),
                _chat_inbox(carol) as (carol_c, carol_chats),
            ):
                await alice.client.send_pm(bot.uid, "hi bot, what can you do?")
                await until(lambda: len(alice_chats) == 1, 30)
                reply = alice_chats[0]
                assert f"brmcp-bridge settings set enabled=true allowed_bots={bot.uid}" in reply
                assert f"brmcp-bridge config-snippet {bot.uid}" in reply
                assert "not among them" not in reply  # alice is allowed

                # Again within the hour, then an MCP exchange (never answered with chat).
                await alice.client.send_pm(bot.uid, "hello?")
                await _round_trip(alice, bot.uid)
                assert app.chat_replies == 1
                assert len(alice_chats) == 1

                # Carol is not allowed: she is told so, with her uid.
                await carol_c.client.send_pm(bot.uid, "hi")
                await until(lambda: len(carol_chats) == 1, 30)
                assert f"your uid ({carol.uid}) is not among them" in carol_chats[0]

                # The operator's own text, then off (SIGHUP's reload).
                write_serve_config(
                    env.datadir / "brmcp.json",
                    json.dumps(
                        {"allowed_uids": [env.alice.uid, carol.uid], "chat_help": "Ask {bot_nick}: {bot_uid}"}
                    ),
                )
                app.reload()
                app.chat_help = ChatHelp()
                await carol_c.client.send_pm(bot.uid, "hi again")
                await until(lambda: len(carol_chats) == 2, 30)
                assert carol_chats[1] == f"Ask {bot.nick}: {bot.uid}"
                write_serve_config(
                    env.datadir / "brmcp.json",
                    json.dumps({"allowed_uids": [env.alice.uid, carol.uid], "chat_help": False}),
                )
                app.reload()
                app.chat_help = ChatHelp()
                await carol_c.client.send_pm(bot.uid, "anyone?")
                await _round_trip(carol_c, bot.uid)
                assert app.chat_replies == 3
                assert len(carol_chats) == 2
