"""run_bot: a Harness served through a fake brclient over real clientrpc.

Ack ordering (only after the router, hook or credit), tips credited once
across redelivery, restart and reconnect, chat to the on_pm hook, tips from
senders that are not allowed, acks lost in a disconnect re-sent, and bad
stream input survived (the Go reference's ``server/bot.go``, karamble/brmcp;
SECURITY.md §5; docs/clientrpc.md §Acks and replay, §How bots consume the streams)."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession

from brmcp import wire
from brmcp.clientrpc import Client, ClientrpcConnectionError, TipProgressEvent
from brmcp.server import CallContext, Harness, HarnessConfig, run_bot
from brmcp.server import bot as bot_module
from brmcp.testing.fakebr import KIND_PM, KIND_TIP_PROGRESS, KIND_TIP_RECEIVED, FakeBRClient
from brmcp.transport.router import Router
from tests.kit.clientrpc import FAST, fake_network, until

ACK_TIP = "PaymentsService.AckTipReceived"
ACK_PM = "ChatService.AckReceivedPM"


def make_harness(data_dir: Path, *allowed: str) -> Harness:
    harness = Harness(HarnessConfig(data_dir=data_dir, allowed_peers=set(allowed)))

    async def paid(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True}

    harness.add_tool("paid", paid, description="paid", input_schema={"type": "object"}, price_atoms=100)
    return harness


class Recorder:
    """Hook calls in order, with an optional gate that holds on_pm."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.pm_gate: anyio.Event | None = None
        self.pm_entered = anyio.Event()
        self.connects = 0

    async def on_pm(self, uid: str, text: str) -> None:
        self.events.append(("pm", uid, text))
        self.pm_entered.set()
        if self.pm_gate is not None:
            await self.pm_gate.wait()

    def on_tip_received(self, uid: str, atoms: int) -> None:  # a sync hook on purpose
        self.events.append(("tip", uid, atoms))

    async def on_tip_progress(self, event: TipProgressEvent) -> None:
        self.events.append(("progress", event.uid, event.amount_matoms))

    def on_connected(self) -> None:
        self.connects += 1

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [e for e in self.events if e[0] == kind]


@contextlib.asynccontextmanager
async def running_bot(
    harness: Harness, fake: FakeBRClient, recorder: Recorder, **client_kwargs: Any
) -> AsyncIterator[tuple[Client, Router]]:
    """A client to ``fake`` with run_bot serving ``harness`` on it; cancelled on exit."""
    async with fake.client(**{**FAST, **client_kwargs}) as client, anyio.create_task_group() as tg:
        router = await tg.start(
            lambda task_status: run_bot(
                harness,
                client,
                on_pm=recorder.on_pm,
                on_tip_received=recorder.on_tip_received,
                on_tip_progress=recorder.on_tip_progress,
                on_connected=recorder.on_connected,
                task_status=task_status,
            )
        )
        await client.wait_connected()
        yield client, router
        tg.cancel_scope.cancel()


def cleared(fake: FakeBRClient, kind: str, *seqs: int) -> bool:
    """True once brclient's log of ``kind`` holds none of ``seqs`` (acked and applied)."""
    pending = {e.sequence_id for e in fake.pending_events(kind)}
    return not pending.intersection(seqs)


def acks(fake: FakeBRClient, method: str) -> list[int]:
    return [int(params.get("sequenceId", 0)) for m, params in fake.requests if m == method]


