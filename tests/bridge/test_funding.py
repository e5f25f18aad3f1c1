"""Paying before the bot asks (BRIDGE.md §Pay alongside and prepay): a first
paid call with an empty balance in one round trip plus the tip, steady paid
calls with no tip on their path when prepay is on, and the books checked to
the atom. PM counts, not times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from brmcp.bridge import Settings
from brmcp.bridge.base import SettingsError, settings_from_json
from brmcp.bridge.cli import parse_pairs
from brmcp.bridge.pay import Funding
from brmcp.protocol.payment import PAY_ALONGSIDE_KEY, parse_receipt
from brmcp.testing.fabric import Faults
from tests.kit import pm_parts
from tests.kit.bridge import BOT, CLIENT, Env, bridge_env, call, fixture_settings, texts, until


def pms(env: Env) -> int:
    """Messages between the bridge and the bot so far: envelope parts, a
    batch PM counting each of its parts (WIRE.md §Batches)."""
    counter = getattr(env, "_parts", None)
    if counter is None:
        counter = _PartCount()
        env.fabric.add_tap(counter)
        env._parts = counter  # type: ignore[attr-defined]
    return counter.n


class _PartCount:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, from_uid: str, to_uid: str, text: str) -> None:
        if {from_uid, to_uid} == {CLIENT, BOT}:
            self.n += len(pm_parts(text))


def credit_once(env: Env, ready: Any) -> Any:
    """A payer that credits the bot only once ``ready()`` holds (the call
    reached the bot): a tip takes longer than a PM on a real relay."""

    async def behaviour(payee: str, atoms: int) -> None:
        await until(ready)
        await env.payer.credit(payee, atoms)

    return behaviour


def spend(env: Env) -> list[dict[str, Any]]:
    return [e.to_dict() for e in env.bridge.spend_log().entries]


def _funding(env: Env) -> Funding:
    """The bot's known balance and payments ahead of need in ``env``'s bridge."""
    funding = env.bridge._proxies[BOT].funding
    assert funding is not None
    return funding


async def test_first_paid_call_pays_alongside_in_one_round_trip(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            env.payer.behaviour = credit_once(env, lambda: env.harness.holds >= 1)
            before = pms(env)
            result = await call(session, "paid", {"text": "x"})
            assert result.structured_content == {"n": 1}
            assert pms(env) - before == 2  # the marked call and its result; the tip is no PM
            assert env.harness.holds == 1
            assert env.payer.calls == [(BOT, 500)]
            receipt = parse_receipt(result.meta)
            assert receipt is not None
            assert (receipt.charged_atoms, receipt.balance_atoms) == (500, 0)
            # Books: one payment, one execution, nothing left over.
            await until(lambda: [e["status"] for e in spend(env)] == ["paid"])
            assert await env.harness.balance(CLIENT) == 0
            assert env.executions == {"paid": 1}
            assert env.bridge.spend_log().day_total_atoms == 500


async def test_a_harness_that_ignores_the_mark_is_paid_once(tmp_path: Path) -> None:
    """A bot without holding (the Go reference, or holding off) answers
    payment_required at once: the bridge waits for the payment already
    under way and reissues the same call; it never pays twice."""
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            env.harness.config.hold_seconds = 0
            seen: list[dict[str, Any]] = []
            original = env.harness.call

            async def spy(*args: Any, **kwargs: Any) -> Any:
                seen.append({"key": args[4], "alongside": kwargs.get("alongside")})
                return await original(*args, **kwargs)

            env.harness.call = spy  # type: ignore[method-assign]
            router = env.harness.router
            assert router is not None
            answered = router.stats.messages_sent
            env.payer.behaviour = credit_once(env, lambda: router.stats.messages_sent > answered)
            before = pms(env)
            result = await call(session, "paid", {"text": "x"})
            assert result.structured_content == {"n": 1}
            assert pms(env) - before == 4  # refused, then the reissue after the tip
            assert env.payer.calls == [(BOT, 500)]
            assert len(seen) == 2
            assert seen[0]["key"] == seen[1]["key"]
            assert seen[0]["alongside"] == 500
            assert env.harness.holds == 0
            assert await env.harness.balance(CLIENT) == 0
            assert env.executions == {"paid": 1}


async def test_no_payment_alongside_in_approval_mode_or_for_dynamic_prices(tmp_path: Path) -> None:
    settings = fixture_settings(mode="approval", approval_timeout_secs=1)
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env, env.session() as session:
            requests: list[Any] = []
            original = env.harness.call

            async def spy(*args: Any, **kwargs: Any) -> Any:
                requests.append(kwargs.get("alongside"))
                return await original(*args, **kwargs)

            env.harness.call = spy  # type: ignore[method-assign]
            results: list[Any] = []
            async with anyio.create_task_group() as tg:

                async def one() -> None:
                    results.append(await call(session, "paid", {"text": "x"}))

                tg.start_soon(one)
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                (pending,) = env.bridge.pending_payments()
                env.bridge.resolve_payment(pending.id, False)
            assert requests == [0]  # unmarked: the user decides before anything is paid
            assert env.payer.calls == []
            assert "payment denied by the user" in texts(results[0])[-1]
    with anyio.fail_after(30):
        (tmp_path / "dyn").mkdir()
        async with bridge_env(tmp_path / "dyn") as env, env.session() as session:
            before = pms(env)
            result = await call(session, "dyn", {})
            assert result.structured_content == {"dyn": True}
            assert pms(env) - before == 4  # no fixed price known: the reference flow
            assert env.payer.calls == [(BOT, 7)]


async def test_prepay_keeps_steady_calls_at_two_pms_with_no_tip_on_their_path(tmp_path: Path) -> None:
    settings = fixture_settings(prepay_bots=(BOT,))
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=settings) as env, env.session() as session:
            first = await call(session, "paid", {"text": "x"})
            assert first.structured_content == {"n": 1}
            # The receipt said 0 left: the next call's price is prepaid in the background.
            await until(lambda: len(spend(env)) == 2 and spend(env)[1]["status"] == "paid")
            assert spend(env)[1]["prepay"] is True
            assert "prepay" not in spend(env)[0]
            marks: list[int] = []
            original = env.harness.call

            async def spy(*args: Any, **kwargs: Any) -> Any:
                marks.append(kwargs.get("alongside", 0))
                return await original(*args, **kwargs)

            env.harness.call = spy  # type: ignore[method-assign]

            def funding() -> Any:
                return env.bridge._proxies[BOT].funding

            for n in (2, 3, 4):
                # Topped up before the call: the prepayment is confirmed and known.
                await until(lambda n=n: len(env.payer.calls) == n and funding().balance == 500)
                before, holds = pms(env), env.harness.holds
                result = await call(session, "paid", {"text": "x"})
                assert result.structured_content == {"n": n}
                assert pms(env) - before == 2
                assert env.harness.holds == holds  # charged at once, never held
            assert marks == [0, 0, 0]  # no payment alongside: nothing to wait for
            await until(lambda: len(env.payer.calls) == 5)
            await until(lambda: all(e["status"] == "paid" for e in spend(env)))
            # Books: 5 payments of 500; 4 executions; the 5th is at the bot as credit.
            assert env.payer.calls == [(BOT, 500)] * 5
            assert env.executions == {"paid": 4}
            assert await env.harness.balance(CLIENT) == 500
            assert env.bridge.spend_log().day_total_atoms == 2500
            assert [e.get("prepay", False) for e in spend(env)] == [False, True, True, True, True]


async def test_prepayments_count_against_the_caps(tmp_path: Path) -> None:
    settings = fixture_settings(prepay_bots=(BOT,), per_day_cap_atoms=1000)
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=settings) as env, env.session() as session:
            assert (await call(session, "paid", {"text": "x"})).structured_content == {"n": 1}
            await until(lambda: len(spend(env)) == 2 and spend(env)[1]["status"] == "paid")
            # The prepayment filled the daily cap; the call it paid for still runs.
            started = _funding(env).started
            assert (await call(session, "paid", {"text": "x"})).structured_content == {"n": 2}
            # No prepayment past the cap: the call decided before its result
            # came back, and started no payment ahead of need.
            assert _funding(env).started == started
            assert len(spend(env)) == 2
            third = await call(session, "paid", {"text": "x"})
            assert third.is_error
            assert texts(third)[-1] == (
                "brclientd: payment not made: 500 atoms would exceed the daily cap (1000 spent of 1000)"
            )
            assert env.payer.calls == [(BOT, 500), (BOT, 500)]
            assert env.executions == {"paid": 2}
            assert await env.harness.balance(CLIENT) == 0


async def test_prepay_in_approval_mode_waits_for_the_user(tmp_path: Path) -> None:
    settings = fixture_settings(prepay_bots=(BOT,), mode="approval")
    with anyio.fail_after(30):
        async with (
            bridge_env(tmp_path, settings=settings, auto_clock=False) as env,
            env.session() as session,
        ):
            results: list[Any] = []
            async with anyio.create_task_group() as tg:

                async def one() -> None:
                    results.append(await call(session, "paid", {"text": "x"}))

                tg.start_soon(one)
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                (asked,) = env.bridge.pending_payments()
                assert asked.tool == "paid"  # the refusal's payment: not alongside
                env.bridge.resolve_payment(asked.id, True)
            assert results[0].structured_content == {"n": 1}
            # The receipt left 0: a prepayment is proposed, and waits for the user.
            await until(lambda: len(env.bridge.pending_payments()) == 1)
            (prepay,) = env.bridge.pending_payments()
            assert (prepay.tool, prepay.atoms) == ("paid (prepayment)", 500)
            assert len(env.payer.calls) == 1
            env.bridge.resolve_payment(prepay.id, True)
            await until(lambda: len(spend(env)) == 2 and spend(env)[1]["status"] == "paid")
            assert spend(env)[1]["prepay"] is True
            before = pms(env)
            assert (await call(session, "paid", {"text": "x"})).structured_content == {"n": 2}
            assert pms(env) - before == 2
            assert env.payer.calls == [(BOT, 500), (BOT, 500)]


async def test_nothing_is_paid_alongside_a_call_with_invalid_arguments(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            for _ in range(3):
                result = await call(session, "paid", {"count": "not a number"})
                assert result.is_error
                assert 'validating "arguments"' in texts(result)[0]
            assert env.payer.calls == []
            assert spend(env) == []
            assert env.harness.holds == 0


async def test_prepay_is_off_by_default(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            assert (await call(session, "paid", {"text": "x"})).structured_content == {"n": 1}
            # Decided before the result came back: the payment alongside the
            # call is the only one started, no prepayment after it.
            assert _funding(env).started == 1
            assert env.payer.calls == [(BOT, 500)]
            assert len(spend(env)) == 1


def test_prepay_setting_file_cli_and_validation(tmp_path: Path) -> None:
    base = Settings()
    # Unset: the file keeps exactly the Go reference's keys.
    assert "prepay_bots" not in json.loads(base.to_json())
    on = settings_from_json(json.dumps({"prepay_bots": [BOT.upper()]}), base=base).normalized()
    on.validate()
    assert on.prepays(BOT)
    assert not on.prepays(CLIENT)
    assert json.loads(on.to_json())["prepay_bots"] == [BOT.upper()]
    assert list(json.loads(on.to_json()))[-1] == "prepay_bots"
    assert settings_from_json('{"prepay_bots": null}', base=on).prepay_bots is None
    with pytest.raises(SettingsError, match='prepay bot "nope" is not a 64-hex uid'):
        base.replace(prepay_bots=("nope",)).validate()
    assert parse_pairs([f"prepay_bots={BOT},{CLIENT}"]) == {"prepay_bots": [BOT, CLIENT]}
    assert PAY_ALONGSIDE_KEY == "brmcp/payAlongside"


async def test_a_failed_payment_alongside_withdraws_the_held_call_at_once(tmp_path: Path) -> None:
    """The payment made alongside fails (no route): the bridge withdraws the
    call the bot holds and asks again unmarked under the same key, so the
    agent hears the refusal with the payment's note now, not when the
    bot's hold (here 10 minutes) ends. Nothing is charged or run."""

    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:

            async def no_route(payee: str, atoms: int) -> None:
                await until(lambda: env.harness.holds >= 1)  # the bot holds the call
                raise RuntimeError("no route to bot")

            env.harness.config.hold_seconds = 600
            env.payer.behaviour = no_route
            before = pms(env)
            result = await call(session, "paid", {"text": "x"})
            assert texts(result)[-1] == "brclientd: payment not made: no route to bot"
            refusal = json.loads(texts(result)[0])
            assert (refusal["error"], refusal["priceAtoms"]) == ("payment_required", 500)
            # The marked call, its cancellation, the unmarked copy and the refusal.
            assert pms(env) - before == 4
            assert env.executions == {}
            assert await env.harness.balance(CLIENT) == 0
            assert [(e["status"], e["err"]) for e in spend(env)] == [("failed", "no route to bot")]
            # The same key is not bound to anything: the next call pays and runs once.
            env.payer.behaviour = None
            again = await call(session, "paid", {"text": "x"})
            assert again.structured_content == {"n": 1}
            assert env.executions == {"paid": 1}
            assert await env.harness.balance(CLIENT) == 0


