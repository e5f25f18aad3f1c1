"""The fake brclient's key exchange: MediateKX's strict params and brclient's
error texts, mediated KXs the relay carries (waiting for users off the
relay), the kx replay log across restarts, and the brclientd-style status
server: suggestions delivered to an invitee off the relay, accepted by hand
or at once, and its refusals."""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest

from brmcp.testing.fakebr import KIND_KX, FakeBRClient, FakeRelay, RPCFault
from tests.kit.clientrpc import raw_ws, recv_json, request


@contextlib.asynccontextmanager
async def status_session(fake: FakeBRClient) -> AsyncIterator[tuple[aiohttp.ClientSession, ssl.SSLContext]]:
    ctx = ssl.create_default_context(cafile=str(fake.certs.server_cert))
    ctx.load_cert_chain(fake.certs.client_cert, fake.certs.client_key)
    async with aiohttp.ClientSession() as session:
        yield session, ctx


async def post(
    fake: FakeBRClient, body: Any, *, path: str = "/contacts/suggest-kx", method: str = "POST"
) -> tuple[int, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with (
        status_session(fake) as (session, ctx),
        session.request(method, fake.status_url + path, data=data, ssl=ctx) as resp,
    ):
        return resp.status, await resp.text()


async def test_mediate_kx_params_and_brclient_error_texts(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with FakeRelay() as relay, FakeBRClient(relay, "alice", tmp_path / "a") as alice:
            mediator = relay.add_user("mediator")
            relay.kx(alice, mediator)
            cases: list[tuple[Any, int, str]] = [
                ({"mediator": mediator, "target": "ab", "extra": 1}, -32602, 'unknown field "extra"'),
                ({"mediator": mediator, "target": 5}, -32602, "invalid value for string field target: 5"),
                ({"mediator": "nobody", "target": "ab" * 32}, -32603, "user nobody not found"),
                ({"mediator": mediator, "target": "abc"}, -32603, "encoding/hex: odd length hex string"),
                ({"mediator": mediator, "target": "abg"}, -32603, "encoding/hex: invalid byte: U+0067 'g'"),
                ({"mediator": mediator, "target": "zz"}, -32603, "encoding/hex: invalid byte: U+007A 'z'"),
                ({"mediator": mediator, "target": "ab"}, -32603, "invalid ShortID length: 1"),
                ({"mediator": "mediator", "target": ""}, -32603, "invalid ShortID length: 0"),
                (
                    {"mediator": mediator[:8], "target": mediator},
                    -32603,
                    f"cannot request mediate identity: already havesession with target {mediator}",
                ),
            ]
            async with raw_ws(alice) as ws:
                for rid, (params, code, text) in enumerate(cases, start=1):
                    await request(ws, rid, "ChatService.MediateKX", params)
                    reply = await recv_json(ws)
                    assert reply["id"] == rid
                    assert reply["error"]["code"] == code, params
                    assert text in reply["error"]["message"], (params, reply)
            assert relay.mediations == []


async def test_a_mediated_kx_waits_for_the_target_to_be_online(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with FakeRelay() as relay, FakeBRClient(relay, "alice", tmp_path / "a") as alice:
            mediator = FakeBRClient(relay, "mediator", tmp_path / "m")
            target = FakeBRClient(relay, "target", tmp_path / "t")
            relay.kx(alice, mediator)
            relay.kx(mediator, target)
            async with mediator:
                mediation = alice._methods.mediate_kx(mediator.uid, target.uid)
                assert relay.is_offline(target.uid)
                async with target:
                    await mediation.done.wait()
                    assert mediation.outcome == "completed"
                    (at_target,) = target.pending_events(KIND_KX)
                    assert (at_target.uid, at_target.nick) == (alice.uid, "alice")
                (at_alice,) = alice.pending_events(KIND_KX)
                assert at_alice.uid == target.uid
                assert at_alice.initial_rendezvous == at_target.initial_rendezvous
                # Already contacts now: brclient refuses a second request.
                with pytest.raises(RPCFault, match="already havesession"):
                    alice._methods.mediate_kx(mediator.uid, target.uid)


async def test_kx_log_survives_a_restart_and_kx_is_silent(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with FakeRelay() as relay:
            bot = FakeBRClient(relay, "bot", tmp_path / "bot")
            peer, other = relay.add_user("peer"), relay.add_user("other")
            relay.kx(bot, other)  # set-up contacts: no event
            assert bot.pending_events(KIND_KX) == []
            async with bot:
                relay.complete_kx(bot, peer, rendezvous=b"\x01" * 32)
                (event,) = bot.pending_events(KIND_KX)
                assert (event.uid, event.nick, event.initial_rendezvous) == (peer, "peer", b"\x01" * 32)
        async with FakeRelay() as relay:
            again = FakeBRClient(relay, "bot", tmp_path / "bot", uid=bot.uid)
            assert again.pending_events(KIND_KX) == [event]
            later = again.emit_kx_completed(relay.add_user("other"))
            assert later.sequence_id > event.sequence_id


async def test_suggestion_waits_for_the_invitee_and_auto_accept_completes_it(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            FakeRelay() as relay,
            FakeBRClient(relay, "dir", tmp_path / "d", status_server=True) as d,
            FakeBRClient(relay, "target", tmp_path / "t") as target,
        ):
            invitee = FakeBRClient(relay, "invitee", tmp_path / "i", auto_accept_kx_suggestions=True)
            relay.kx(d, invitee)
            relay.kx(d, target)
            assert await post(d, {"invitee": invitee.uid, "target": target.uid}) == (204, "")
            (suggestion,) = relay.suggestions
            assert invitee.kx_suggestions == []  # off the relay: not delivered yet
            async with invitee:
                await invitee.wait_for(lambda: bool(relay.mediations))
                (mediation,) = relay.mediations
                await mediation.done.wait()
            assert (mediation.requester, mediation.mediator, mediation.target) == (
                invitee.uid,
                d.uid,
                target.uid,
            )
            assert mediation.outcome == "completed"
            assert invitee.kx_suggestions == []  # accepted, so removed
            assert [e.uid for e in target.pending_events(KIND_KX)] == [invitee.uid]
            assert suggestion.invitee == invitee.uid


async def test_declined_and_stale_suggestions(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            FakeRelay() as relay,
            FakeBRClient(relay, "dir", tmp_path / "d", status_server=True) as d,
            FakeBRClient(relay, "invitee", tmp_path / "i") as invitee,
            FakeBRClient(relay, "target", tmp_path / "t") as target,
        ):
            relay.kx(d, invitee)
            relay.kx(d, target)
            for _ in range(2):
                assert (await post(d, {"invitee": invitee.uid, "target": target.uid}))[0] == 204
            await invitee.wait_for(lambda: len(invitee.kx_suggestions) == 2)
            first, second = invitee.kx_suggestions
            invitee.decline_kx_suggestion(first)
            assert invitee.kx_suggestions == [second]
            relay.kx(invitee, target)  # they met another way meanwhile
            with pytest.raises(RPCFault, match="already havesession"):
                invitee.accept_kx_suggestion(second)
            assert relay.mediations == []


async def test_status_server_refusals(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            FakeRelay() as relay,
            FakeBRClient(relay, "dir", tmp_path / "d", status_server=True) as d,
        ):
            invitee, target = relay.add_user("invitee"), relay.add_user("target")
            relay.kx(d, invitee)
            assert await post(d, {}, method="GET") == (405, "method not allowed\n")
            assert await post(d, {}, path="/contacts") == (404, "404 page not found\n")
            status, text = await post(d, b"{not json")
            assert status == 400
            assert text.startswith("invalid request body: ")
            assert (await post(d, {"invitee": invitee}))[0] == 400
            assert await post(d, {"invitee": invitee, "target": "abc"}) == (
                400,
                "encoding/hex: odd length hex string\n",
            )
            assert await post(d, {"invitee": invitee, "target": target}) == (
                404,
                f"user {target} not found\n",
            )
            assert relay.suggestions == []
            assert [s for s, _ in d.status_requests] == [400, 400, 400, 404]
            assert d.status_requests[-1] == (404, {"invitee": invitee, "target": target})


async def test_status_server_is_off_by_default(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with FakeRelay() as relay, FakeBRClient(relay, "bot", tmp_path / "b") as bot:
            assert bot.status_url == ""
            assert bot.bot_config(tmp_path / "host").brstatusurl == ""
            async with bot.client() as client:
                assert client.status_url == ""