async def test_pm_is_acked_only_after_the_hook_or_router_took_it(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            harness = make_harness(tmp_path / "h", alice.uid)
            rec = Recorder()
            rec.pm_gate = anyio.Event()
            async with running_bot(harness, bot, rec) as (_, router):
                chat = bot.emit_pm(alice.uid, "hello bot")
                with anyio.fail_after(5):
                    await rec.pm_entered.wait()
                # The hook holds the PM: it is still in brclient's log. An ack
                # is a request run_bot awaits, so one sent before the hook
                # ran would be in brclient's log of requests by now.
                assert bot.pending_events(KIND_PM) == [chat]
                assert acks(bot, ACK_PM) == []
                rec.pm_gate.set()
                await bot.wait_for(lambda: bot.pending_events(KIND_PM) == [])
                assert acks(bot, ACK_PM) == [chat.sequence_id]

                # An envelope goes to the router, never to on_pm; then it is acked.
                envelope = wire.encode(b'{"jsonrpc":"2.0"}', sid=wire.new_id(), exp=0)[0]
                before = router.stats.pms_received
                env_pm = bot.emit_pm(alice.uid, envelope)
                await bot.wait_for(lambda: cleared(bot, KIND_PM, env_pm.sequence_id))
                assert router.stats.pms_received == before + 1
                # An empty PM reaches nobody and is acked.
                empty = bot.emit_pm(alice.uid, "")
                await bot.wait_for(lambda: cleared(bot, KIND_PM, empty.sequence_id))
                assert rec.of("pm") == [("pm", alice.uid, "hello bot")]
                assert bot.pending_events(KIND_PM) == []


async def test_tip_is_credited_before_its_ack_and_hooked_after(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            harness = make_harness(tmp_path / "h", alice.uid)
            rec = Recorder()
            async with running_bot(harness, bot, rec):
                tip = bot.emit_received_tip(alice.uid, 12_345_678)  # 12 345.678 atoms
                await until(lambda: len(rec.of("tip")) == 1)
                assert rec.of("tip") == [("tip", alice.uid, 12_345)]
                assert await harness.balance(alice.uid) == 12_345
                assert acks(bot, ACK_TIP) == [tip.sequence_id]
                assert bot.pending_events(KIND_TIP_RECEIVED) == []
                statement = await harness.statement(alice.uid)
                assert [(e.kind, e.atoms) for e in statement] == [("tip", 12_345)]

                # Tip progress: the hook, then the ack.
                prog = bot.emit_tip_progress(alice.uid, 5_000_000, completed=True, attempt=1)
                await bot.wait_for(lambda: bot.pending_events(KIND_TIP_PROGRESS) == [])
                assert rec.of("progress") == [("progress", alice.uid, 5_000_000)]
                assert acks(bot, "PaymentsService.AckTipProgress") == [prog.sequence_id]


async def test_ack_waits_for_the_credit(tmp_path: Path) -> None:
    """The ack of a tip is sent only once record_tip returned (committed)."""
    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            harness = make_harness(tmp_path / "h", alice.uid)
            gate = anyio.Event()
            recording = anyio.Event()
            real_record = harness.record_tip
            committed: list[int] = []

            async def slow_record(peer: str, amount_matoms: int, sequence_id: int) -> tuple[bool, int]:
                recording.set()
                await gate.wait()
                outcome = await real_record(peer, amount_matoms, sequence_id)
                committed.append(sequence_id)
                return outcome

            harness.record_tip = slow_record  # type: ignore[method-assign]
            rec = Recorder()
            async with running_bot(harness, bot, rec):
                tip = bot.emit_received_tip(alice.uid, 2_000_000)
                # The tip loop is inside record_tip; an ack sent before it
                # (an awaited request) would be in brclient's log by now.
                await recording.wait()
                assert acks(bot, ACK_TIP) == []
                assert bot.pending_events(KIND_TIP_RECEIVED) == [tip]
                gate.set()
                await bot.wait_for(lambda: cleared(bot, KIND_TIP_RECEIVED, tip.sequence_id))
                assert acks(bot, ACK_TIP) == [tip.sequence_id]
                assert committed == [tip.sequence_id]
                assert await harness.balance(alice.uid) == 2_000


async def test_tip_from_a_sender_not_allowed_is_acked_not_credited(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice", "carol") as (_, (bot, alice, carol)):
            harness = make_harness(tmp_path / "h", alice.uid)
            rec = Recorder()
            async with running_bot(harness, bot, rec):
                tip = bot.emit_received_tip(carol.uid, 9_000_000)
                await bot.wait_for(lambda: cleared(bot, KIND_TIP_RECEIVED, tip.sequence_id))
                assert acks(bot, ACK_TIP) == [tip.sequence_id]
                await until(lambda: len(rec.of("tip")) == 1)
                assert rec.of("tip") == [("tip", carol.uid, 9_000)]  # the hook still hears of it
                assert await harness.balance(carol.uid) == 0
                assert await harness.statement(carol.uid) == []
                assert bot.pending_events(KIND_TIP_RECEIVED) == []


async def test_tip_redelivered_after_a_restart_is_not_credited_twice(tmp_path: Path) -> None:
    with anyio.fail_after(40):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            data = tmp_path / "h"
            rec = Recorder()
            bot.hold(ACK_TIP)  # the ack never reaches brclient before the "crash"
            harness = make_harness(data, alice.uid)
            async with running_bot(harness, bot, rec):
                tip = bot.emit_received_tip(alice.uid, 7_000_000)

                async def credited() -> bool:
                    return await harness.balance(alice.uid) == 7_000

                await until(credited)
                await bot.wait_for(lambda: ACK_TIP in [m for m, _ in bot.requests])
                assert rec.of("tip") == []  # the hook runs after the ack, which is held
            await bot.wait_for(lambda: bot.connection_count == 0)  # the held ack died with it
            bot.release(ACK_TIP)
            assert bot.pending_events(KIND_TIP_RECEIVED) == [tip]  # still unacked: it will be replayed

            rec2 = Recorder()
            harness2 = make_harness(data, alice.uid)
            async with running_bot(harness2, bot, rec2):
                await bot.wait_for(lambda: bot.pending_events(KIND_TIP_RECEIVED) == [])
                assert await harness2.balance(alice.uid) == 7_000
                assert rec2.of("tip") == []  # not a new tip
                assert [(e.kind, e.atoms) for e in await harness2.statement(alice.uid)] == [("tip", 7_000)]


async def test_reconnect_mid_stream_loses_and_doubles_nothing(tmp_path: Path) -> None:
    with anyio.fail_after(40):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            harness = make_harness(tmp_path / "h", alice.uid)
            rec = Recorder()
            async with running_bot(harness, bot, rec) as (client, _):
                amounts = [1_000_000 * (i + 1) for i in range(8)]
                for i, amount in enumerate(amounts[:4]):
                    bot.emit_received_tip(alice.uid, amount)
                    bot.emit_pm(alice.uid, f"chat {i}")
                bot.drop_connections()
                # Logged while nobody is connected (or while the client reconnects).
                for i, amount in enumerate(amounts[4:], start=4):
                    bot.emit_received_tip(alice.uid, amount)
                    bot.emit_pm(alice.uid, f"chat {i}")
                await until(lambda: len(rec.of("tip")) == 8 and len(rec.of("pm")) == 8)
                await bot.wait_for(
                    lambda: bot.pending_events(KIND_TIP_RECEIVED) == [] and bot.pending_events(KIND_PM) == []
                )
                assert client.connections >= 2
                assert rec.connects >= 2
                assert await harness.balance(alice.uid) == sum(amounts) // 1000
                assert sorted(e[2] for e in rec.of("pm")) == sorted(f"chat {i}" for i in range(8))
                assert [e[2] for e in rec.of("tip")] == [a // 1000 for a in amounts]
                statement = await harness.statement(alice.uid)
                assert len(statement) == 8


async def test_ack_lost_in_a_disconnect_is_resent_after_reconnect(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            harness = make_harness(tmp_path / "h", alice.uid)
            rec = Recorder()
            bot.hold(ACK_PM)
            async with running_bot(harness, bot, rec) as (client, _):
                pm = bot.emit_pm(alice.uid, "hi")
                await bot.wait_for(lambda: ACK_PM in [m for m, _ in bot.requests])
                bot.drop_connections()  # the held ack dies with the connection
                # After the reconnect the ack is sent again (held too until released).
                await bot.wait_for(lambda: len(acks(bot, ACK_PM)) == 2)
                assert bot.pending_events(KIND_PM) == [pm]
                bot.release(ACK_PM)
                await bot.wait_for(lambda: bot.pending_events(KIND_PM) == [])
                assert acks(bot, ACK_PM) == [pm.sequence_id, pm.sequence_id]
                assert rec.of("pm") == [("pm", alice.uid, "hi")]  # processed once
                assert client.connections >= 2


async def test_bad_stream_input_and_failing_hooks_are_survived(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(40):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            harness = make_harness(tmp_path / "h", alice.uid)
            rec = Recorder()

            async def failing_pm(uid: str, text: str) -> None:
                rec.events.append(("pm", uid, text))
                raise RuntimeError("hook exploded")

            rec.on_pm = failing_pm  # type: ignore[method-assign]
            async with running_bot(harness, bot, rec) as (client, _):
                await bot.wait_streams(KIND_TIP_RECEIVED, 1)
                await bot.wait_streams(KIND_PM, 1)
                tip_method = bot.stream_methods(KIND_TIP_RECEIVED)[0]
                pm_method = bot.stream_methods(KIND_PM)[0]
                uid_b64 = base64.b64encode(bytes.fromhex(alice.uid)).decode()
                # Undecodable events, an unknown stream, and a tip id the ledger cannot hold.
                bot.send_notification(pm_method, {"uid": "not base64!", "msg": {"message": "x"}})
                bot.send_notification("ChatService.PMStream[99999999]", {"uid": uid_b64})
                huge = (1 << 64) - 1
                bot.send_notification(
                    tip_method, {"uid": uid_b64, "amountMatoms": "5000000", "sequenceId": str(huge)}
                )
                first = bot.emit_pm(alice.uid, "first")
                await bot.wait_for(lambda: cleared(bot, KIND_PM, first.sequence_id))
                # A stream ended with an error is reopened; malformed JSON makes the client reconnect.
                bot.end_streams(KIND_TIP_RECEIVED, code=-32603, message="replay failed")
                bot.send_raw(b"{not json\n")
                await until(lambda: client.connections >= 2 and client.connected)
                tip = bot.emit_received_tip(alice.uid, 3_000_000)
                second = bot.emit_pm(alice.uid, "second")
                await bot.wait_for(
                    lambda: (
                        cleared(bot, KIND_TIP_RECEIVED, tip.sequence_id)
                        and cleared(bot, KIND_PM, second.sequence_id)
                    )
                )
                assert await harness.balance(alice.uid) == 3_000  # the malformed tip credited nothing
                assert huge in acks(bot, ACK_TIP)  # acked, so it is not replayed forever
                assert [e[2] for e in rec.of("pm")] == ["first", "second"]
                assert "hook exploded" in caplog.text or "on_pm hook failed" in caplog.text


async def test_paid_call_survives_a_bot_reconnect_and_is_charged_once(tmp_path: Path) -> None:
    """A keyed MCP call through the bot's fake brclient; the bot's connection
    drops (sends fail fast meanwhile); after the reconnect the same key on a
    new session replays the outcome: one execution, one charge."""
    with anyio.fail_after(40):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            harness = make_harness(tmp_path / "h", alice.uid)
            rec = Recorder()
            async with (
                running_bot(harness, bot, rec) as (bot_client, _),
                alice.client(**FAST) as ca,
                Router(ca) as caller,
                anyio.create_task_group() as tg,
            ):
                await ca.wait_connected()
                pms = ca.pm_stream()

                async def feed() -> None:
                    async for pm in pms:
                        caller.handle_pm(pm.uid, pm.message)
                        await ca.ack_received_pm(pm.sequence_id)

                tg.start_soon(feed)
                await harness.credit(alice.uid, 150)
                key = "k" * 32
                texts = []
                for attempt in range(2):
                    if attempt == 1:
                        bot.drop_connections()
                        with pytest.raises(ClientrpcConnectionError):  # not connected, or lost
                            await bot_client.send_pm(alice.uid, "while disconnected")
                        await until(lambda: bot_client.connections >= 2 and bot_client.connected)
                    conn = caller.dial(bot.uid)
                    async with ClientSession(
                        conn.read_stream, conn.write_stream, read_timeout_seconds=15
                    ) as s:
                        await s.initialize()
                        result = await s.call_tool("paid", {}, meta={"brmcp/callKey": key})
                        assert not result.is_error
                        texts.append(json.dumps(result.structured_content))
                    conn.close()
                assert texts[0] == texts[1]
                assert await harness.balance(alice.uid) == 50
                assert harness.executions == 1
                tg.cancel_scope.cancel()


async def test_out_of_range_tips_are_logged_acked_and_not_credited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            harness = make_harness(tmp_path / "h", alice.uid)
            rec = Recorder()
            async with running_bot(harness, bot, rec):
                negative = bot.emit_received_tip(alice.uid, -5_000)
                await bot.wait_for(lambda: negative.sequence_id in acks(bot, ACK_TIP))
                huge_id = 2**63 + 7
                bot.emit_received_tip(alice.uid, 3_000, sequence_id=huge_id)
                await bot.wait_for(lambda: huge_id in acks(bot, ACK_TIP))
                good = bot.emit_received_tip(alice.uid, 4_000)
                await bot.wait_for(lambda: good.sequence_id in acks(bot, ACK_TIP))
                await until(lambda: len(rec.of("tip")) == 1)
                assert rec.of("tip") == [("tip", alice.uid, 4)]  # only the good one is a new tip
                assert await harness.balance(alice.uid) == 4
                assert [(e.kind, e.atoms) for e in await harness.statement(alice.uid)] == [("tip", 4)]
    out_of_range = [r.getMessage() for r in caplog.records if "out of range" in r.getMessage()]
    assert len(out_of_range) == 2
    assert all(r.endswith("not credited, acked") for r in out_of_range)
    with pytest.raises(ValueError, match="out of range"):
        await make_harness(tmp_path / "h2", alice.uid).record_tip(alice.uid, 1_000, 2**63)


async def test_credits_past_the_maximum_balance_are_refused_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from brmcp.server.store import MAX_BALANCE_ATOMS

    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            harness = make_harness(tmp_path / "h", alice.uid)
            rec = Recorder()
            async with running_bot(harness, bot, rec):
                await harness.credit(alice.uid, MAX_BALANCE_ATOMS - 10)
                with pytest.raises(ValueError, match="would pass the maximum"):
                    await harness.credit(alice.uid, 11)
                with pytest.raises(ValueError, match="would pass the maximum"):
                    await harness.credit(alice.uid, MAX_BALANCE_ATOMS + 1)
                over = bot.emit_received_tip(alice.uid, 11_000)  # 11 atoms: one too many
                await bot.wait_for(lambda: over.sequence_id in acks(bot, ACK_TIP))
                fits = bot.emit_received_tip(alice.uid, 10_000)  # exactly to the maximum
                await bot.wait_for(lambda: fits.sequence_id in acks(bot, ACK_TIP))
                assert await harness.balance(alice.uid) == MAX_BALANCE_ATOMS
                kinds = [(e.kind, e.atoms) for e in await harness.statement(alice.uid)]
                assert kinds == [("credit", MAX_BALANCE_ATOMS - 10), ("tip", 10)]
            # The refused tip was recorded as seen: a restart does not credit it either.
            harness2 = make_harness(tmp_path / "h", alice.uid)
            async with running_bot(harness2, bot, Recorder()):
                assert await harness2.record_tip(alice.uid, 11_000, over.sequence_id) == (False, 0)
    refused = [
        r for r in caplog.records if r.levelno == logging.ERROR and "would pass the maximum" in r.getMessage()
    ]
    assert len(refused) == 3  # two operator credits, one tip
    assert f"tip {over.sequence_id} from {alice.uid} (11000 matoms) recorded but NOT credited" in caplog.text


async def test_new_data_dir_credits_the_replay_backlog_and_says_from_whom(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    trackers: list[object] = []

    class _CountedBacklog(bot_module._Backlog):
        """The backlog tracker run_bot makes when there is no tip history
        (before it reports started): counted, otherwise unchanged."""

        def __init__(self) -> None:
            super().__init__()
            trackers.append(self)

    monkeypatch.setattr(bot_module, "_Backlog", _CountedBacklog)
    with anyio.fail_after(30), caplog.at_level(logging.INFO, logger="brmcp.server.bot"):
        async with fake_network(tmp_path, "bot", "alice", "carol") as (_, (bot, alice, carol)):
            # Tips waiting in brclient's replay log before any harness ran.
            waiting = [
                bot.emit_received_tip(alice.uid, 2_000_000),
                bot.emit_received_tip(carol.uid, 5_000_000),  # not allowed: recorded, not credited
                bot.emit_received_tip(alice.uid, 3_000_000),
            ]
            harness = make_harness(tmp_path / "h", alice.uid)
            assert not await harness.has_tip_history()
            async with running_bot(harness, bot, Recorder()):
                await bot.wait_for(lambda: cleared(bot, KIND_TIP_RECEIVED, *[t.sequence_id for t in waiting]))
                await until(lambda: "already waiting in brclient's replay log" in caplog.text)
                assert await harness.balance(alice.uid) == 5_000
                assert await harness.balance(carol.uid) == 0
                # Carol's tip is held for her (not lost from the books).
                assert [t.atoms for t in await harness.held_tips(carol.uid)] == [5_000]
                assert await harness.has_tip_history()
            summary = [r for r in caplog.records if "already waiting" in r.getMessage()]
            assert len(summary) == 1
            assert summary[0].levelno == logging.INFO
            assert summary[0].getMessage() == (
                "no tip history: 3 tips already waiting in brclient's replay log, from "
                f"{alice.uid} (2 tips, 5000 atoms credited), {carol.uid} (1 tip, 0 atoms credited)"
            )
            assert len(trackers) == 1
            # A restart on the same data directory has tip history: run_bot
            # makes no backlog tracker (decided before it reports started),
            # so no backlog report can follow.
            caplog.clear()
            later = bot.emit_received_tip(alice.uid, 1_000_000)
            async with running_bot(make_harness(tmp_path / "h", alice.uid), bot, Recorder()):
                await bot.wait_for(lambda: cleared(bot, KIND_TIP_RECEIVED, later.sequence_id))
                assert len(trackers) == 1
            assert "replay log" not in caplog.text


async def test_a_second_harness_on_one_brclient_refuses_to_start(tmp_path: Path) -> None:
    from brmcp.server import HarnessError

    with anyio.fail_after(30):
        async with fake_network(tmp_path, "bot", "alice") as (_, (bot, alice)):
            first = make_harness(tmp_path / "one", alice.uid)
            async with running_bot(first, bot, Recorder()):
                second = make_harness(tmp_path / "two", alice.uid)
                async with bot.client(**FAST) as other:
                    with pytest.raises(HarnessError) as caught:
                        await run_bot(second, other)
                message = str(caught.value)
                pid = os.getpid()
                assert f"another harness (pid {pid}) is already serving the brclient at {bot.url}" in message
                assert "would both consume its tips" in message
                # Tips go to the first harness only.
                tip = bot.emit_received_tip(alice.uid, 4_000)
                await bot.wait_for(lambda: cleared(bot, KIND_TIP_RECEIVED, tip.sequence_id))
                assert await first.balance(alice.uid) == 4
            # Once the first stopped, another may serve this brclient.
            third = make_harness(tmp_path / "three", alice.uid)
            async with running_bot(third, bot, Recorder()):
                pass
