"""Key exchange on a real Bison Relay network (brnet): users that have not
KX'd cannot PM, a mediated KX (``ChatService.MediateKX``) makes them
contacts with a ``KXCompleted`` at both ends, brclient's refusals, and KX
suggestions through the brclientd-style status server brnet runs for each
user (``SuggestKX``), accepted as a mediated KX through the suggester.
Skipped with the reason where brnet cannot be built (no Go, no module proxy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from brmcp.clientrpc import KXCompleted, RPCError, StatusServerError, Subscription
from brmcp.testing.brnet import BrNet, mediated_kx

pytestmark = pytest.mark.realnet

#: alice and target both know the mediator (a directory), not each other.
PAIRS = (("alice", "mediator"), ("mediator", "target"))


async def start(factory: Callable[..., BrNet], **kw: Any) -> BrNet:
    return await anyio.to_thread.run_sync(lambda: factory(**kw))


async def next_kx(sub: Subscription[KXCompleted]) -> KXCompleted:
    with anyio.fail_after(30):
        return await sub.__anext__()


async def test_mediated_kx_makes_two_strangers_contacts(brnet_factory: Callable[..., BrNet]) -> None:
    net = await start(brnet_factory, users=("alice", "mediator", "target"), kx=PAIRS)
    alice, mediator, target = net.user("alice"), net.user("mediator"), net.user("target")
    async with alice.client(ping_interval=None) as ca, target.client(ping_interval=None) as ct:
        await ca.wait_connected()
        await ct.wait_connected()
        with pytest.raises(RPCError, match="not found"):
            await ca.send_pm(target.uid, "before any introduction")
        with anyio.fail_after(90):
            await mediated_kx(net, "alice", "mediator", "target")
        pms = ct.pm_stream()
        await pms.wait_open()
        await ca.send_pm(target.uid, "introduced")
        with anyio.fail_after(30):
            async for pm in pms:
                if pm.uid == alice.uid:
                    assert pm.message == "introduced"
                    break
        with pytest.raises(RPCError, match="already havesession with target"):
            await ca.mediate_kx(mediator.uid, target.uid)


async def test_mediate_kx_through_a_stranger_is_refused(brnet_factory: Callable[..., BrNet]) -> None:
    net = await start(brnet_factory, users=("alice", "mediator", "target"), kx="none")
    alice, mediator, target = net.user("alice"), net.user("mediator"), net.user("target")
    async with alice.client(ping_interval=None) as ca:
        await ca.wait_connected()
        with pytest.raises(RPCError, match=f"user {mediator.uid} not found"):
            await ca.mediate_kx(mediator.uid, target.uid)
    await anyio.to_thread.run_sync(net.kx, "alice", "mediator")
    async with alice.client(ping_interval=None) as ca:
        await ca.wait_connected()
        await ca.send_pm(mediator.uid, "contacts now")


async def test_kx_suggestion_through_the_status_server(brnet_factory: Callable[..., BrNet]) -> None:
    net = await start(brnet_factory, users=("alice", "mediator", "target", "stranger"), kx=PAIRS)
    alice, mediator, target = net.user("alice"), net.user("mediator"), net.user("target")
    if not mediator.status_url:
        pytest.skip("this brnet build has no status server (brstatusurl); rebuild brnet")
    async with mediator.client(ping_interval=None) as cm:
        assert cm.status_url == mediator.status_url
        await cm.suggest_kx(alice.uid, target.uid)
        with pytest.raises(StatusServerError) as caught:
            await cm.suggest_kx(alice.uid, net.user("stranger").uid)
        assert caught.value.status == 404
        assert caught.value.detail == f"user {net.user('stranger').uid} not found"
    # Accepting the suggestion is a mediated KX through the suggester.
    async with alice.client(ping_interval=None) as ca:
        await ca.wait_connected()
        kxs = ca.kx_stream()
        with anyio.fail_after(90):
            await ca.mediate_kx(mediator.uid, target.uid)
            while (await next_kx(kxs)).uid != target.uid:
                pass