async def test_a_held_call_is_not_sent_again_when_its_payment_confirms(tmp_path: Path) -> None:
    """While the bot holds a call paid alongside, the bridge sends no copy;
    when the payment confirms, the bot's answer is one relay hop away, so
    the re-send clock restarts from that moment instead of firing at once
    on a stale "last heard" (found on brnet at 250 ms: a duplicate send, 3
    PMs more). Here a PM takes 0.2 s, so the bridge's retransmission
    timeout is about 1.2 s, and the tip confirms just before it fires."""

    async def slow_tip(payee: str, atoms: int) -> None:
        await anyio.sleep(1.15)
        await env.payer.credit(payee, atoms)

    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env:
            env.fabric.faults = Faults(latency=0.2)
            async with env.session() as session:
                link = env.bridge.link(BOT)
                assert link is not None
                env.payer.behaviour = slow_tip
                before = pms(env)
                result = await call(session, "paid", {"text": "x"})
                assert result.structured_content == {"n": 1}
                assert link.resends == 0
                assert pms(env) - before == 2
                assert env.executions == {"paid": 1}
                assert await env.harness.balance(CLIENT) == 0


async def test_credit_already_at_the_bot_is_not_paid_again_and_again(tmp_path: Path) -> None:
    """With credit at the bot the bridge does not know about, a call paid
    alongside is charged the existing credit at once and its receipt comes
    before the tip's confirmation: the tip is then added on top of the known
    balance, so the calls after it use it instead of paying alongside again
    (which would keep the bot's balance a price ahead for ever)."""

    async def relay_tip(payee: str, atoms: int) -> None:
        await anyio.sleep(0.2)  # a tip takes longer than the call's round trip, as on BR
        await env.payer.credit(payee, atoms)

    with anyio.fail_after(30):
        async with bridge_env(tmp_path) as env, env.session() as session:
            env.payer.behaviour = relay_tip
            await env.harness.credit(CLIENT, 500)  # an operator top-up, say
            for n in (1, 2, 3, 4):
                result = await call(session, "paid", {"text": "x"})
                assert result.structured_content == {"n": n}
                await until(lambda: all(e["status"] == "paid" for e in spend(env)))
            # The reference pays three tips here (calls 2-4, each after a
            # refusal); so does this bridge (one of them ahead of need).
            assert len(env.payer.calls) == 3
            balance = await env.harness.balance(CLIENT)
            assert balance <= 500
            # Books to the atom: 500 credited + tips = 4 charges + what is left.
            assert 500 + sum(a for _, a in env.payer.calls) == 4 * 500 + balance
            assert env.executions == {"paid": 4}


