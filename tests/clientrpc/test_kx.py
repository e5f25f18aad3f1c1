"""Key exchange through brmcp.clientrpc against the fake brclient over real
TLS on loopback: MediateKX (both ends get KXCompleted), the KX stream, its
ack, replay and de-duplication across a reconnect, uid validation, and KX
suggestions through the status server (refused without brstatusurl, HTTP
errors, unreachable, mutual TLS)."""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp.clientrpc import (
    Client,
    KXCompleted,
    RPCError,
    StatusClient,
    StatusServerError,
    StatusServerUnavailable,
)
from brmcp.clientrpc.statusserver import check_status_url
from brmcp.testing.fakebr import KIND_KX, FakeBRClient, FakeRelay
from tests.kit.clientrpc import FAST


@contextlib.asynccontextmanager
async def network(
    tmp_path: Path, *nicks: str, **options: Any
) -> AsyncIterator[tuple[FakeRelay, dict[str, FakeBRClient]]]:
    """A relay with one running fake per nick and no contacts at all; the
    options go to every fake."""
    async with FakeRelay() as relay, contextlib.AsyncExitStack() as stack:
        fakes = {nick: FakeBRClient(relay, nick, tmp_path / nick, **options) for nick in nicks}
        for fake in fakes.values():
            await stack.enter_async_context(fake)
        yield relay, fakes


async def next_kx(sub: Any) -> KXCompleted:
    with anyio.fail_after(10):
        event = await sub.__anext__()
    assert isinstance(event, KXCompleted)
    return event


