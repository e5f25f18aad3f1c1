"""brmcp's clientrpc client against real bisonrelay clients (brnet): PMs, the
three streams brmcp uses, every other stream brclient offers through the
generic ``Client.subscribe`` (keepalive, KX, GC invites/joins/members/messages,
posts and post status, completed downloads), acks, replay of unacked events
(also after a brclient restart, with ids that keep growing), tips (progress at
the tipper, received tip at the payee, whole-atom amounts), the no-wallet
payee, and the error replies."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from brmcp.clientrpc import Client, ReceivedPM, ReceivedTip, RPCError, Subscription, TipProgressEvent
from brmcp.testing.brnet import BrNet

pytestmark = pytest.mark.realnet

E = TypeVar("E")


async def next_event(sub: Subscription[E], limit: float = 15.0) -> E:
    with anyio.fail_after(limit):
        return await sub.__anext__()


async def no_event(sub: Subscription[Any], wait: float = 0.6) -> None:
    with anyio.move_on_after(wait):
        ev = await sub.__anext__()
        raise AssertionError(f"unexpected event {ev!r}")


async def connected(net: BrNet, nick: str) -> AsyncIterator[Client]:
    async with net.user(nick).client(ping_interval=None) as c:
        await c.wait_connected()
        yield c


async def start(factory: Callable[..., BrNet], **kw: Any) -> BrNet:
    return await anyio.to_thread.run_sync(lambda: factory(**kw))


async def test_pm_both_ways_shapes_and_order(brnet: BrNet) -> None:
    alice, bob = brnet.user("alice"), brnet.user("bob")
    async with alice.client(ping_interval=None) as ca, bob.client(ping_interval=None) as cb:
        await ca.wait_connected()
        await cb.wait_connected()
        a_pms, b_pms = ca.pm_stream(), cb.pm_stream()
        await a_pms.wait_open()
        await b_pms.wait_open()
        for i in range(5):
            await ca.send_pm(bob.uid, f"ping {i} ünïcode")
        got = [await next_event(b_pms) for _ in range(5)]
        assert [e.message for e in got] == [f"ping {i} ünïcode" for i in range(5)]
        assert all(e.uid == alice.uid and e.nick == "alice" for e in got)
        assert all(e.mode == "MESSAGE_MODE_NORMAL" for e in got)
        # The relay stamps whole seconds; ids grow within the pm log.
        assert all(e.timestamp_ms % 1000 == 0 and e.timestamp_ms > 0 for e in got)
        ids = [e.sequence_id for e in got]
        assert ids == sorted(ids)
        assert len(set(ids)) == 5
        assert all(i >> 32 >= 1 for i in ids)
        await cb.send_pm(alice.uid, "pong")
        back = await next_event(a_pms)
        assert (back.uid, back.message) == (bob.uid, "pong")
        # Version and identity answer as brclient's services do.
        version = await ca.version()
        assert version.app_name == "brclient"
        ident = await cb.user_public_identity()
        assert ident.uid == bob.uid
        assert ident.nick == "bob"


async def test_unacked_events_replay_on_every_stream_open_and_acks_clear_them(brnet: BrNet) -> None:
    alice, bob = brnet.user("alice"), brnet.user("bob")
    async with alice.client(ping_interval=None) as ca:
        await ca.wait_connected()
        async with bob.client(ping_interval=None) as cb:
            await cb.wait_connected()
            pms = cb.pm_stream()
            await pms.wait_open()
            await ca.send_pm(bob.uid, "one")
            await ca.send_pm(bob.uid, "two")
            first = [await next_event(pms) for _ in range(2)]
        # A new connection replays both (nothing acked).
        async with bob.client(ping_interval=None) as cb:
            await cb.wait_connected()
            pms = cb.pm_stream()
            again = [await next_event(pms) for _ in range(2)]
            assert [e.sequence_id for e in again] == [e.sequence_id for e in first]
            assert [e.message for e in again] == ["one", "two"]
            # unackedFrom skips what the caller already has.
            skip = cb.pm_stream(unacked_from=first[0].sequence_id)
            only = await next_event(skip)
            assert only.message == "two"
            await cb.ack_received_pm(first[0].sequence_id)
        async with bob.client(ping_interval=None) as cb:
            await cb.wait_connected()
            pms = cb.pm_stream()
            left = await next_event(pms)
            assert left.message == "two"
            await cb.ack_received_pm(left.sequence_id)
            await no_event(pms)
            # Acking an id again (or one never issued) is accepted.
            await cb.ack_received_pm(left.sequence_id)


async def test_replay_after_brclient_restart_and_ids_keep_growing(brnet: BrNet) -> None:
    alice, bob = brnet.user("alice"), brnet.user("bob")
    async with alice.client(ping_interval=None) as ca:
        await ca.wait_connected()
        async with bob.client(ping_interval=None) as cb:
            await cb.wait_connected()
            pms = cb.pm_stream()
            await ca.send_pm(bob.uid, "before restart")
            before = await next_event(pms)
        await anyio.to_thread.run_sync(brnet.restart_user, "bob")
        async with bob.client(ping_interval=None) as cb:
            await cb.wait_connected()
            pms = cb.pm_stream()
            replayed = await next_event(pms)
            assert (replayed.sequence_id, replayed.message) == (before.sequence_id, "before restart")
            await cb.ack_received_pm(replayed.sequence_id)
            await ca.send_pm(bob.uid, "after restart")
            after = await next_event(pms)
            assert after.message == "after restart"
            # The replay log persists across the restart: ids keep growing.
            assert after.sequence_id > before.sequence_id


async def test_whole_brnet_restart_keeps_uids_kx_and_unacked_events(brnet: BrNet) -> None:
    alice, bob = brnet.user("alice"), brnet.user("bob")
    async with alice.client(ping_interval=None) as ca:
        await ca.wait_connected()
        await ca.send_pm(bob.uid, "kept across restart")
        await anyio.sleep(1.0)  # let it reach bob before the network stops
    ports = (alice.brrpcurl, bob.brrpcurl, brnet.info["relay"])
    await anyio.to_thread.run_sync(brnet.restart)
    assert brnet.user("alice").uid == alice.uid
    assert brnet.user("bob").uid == bob.uid
    assert (brnet.user("alice").brrpcurl, brnet.user("bob").brrpcurl, brnet.info["relay"]) == ports
    async with bob.client(ping_interval=None) as cb, alice.client(ping_interval=None) as ca:
        await cb.wait_connected()
        await ca.wait_connected()
        pms = cb.pm_stream()
        ev = await next_event(pms)
        assert ev.message == "kept across restart"
        await ca.send_pm(bob.uid, "still KX'd")
        assert (await next_event(pms)).message == "still KX'd"


async def test_tip_completes_with_progress_at_tipper_and_tip_at_payee(brnet: BrNet) -> None:
    alice, bob = brnet.user("alice"), brnet.user("bob")
    async with alice.client(ping_interval=None) as ca, bob.client(ping_interval=None) as cb:
        await ca.wait_connected()
        await cb.wait_connected()
        progress, received = ca.tip_progress(), cb.tip_stream()
        await progress.wait_open()
        await received.wait_open()
        await ca.tip_user(bob.uid, 0.0001, 3)  # 10,000 atoms
        tip = await next_event(received, 30)
        assert isinstance(tip, ReceivedTip)
        assert (tip.uid, tip.amount_matoms, tip.atoms) == (alice.uid, 10_000_000, 10_000)
        done = await next_event(progress, 30)
        assert isinstance(done, TipProgressEvent)
        assert (done.uid, done.nick, done.amount_matoms) == (bob.uid, "bob", 10_000_000)
        assert done.completed
        assert done.attempt == 1
        assert not done.will_retry
        assert done.attempt_err == ""
        # Amounts are whole atoms: 1.234567e-5 DCR is 1,235 atoms.
        await ca.tip_user(bob.uid, 1.234567e-5, 1)
        odd = await next_event(received, 30)
        assert odd.amount_matoms == 1_235_000
        # Acks clear the tip logs.
        await cb.ack_tip_received(tip.sequence_id)
        await cb.ack_tip_received(odd.sequence_id)
        await ca.ack_tip_progress(done.sequence_id)
        later = await next_event(progress, 30)
        await ca.ack_tip_progress(later.sequence_id)
    async with alice.client(ping_interval=None) as ca, bob.client(ping_interval=None) as cb:
        await ca.wait_connected()
        await cb.wait_connected()
        await no_event(cb.tip_stream())
        await no_event(ca.tip_progress())


async def test_no_wallet_payee_reports_zero_tip_and_the_tipper_a_retry(
    brnet_factory: Callable[..., BrNet],
) -> None:
    net = await start(brnet_factory, nowallet=("bob",))
    alice, bob = net.user("alice"), net.user("bob")
    assert bob.nowallet
    assert not alice.nowallet
    async with alice.client(ping_interval=None) as ca, bob.client(ping_interval=None) as cb:
        await ca.wait_connected()
        await cb.wait_connected()
        progress, received = ca.tip_progress(), cb.tip_stream()
        await progress.wait_open()
        await received.wait_open()
        await ca.tip_user(bob.uid, 0.0001, 3)
        tip = await next_event(received, 30)
        assert (tip.uid, tip.amount_matoms) == (alice.uid, 0)
        ev = await next_event(progress, 30)
        assert not ev.completed
        assert ev.will_retry
        assert ev.attempt == 1
        assert "different than milliatoms originally requested (10000000)" in ev.attempt_err


async def test_error_replies(brnet: BrNet) -> None:
    alice = brnet.user("alice")
    stranger = "ab" * 32
    async with alice.client(ping_interval=None) as ca:
        await ca.wait_connected()
        with pytest.raises(RPCError) as err:
            await ca.send_pm(stranger, "hi")
        assert err.value.code == -32603
        assert "not found" in err.value.message
        with pytest.raises(RPCError) as err:
            await ca.tip_user(brnet.user("bob").uid, 0.0, 1)
        assert err.value.message == "cannot pay user 0.000000 <= 0"
        with pytest.raises(RPCError) as err:
            await ca.call("ChatService.NoSuchMethod", {})
        assert err.value.code == -32603
        with pytest.raises(RPCError) as err:
            await ca.call("NoSuchService.Method", {})
        assert err.value.code == -32603
        with pytest.raises(RPCError) as err:
            await ca.call("ChatService.PM", {"user": "bob", "nosuchfield": 1})
        assert err.value.code == -32602


async def test_generic_stream_raw_shape_and_offline_recipient(brnet_factory: Callable[..., BrNet]) -> None:
    net = await start(brnet_factory, users=("alice", "bob"))
    alice, bob = net.user("alice"), net.user("bob")
    async with alice.client(ping_interval=None) as ca, bob.client(ping_interval=None) as cb:
        await ca.wait_connected()
        await cb.wait_connected()
        # Events must be hashable (the client dedupes them): keep the raw JSON.
        raw: Subscription[str] = cb.subscribe("ChatService.PMStream", lambda p: json.dumps(p))
        await raw.wait_open()
        # A PM to an offline recipient is accepted at once and delivered on return.
        await anyio.to_thread.run_sync(net.offline, "bob")
        await ca.send_pm(bob.uid, "while you were away")
        await no_event(raw, 1.0)
        await anyio.to_thread.run_sync(net.online, "bob")
        params = json.loads(await next_event(raw, 30))
        assert set(params) == {"uid", "nick", "msg", "timestampMs", "sequenceId"}
        assert base64.b64decode(params["uid"]).hex() == alice.uid
        assert isinstance(params["sequenceId"], str)
        assert isinstance(params["timestampMs"], str)
        assert params["msg"] == {"message": "while you were away"}
        decoded = ReceivedPM.from_wire(params)
        assert decoded.message == "while you were away"


# -- the other streams brclient offers, through Client.subscribe ------------------------


def raw_stream(c: Client, method: str, unacked_from: int = 0) -> Subscription[str]:
    # Events must be hashable (the client dedupes them): keep the raw JSON.
    return c.subscribe(method, lambda p: json.dumps(p, sort_keys=True), unacked_from)


async def next_json(sub: Subscription[str], limit: float = 20.0) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(await next_event(sub, limit))
    return out


def b64hex(value: str) -> str:
    return base64.b64decode(value).hex()


async def test_keepalive_stream_ticks(brnet: BrNet) -> None:
    async with brnet.user("alice").client(ping_interval=None) as ca:
        await ca.wait_connected()
        ticks = ca.subscribe("VersionService.KeepaliveStream", lambda p: json.dumps(p, sort_keys=True))
        first = json.loads(await next_event(ticks, 10))
        second = json.loads(await next_event(ticks, 10))
        assert set(first) == {"timestamp"}
        assert int(second["timestamp"]) >= int(first["timestamp"]) > 0


async def test_kx_stream_reports_completed_kx_and_ack_clears_it(brnet: BrNet) -> None:
    alice, bob = brnet.user("alice"), brnet.user("bob")
    async with alice.client(ping_interval=None) as ca:
        await ca.wait_connected()
        kxs = raw_stream(ca, "ChatService.KXStream")
        # brnet KX'd alice and bob at start; nothing acked, so it is replayed.
        ev = await next_json(kxs)
        assert {"sequenceId", "uid", "nick", "initialRendezvous"} <= set(ev)
        assert b64hex(ev["uid"]) == bob.uid
        assert ev["nick"] == "bob"
        assert len(base64.b64decode(ev["initialRendezvous"])) == 32
        await no_event(kxs)
        await ca.call("ChatService.AckKXCompleted", {"sequenceId": ev["sequenceId"]})
    async with alice.client(ping_interval=None) as ca:
        await ca.wait_connected()
        await no_event(raw_stream(ca, "ChatService.KXStream"))


async def test_gc_invite_join_members_message_and_kick_streams(brnet_factory: Callable[..., BrNet]) -> None:
    net = await start(brnet_factory, users=("alice", "bob", "carol"))
    alice, bob, carol = net.user("alice"), net.user("bob"), net.user("carol")
    await anyio.to_thread.run_sync(net.new_gc, "alice", "room")
    async with (
        alice.client(ping_interval=None) as ca,
        bob.client(ping_interval=None) as cb,
        carol.client(ping_interval=None) as cc,
    ):
        for c in (ca, cb, cc):
            await c.wait_connected()
        invites = raw_stream(cb, "GCService.ReceivedGCInvites")
        joined = raw_stream(cb, "GCService.JoinedGCs")
        gcms = raw_stream(cb, "ChatService.GCMStream")
        added = raw_stream(cb, "GCService.MembersAdded")
        removed = raw_stream(cb, "GCService.MembersRemoved")
        carol_invites = raw_stream(cc, "GCService.ReceivedGCInvites")
        carol_joined = raw_stream(cc, "GCService.JoinedGCs")
        for s in (invites, joined, gcms, added, removed, carol_invites, carol_joined):
            await s.wait_open()
        # bob is invited and joins: an invite event, then a joined event.
        await ca.call("GCService.InviteToGC", {"gc": "room", "user": "bob"})
        inv = await next_json(invites)
        assert b64hex(inv["inviterUid"]) == alice.uid
        assert inv["inviterNick"] == "alice"
        assert inv["invite"]["name"] == "room"
        gc_id = inv["invite"]["id"]
        await cb.call("GCService.AcceptGCInvite", {"inviteId": inv["inviteId"]})
        await cb.call("GCService.AckReceivedGCInvites", {"sequenceId": inv["sequenceId"]})
        j = await next_json(joined)
        assert (j["gc"]["id"], j["gc"]["name"]) == (gc_id, "room")
        assert {b64hex(m) for m in j["gc"]["members"]} == {alice.uid, bob.uid}
        await cb.call("GCService.AckJoinedGCs", {"sequenceId": j["sequenceId"]})
        # carol joins too: bob, already a member, gets a members-added event.
        await ca.call("GCService.InviteToGC", {"gc": "room", "user": "carol"})
        cinv = await next_json(carol_invites)
        await cc.call("GCService.AcceptGCInvite", {"inviteId": cinv["inviteId"]})
        await next_json(carol_joined)
        a = await next_json(added)
        assert (a["gc"], a["gcName"]) == (gc_id, "room")
        assert [b64hex(u["uid"]) for u in a["users"]] == [carol.uid]
        await cb.call("GCService.AckMembersAdded", {"sequenceId": a["sequenceId"]})
        # A GC message from alice reaches bob's GCM stream.
        await ca.call("ChatService.GCM", {"gc": "room", "msg": "hello room"})
        m = await next_json(gcms)
        assert b64hex(m["uid"]) == alice.uid
        assert m["nick"] == "alice"
        assert m["gcAlias"] == "room"
        assert m["msg"]["message"] == "hello room"
        assert int(m["timestampMs"]) % 1000 == 0
        await cb.call("ChatService.AckReceivedGCM", {"sequenceId": m["sequenceId"]})
        # carol is kicked: bob gets a members-removed event.
        await ca.call("GCService.KickFromGC", {"gc": "room", "user": "carol", "reason": "test"})
        r = await next_json(removed)
        assert (r["gc"], r["gcName"]) == (gc_id, "room")
        assert [b64hex(u["uid"]) for u in r["users"]] == [carol.uid]
        await cb.call("GCService.AckMembersRemoved", {"sequenceId": r["sequenceId"]})
    # Everything bob received is acked: nothing is replayed on a new connection.
    async with bob.client(ping_interval=None) as cb:
        await cb.wait_connected()
        subs = [
            raw_stream(cb, method)
            for method in (
                "GCService.ReceivedGCInvites",
                "GCService.JoinedGCs",
                "ChatService.GCMStream",
                "GCService.MembersAdded",
                "GCService.MembersRemoved",
            )
        ]
        for sub in subs:
            await no_event(sub, 0.3)


async def test_posts_and_post_status_streams(brnet: BrNet) -> None:
    alice, bob = brnet.user("alice"), brnet.user("bob")
    async with alice.client(ping_interval=None) as ca, bob.client(ping_interval=None) as cb:
        await ca.wait_connected()
        await cb.wait_connected()
        posts = raw_stream(cb, "PostsService.PostsStream")
        statuses = raw_stream(ca, "PostsService.PostsStatusStream")
        await posts.wait_open()
        await statuses.wait_open()
        await cb.call("PostsService.SubscribeToPosts", {"user": "alice"})
        await anyio.sleep(1.0)  # the subscription reaches alice first
        await anyio.to_thread.run_sync(brnet.post, "alice", "first post")
        p = await next_json(posts)
        assert b64hex(p["relayerId"]) == alice.uid
        assert b64hex(p["summary"]["authorId"]) == alice.uid
        assert p["summary"]["authorNick"] == "alice"
        assert p["post"]["attributes"]["main"] == "first post"
        await cb.call("PostsService.AckReceivedPost", {"sequenceId": p["sequenceId"]})
        # bob comments: alice, the author, gets a post-status event.
        pid = b64hex(p["summary"]["id"])
        await anyio.to_thread.run_sync(brnet.comment, "bob", alice.uid, pid, "nice post")
        st = await next_json(statuses)
        # relayerId is omitted here (empty bytes): the status reached the author directly.
        assert "relayerId" not in st
        assert b64hex(st["postId"]) == pid
        assert b64hex(st["statusFrom"]) == bob.uid
        assert st["statusFromNick"] == "bob"
        assert st["status"]["attributes"]["comment"] == "nice post"
        assert st["status"]["from"] == bob.uid
        await ca.call("PostsService.AckReceivedPostStatus", {"sequenceId": st["sequenceId"]})
    async with alice.client(ping_interval=None) as ca, bob.client(ping_interval=None) as cb:
        await ca.wait_connected()
        await cb.wait_connected()
        replay_posts = raw_stream(cb, "PostsService.PostsStream")
        replay_statuses = raw_stream(ca, "PostsService.PostsStatusStream")
        await no_event(replay_posts)
        await no_event(replay_statuses)


async def test_downloads_completed_stream_for_a_sent_file(brnet: BrNet, tmp_path: Path) -> None:
    alice, bob = brnet.user("alice"), brnet.user("bob")
    payload = b"brmcp file transfer " * 100
    src = tmp_path / "sent.txt"
    src.write_bytes(payload)
    async with alice.client(ping_interval=None) as ca, bob.client(ping_interval=None) as cb:
        await ca.wait_connected()
        await cb.wait_connected()
        done = raw_stream(cb, "ContentService.DownloadsCompletedStream")
        await done.wait_open()
        await ca.call("ChatService.SendFile", {"user": "bob", "filename": str(src)})
        ev = await next_json(done, 30)
        assert b64hex(ev["uid"]) == alice.uid
        assert ev["nick"] == "alice"
        meta = ev["fileMetadata"]
        assert (meta["filename"], int(meta["size"])) == ("sent.txt", len(payload))
        assert meta["hash"] == hashlib.sha256(payload).hexdigest()
        # The file really is on bob's disk, whole.
        assert await anyio.Path(ev["diskPath"]).read_bytes() == payload
        await cb.call("ContentService.AckDownloadCompleted", {"sequenceId": ev["sequenceId"]})
    async with bob.client(ping_interval=None) as cb:
        await cb.wait_connected()
        await no_event(raw_stream(cb, "ContentService.DownloadsCompletedStream"))


async def test_resource_requests_stream_and_fulfill(brnet: BrNet) -> None:
    alice, bob = brnet.user("alice"), brnet.user("bob")
    async with bob.client(ping_interval=None) as cb:
        await cb.wait_connected()
        requests = raw_stream(cb, "ResourcesService.RequestsStream")
        await requests.wait_open()
        await anyio.to_thread.run_sync(brnet.fetch, "alice", bob.uid, "index.md")
        req = await next_json(requests)
        assert b64hex(req["uid"]) == alice.uid
        assert req["nick"] == "alice"
        assert req["request"]["path"] == ["index.md"]
        # The stream has no ack: the request is answered with FulfillRequest.
        body = base64.b64encode(b"# hi").decode()
        reply = {"tag": req["request"].get("tag", "0"), "status": 200, "data": body}
        await cb.call("ResourcesService.FulfillRequest", {"id": req["id"], "response": reply})
        await no_event(requests)