async def test_a_bridge_restart_does_not_pay_alongside_an_unknown_balance(tmp_path: Path) -> None:
    """After a restart the bridge no longer knows the balance; having paid
    this bot before, it sends the call unmarked and lets the bot's answer
    tell (a receipt when the credit is there: no tip at all)."""
    with anyio.fail_after(30):
        async with bridge_env(tmp_path, settings=fixture_settings(prepay_bots=(BOT,))) as env:
            async with env.session() as session:
                assert (await call(session, "paid", {"text": "x"})).structured_content == {"n": 1}
                await until(lambda: len(spend(env)) == 2 and spend(env)[1]["status"] == "paid")
            assert await env.harness.balance(CLIENT) == 500  # prepaid for the next call
            await env.bridge.close()
            bridge = env.new_bridge(listen="127.0.0.1:0")
            env.fabric.attach(CLIENT, bridge.handle_pm)
            await bridge.start()
            try:
                address = bridge.listen_address
                assert address is not None
                url = f"http://{address[0]}:{address[1]}/mcp/{BOT}"
                async with env.session(url=url) as session:
                    assert (await call(session, "paid", {"text": "x"})).structured_content == {"n": 2}
                    # Charged from the prepaid credit: no tip alongside it; prepay tops up
                    # again, the one payment this bridge started (decided before the result).
                    funding = bridge._proxies[BOT].funding
                    assert funding is not None
                    assert funding.started == 1
                    await until(lambda: len(bridge.spend_log().entries) == 3)
                    await until(lambda: bridge.spend_log().entries[-1].status == "paid")
                    entries = bridge.spend_log().entries
                    assert len(env.payer.calls) == 3
                    assert [e.to_dict().get("prepay", False) for e in entries] == [False, True, True]
            finally:
                await bridge.close()
            assert await env.harness.balance(CLIENT) == 500
            assert env.executions == {"paid": 2}