async def test_mediate_kx_makes_contacts_and_both_ends_stream_it(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with (
            network(tmp_path, "alice", "mediator", "target") as (relay, f),
            f["alice"].client(**FAST) as ca,
            f["target"].client(**FAST) as ct,
        ):
            alice, mediator, target = f["alice"], f["mediator"], f["target"]
            relay.kx(alice, mediator)
            relay.kx(mediator, target)
            await ca.wait_connected()
            await ct.wait_connected()
            with pytest.raises(RPCError, match=f"user {target.uid} not found"):
                await ca.send_pm(target.uid, "not yet")
            async with ca.kx_stream() as a_kxs, ct.kx_stream() as t_kxs:
                await a_kxs.wait_open()
                await t_kxs.wait_open()
                await ca.mediate_kx(mediator.uid.upper(), target.uid)
                at_alice, at_target = await next_kx(a_kxs), await next_kx(t_kxs)
            assert (at_alice.uid, at_alice.nick) == (target.uid, "target")
            assert (at_target.uid, at_target.nick) == (alice.uid, "alice")
            assert len(at_alice.initial_rendezvous) == 32
            assert at_alice.initial_rendezvous == at_target.initial_rendezvous
            assert relay.are_contacts(alice.uid, target.uid)
            assert [m.outcome for m in relay.mediations] == ["completed"]
            sent = [p for m, p in alice.requests if m == "ChatService.MediateKX"]
            assert sent == [{"mediator": mediator.uid, "target": target.uid}]
            async with ct.pm_stream() as pms:
                await ca.send_pm(target.uid, "hello through the introduction")
                with anyio.fail_after(10):
                    assert (await pms.__anext__()).message == "hello through the introduction"
            # A second request for a contact is refused with brclient's text.
            with pytest.raises(RPCError, match="already havesession with target"):
                await ca.mediate_kx(mediator.uid, target.uid)


async def test_mediator_without_the_target_drops_the_request(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with (
            network(tmp_path, "alice", "mediator", "target") as (relay, f),
            f["alice"].client(**FAST) as ca,
        ):
            alice, mediator, target = f["alice"], f["mediator"], f["target"]
            relay.kx(alice, mediator)
            await ca.wait_connected()
            await ca.mediate_kx(mediator.uid, target.uid)  # brclient accepts it: the mediator decides
            (mediation,) = relay.mediations
            await mediation.done.wait()
            assert mediation.outcome.startswith(f"mediator {mediator.uid} has no contact {target.uid}")
            assert not relay.are_contacts(alice.uid, target.uid)
            assert alice.pending_events(KIND_KX) == []
            assert target.pending_events(KIND_KX) == []


async def test_mediate_kx_refusals_and_bad_uids(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with (
            network(tmp_path, "alice", "mediator", "target") as (relay, f),
            f["alice"].client(**FAST) as ca,
        ):
            alice, mediator, target = f["alice"], f["mediator"], f["target"]
            await ca.wait_connected()
            with pytest.raises(RPCError, match=f"user {mediator.uid} not found") as caught:
                await ca.mediate_kx(mediator.uid, target.uid)
            assert caught.value.code == -32603
            bad = [
                ("ab" * 31, target.uid, "mediator"),
                ("zz" * 32, target.uid, "mediator"),
                (mediator.uid, target.uid + "0", "target"),
                (mediator.uid, "", "target"),
            ]
            for m, t, name in bad:
                with pytest.raises(
                    ValueError, match=f"^{name} .* is not a user id: expected 64 hex characters"
                ):
                    await ca.mediate_kx(m, t)
            with pytest.raises(ValueError, match="mediator and target are the same user"):
                await ca.mediate_kx(mediator.uid, mediator.uid)
            methods = [m for m, _ in alice.requests]
            assert methods == ["ChatService.MediateKX"]  # only the first one was sent
            assert relay.mediations == []


async def test_kx_stream_ack_and_resume_after_reconnect(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with network(tmp_path, "bot", "p1", "p2", "p3") as (relay, f), f["bot"].client(**FAST) as cb:
            bot = f["bot"]
            await cb.wait_connected()
            relay.complete_kx(bot, f["p1"])
            relay.complete_kx(bot, f["p2"])
            async with cb.kx_stream() as kxs:
                first, second = await next_kx(kxs), await next_kx(kxs)
                assert [first.uid, second.uid] == [f["p1"].uid, f["p2"].uid]
                assert first.sequence_id < second.sequence_id
                await cb.ack_kx_completed(first.sequence_id)
                assert bot.pending_events(KIND_KX) == [second]
                opens = bot.total_connections
                bot.drop_connections()
                relay.complete_kx(bot, f["p3"])  # logged while the client is away
                await bot.wait_for(lambda: bot.total_connections > opens)
                third = await next_kx(kxs)
                assert third.uid == f["p3"].uid
                # The replayed second event was dropped as already delivered.
                assert kxs.duplicates == 1
                await cb.ack_kx_completed(third.sequence_id)
            assert bot.pending_events(KIND_KX) == []
            acks = [p for m, p in bot.requests if m == "ChatService.AckKXCompleted"]
            assert acks == [{"sequenceId": str(first.sequence_id)}, {"sequenceId": str(third.sequence_id)}]


async def test_suggest_kx_without_a_status_url_is_refused(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with network(tmp_path, "dir", "i", "t") as (relay, f), f["dir"].client(**FAST) as cd:
            relay.kx(f["dir"], f["i"])
            relay.kx(f["dir"], f["t"])
            assert cd.status_url == ""
            with pytest.raises(StatusServerUnavailable) as caught:
                await cd.suggest_kx(f["i"].uid, f["t"].uid)
            assert str(caught.value).startswith("this host cannot send KX suggestions: set brstatusurl")
            assert "\n" not in str(caught.value)
            assert relay.suggestions == []
            cfg = f["dir"].bot_config(tmp_path / "host")
            assert cfg.brstatusurl == ""
            with pytest.raises(StatusServerUnavailable, match="set brstatusurl"):
                StatusClient.from_config(cfg)


async def test_suggest_kx_reaches_the_invitee_who_accepts_it(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with network(tmp_path, "dir", "inv", "tgt", status_server=True) as (relay, f):
            d, invitee, target = f["dir"], f["inv"], f["tgt"]
            relay.kx(d, invitee)
            relay.kx(d, target)
            cfg = d.bot_config(tmp_path / "host")
            assert cfg.brstatusurl == d.status_url
            assert d.status_url.startswith("https://127.0.0.1:")
            async with Client.from_config(cfg, **FAST) as cd, invitee.client(**FAST) as ci:
                assert cd.status_url == d.status_url
                await ci.wait_connected()
                async with ci.kx_stream() as kxs:
                    await kxs.wait_open()
                    await cd.suggest_kx(invitee.uid, target.uid)
                    assert d.status_requests == [(204, {"invitee": invitee.uid, "target": target.uid})]
                    await invitee.wait_for(lambda: bool(invitee.kx_suggestions))
                    (suggestion,) = invitee.kx_suggestions
                    assert (suggestion.suggester, suggestion.target, suggestion.target_nick) == (
                        d.uid,
                        target.uid,
                        "tgt",
                    )
                    mediation = invitee.accept_kx_suggestion(suggestion)
                    assert invitee.kx_suggestions == []
                    assert (mediation.requester, mediation.mediator) == (invitee.uid, d.uid)
                    event = await next_kx(kxs)
            assert event.uid == target.uid
            assert relay.are_contacts(invitee.uid, target.uid)


async def test_suggest_kx_http_refusals(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with network(tmp_path, "dir", "inv", "tgt", "stranger", status_server=True) as (relay, f):
            d, invitee, target, stranger = f["dir"], f["inv"], f["tgt"], f["stranger"]
            relay.kx(d, invitee)
            relay.kx(d, target)
            status = StatusClient(
                d.status_url + "/",
                server_cert=d.certs.server_cert,
                client_cert=d.certs.client_cert,
                client_key=d.certs.client_key,
            )
            assert status.suggest_kx_url == d.status_url + "/contacts/suggest-kx"
            d.fail_next_suggestion(503, "busy,\n try later")
            with pytest.raises(StatusServerError) as caught:
                await status.suggest_kx(invitee.uid, target.uid)
            assert (caught.value.status, caught.value.detail) == (503, "busy, try later")
            assert (
                str(caught.value)
                == f"brclientd status server {status.suggest_kx_url}: HTTP 503: busy, try later"
            )
            d.fail_next_suggestion(500)
            with pytest.raises(StatusServerError, match=r"HTTP 500$"):
                await status.suggest_kx(invitee.uid, target.uid)
            with pytest.raises(StatusServerError) as caught:
                await status.suggest_kx(invitee.uid, stranger.uid)
            assert (caught.value.status, caught.value.detail) == (404, f"user {stranger.uid} not found")
            d.fail_next_suggestion(200, "ok")  # 200 is success too
            await status.suggest_kx(invitee.uid, target.uid)
            assert relay.suggestions == []  # the queued answers suggested nothing
            for bad in ("x" * 64, target.uid[:-2]):
                with pytest.raises(ValueError, match=r"^target .* is not a user id"):
                    await status.suggest_kx(invitee.uid, bad)
            with pytest.raises(ValueError, match="invitee and target are the same user"):
                await status.suggest_kx(target.uid, target.uid.upper())
            assert [s for s, _ in d.status_requests] == [503, 500, 404, 200]


async def test_suggest_kx_unreachable_and_mutual_tls(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with network(tmp_path, "dir", "inv", "tgt", status_server=True) as (relay, f):
            d, invitee, target = f["dir"], f["inv"], f["tgt"]
            relay.kx(d, invitee)
            relay.kx(d, target)
            # A client pair signed by another brclient's CA is refused in the handshake.
            foreign = StatusClient(
                d.status_url,
                server_cert=d.certs.server_cert,
                client_cert=invitee.certs.client_cert,
                client_key=invitee.certs.client_key,
            )
            with pytest.raises(StatusServerError) as caught:
                await foreign.suggest_kx(invitee.uid, target.uid)
            assert caught.value.status is None
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                closed_port = sock.getsockname()[1]
            gone = StatusClient(
                f"https://127.0.0.1:{closed_port}",
                server_cert=d.certs.server_cert,
                client_cert=d.certs.client_cert,
                client_key=d.certs.client_key,
                timeout=5,
            )
            with pytest.raises(StatusServerError, match="unreachable") as caught:
                await gone.suggest_kx(invitee.uid, target.uid)
            assert caught.value.status is None
            assert d.status_requests == []
            assert relay.suggestions == []


def test_status_url_must_be_https() -> None:
    assert check_status_url("https://127.0.0.1:7677/") == "https://127.0.0.1:7677"
    for url, why in (
        ("http://127.0.0.1:7677", "the scheme must be https"),
        ("https://:7677", "no host"),
        ("https://127.0.0.1:99999", "out of range"),
        ("https://127.0.0.1:7677/?x=1", "no query or fragment"),
    ):
        with pytest.raises(ValueError, match=f"^{re.escape(f'brstatusurl {url!r}: ')}.*{why}"):
            check_status_url(url)