async def test_two_calls_do_not_both_wait_for_one_prepayment(tmp_path: Path) -> None:
    """Calls arriving while a prepayment is on its way: the prepayment covers
    one of them, which waits for it; the second waits at the bridge for the
    prepayment's confirmation (one payment to a bot at a time) and then pays
    for itself, instead of being held by the bot until its hold runs out."""

    async def slow(payee: str, atoms: int) -> None:
        await anyio.sleep(0.5)
        await env.payer.credit(payee, atoms)

    settings = fixture_settings(prepay_bots=(BOT,))
    with anyio.fail_after(20):  # the bot's hold is 10 minutes: a stall fails the test
        async with bridge_env(tmp_path, settings=settings) as env, env.session() as session:
            env.harness.config.hold_seconds = 600
            assert (await call(session, "paid", {"text": "x"})).structured_content == {"n": 1}
            env.payer.behaviour = slow
            await until(lambda: len(env.payer.calls) == 2)  # the prepayment, under way
            results: list[Any] = []
            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    tg.start_soon(lambda: _append(results, call(session, "paid", {"text": "x"})))
            assert sorted(r.structured_content["n"] for r in results) == [2, 3]
            env.payer.behaviour = None
            await until(lambda: all(e["status"] == "paid" for e in spend(env)))
            balance = await env.harness.balance(CLIENT)
            assert sum(a for _, a in env.payer.calls) == 3 * 500 + balance
            assert env.executions == {"paid": 3}


async def test_a_denied_prepayment_lets_the_waiting_call_ask_for_its_own(tmp_path: Path) -> None:
    """Approval mode: a call that waits for a proposed prepayment the user
    then denies does not fail with "payment denied by the user"; it is
    offered its own payment."""
    settings = fixture_settings(prepay_bots=(BOT,), mode="approval")
    with anyio.fail_after(30):
        async with (
            bridge_env(tmp_path, settings=settings, auto_clock=False) as env,
            env.session() as session,
        ):
            results: list[Any] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: _append(results, call(session, "paid", {"text": "x"})))
                await until(lambda: len(env.bridge.pending_payments()) == 1)
                env.bridge.resolve_payment(env.bridge.pending_payments()[0].id, True)
            assert results[0].structured_content == {"n": 1}
            await until(lambda: len(env.bridge.pending_payments()) == 1)
            (prepay,) = env.bridge.pending_payments()
            assert prepay.tool == "paid (prepayment)"
            held = env.harness.holds
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: _append(results, call(session, "paid", {"text": "x"})))
                # The call is sent, and held by the bot for the prepayment.
                await until(lambda: env.harness.holds == held + 1)
                env.bridge.resolve_payment(prepay.id, False)
                await until(lambda: any(p.tool == "paid" for p in env.bridge.pending_payments()))
                (own,) = [p for p in env.bridge.pending_payments() if p.tool == "paid"]
                env.bridge.resolve_payment(own.id, True)
            assert results[1].structured_content == {"n": 2}
            assert len(env.payer.calls) == 2
            assert env.executions == {"paid": 2}
            assert await env.harness.balance(CLIENT) == 0


async def _append(results: list[Any], pending: Any) -> None:
    results.append(await pending)
