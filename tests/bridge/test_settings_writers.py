"""Changes of the bridge's settings compose (BRIDGE.md §Settings): every
writer (an approved add-bot request, the admin API's settings change, a
reload of ``mcpclient.json``) is a read-modify-write of the settings current
when it holds the bridge's one settings lock, so changes made at the same
moment end as if made one after the other, in memory and in the file.

The regression tests hold that lock while two writers arrive through the
admin HTTP API, so both have asked before either commits (the same moment);
the property runs random mixes of writers concurrently and checks the end
state against every serial order of them: an approval (``allow``), ``brmcp-bridge add``'s
delta (``add``), a change of one key through the admin API (``set``) and a
reload."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brmcp.bridge import Bridge, BridgeConfig, ManualClock, Settings
from brmcp.bridge.base import SETTINGS_FILE, load_settings
from tests.kit import until
from tests.kit.bridge import BOT, START, TOKEN, bridge_env, fixture_settings


def huid(tag: str) -> str:
    """A 64-hex test uid of its own."""
    return hashlib.sha256(tag.encode()).hexdigest()


P1 = huid("provider 1")
P2 = huid("provider 2")


def _admin(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- the two scenarios through the admin HTTP API ------------------------------------


async def _park(bridge: Bridge, tg: anyio.abc.TaskGroup, uid: str) -> str:
    """An agent's add-bot request for ``uid`` parked; answers its id."""

    async def ask() -> None:
        await bridge.bot_requests.request(uid, reason="wants it")

    tg.start_soon(ask)
    await until(lambda: any(r.uid == uid for r in bridge.bot_requests.pending()))
    return next(r.id for r in bridge.bot_requests.pending() if r.uid == uid)


async def _at_once(bridge: Bridge, writers: list[Callable[[], Any]]) -> list[Any]:
    """Run ``writers`` so that every one has started before any commits: the
    settings lock is held until all of them wait on it (or have finished
    reading, on a writer that reads before the lock)."""
    answers: list[Any] = [None] * len(writers)
    lock = bridge._commit_lock

    async def run(n: int) -> None:
        answers[n] = await writers[n]()

    async with anyio.create_task_group() as tg:
        await lock.acquire()
        try:
            for n in range(len(writers)):
                tg.start_soon(run, n)
            await until(lambda: lock.statistics().tasks_waiting == len(writers))
        finally:
            lock.release()
    return answers


async def test_two_approvals_at_the_same_moment_both_stay_allowed(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with (
            bridge_env(tmp_path, auto_clock=False) as env,
            env.http() as http,
            anyio.create_task_group() as tg,
        ):
            bridge = env.bridge
            ids = [await _park(bridge, tg, P1), await _park(bridge, tg, P2)]
            answers = await _at_once(
                bridge,
                [
                    lambda rid=rid: http.post(
                        f"/admin/bot-requests/{rid}",
                        json={"approve": True},
                        headers=_admin(bridge.admin_token),
                    )
                    for rid in ids
                ],
            )
            assert [a.status_code for a in answers] == [200, 200]
            assert [a.json()["outcome"] for a in answers] == ["approved", "approved"]
            assert set(bridge.settings.allowed_bots or ()) == {BOT, P1, P2}
            on_disk = load_settings(env.data_dir / SETTINGS_FILE)
            assert set(on_disk.allowed_bots or ()) == {BOT, P1, P2}
            assert on_disk == bridge.settings
            tg.cancel_scope.cancel()


async def test_an_approval_and_a_cap_change_at_the_same_moment_both_hold(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        initial = fixture_settings(per_call_cap_atoms=700)
        async with (
            bridge_env(tmp_path, settings=initial, auto_clock=False) as env,
            env.http() as http,
            anyio.create_task_group() as tg,
        ):
            bridge = env.bridge
            rid = await _park(bridge, tg, P1)
            headers = _admin(bridge.admin_token)
            answers = await _at_once(
                bridge,
                [
                    lambda: http.post(f"/admin/bot-requests/{rid}", json={"approve": True}, headers=headers),
                    lambda: http.put("/admin/settings", json={"per_call_cap_atoms": 100}, headers=headers),
                ],
            )
            assert [a.status_code for a in answers] == [200, 200]
            assert answers[0].json()["outcome"] == "approved"
            for shown in (bridge.settings, load_settings(env.data_dir / SETTINGS_FILE)):
                assert shown.per_call_cap_atoms == 100
                assert set(shown.allowed_bots or ()) == {BOT, P1}
                assert shown.replace(per_call_cap_atoms=700, allowed_bots=(BOT,)) == initial
            tg.cancel_scope.cancel()


# -- the property: concurrent writers end as some serial order of them -----------------------

UIDS = [huid(f"candidate {n}") for n in range(4)]
_op = st.one_of(
    st.tuples(st.just("allow"), st.integers(0, len(UIDS) - 1)),
    st.tuples(st.just("add"), st.integers(0, len(UIDS) - 1)),
    st.tuples(
        st.just("set"), st.sampled_from(["per_call_cap_atoms", "per_day_cap_atoms"]), st.integers(0, 9)
    ),
    st.tuples(st.just("set"), st.just("approval_timeout_secs"), st.integers(1, 9)),
    st.tuples(st.just("reload")),
)


class _Sender:
    async def send_pm(self, peer_uid: str, text: str) -> None:
        raise AssertionError("nothing is sent")


class _NoPayer:
    async def pay(self, payee_uid: str, atoms: int) -> None:
        raise AssertionError(f"paid {atoms} atoms to {payee_uid}")


def _serially(start: Settings, ops: tuple[tuple[Any, ...], ...]) -> Settings:
    """``ops`` applied one after the other (a reload reads what the last
    change wrote, so it changes nothing)."""
    current = start
    for op in ops:
        if op[0] in ("allow", "add"):
            allowed = current.allowed_bots or ()
            if UIDS[op[1]] not in allowed:
                current = current.replace(allowed_bots=(*allowed, UIDS[op[1]]))
        elif op[0] == "set":
            current = current.replace(**{op[1]: op[2] * 100})
    return current


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(st.tuples(_op, st.integers(0, 4)), min_size=2, max_size=6),
)
def test_concurrent_changes_end_as_some_serial_order(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[tuple[Any, ...], int]]
) -> None:
    data_dir = tmp_path_factory.mktemp("bridge")
    initial = Settings(
        enabled=True,
        token=TOKEN,
        mode="approval",
        per_call_cap_atoms=700,
        per_day_cap_atoms=9_000,
        allowed_bots=(BOT,),
    )
    (data_dir / SETTINGS_FILE).write_text(initial.to_json())

    async def scenario() -> None:
        config = BridgeConfig(data_dir=data_dir, sender=_Sender(), payer=_NoPayer(), clock=ManualClock(START))
        async with (
            Bridge(config) as bridge,
            httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=bridge.asgi_app), base_url="http://127.0.0.1"
            ) as http,
        ):
            start = bridge.settings
            headers = _admin(bridge.admin_token)

            async def run(op: tuple[Any, ...], delay: int) -> None:
                for _ in range(delay):
                    await anyio.lowlevel.checkpoint()
                if op[0] == "allow":
                    await bridge.allow_bot(UIDS[op[1]])
                elif op[0] == "add":
                    # What ``brmcp-bridge add`` sends for a uid not yet allowed.
                    answer = await http.put(
                        "/admin/settings", json={"add_allowed_bots": [UIDS[op[1]]]}, headers=headers
                    )
                    assert answer.status_code == 200, answer.text
                elif op[0] == "set":
                    answer = await http.put("/admin/settings", json={op[1]: op[2] * 100}, headers=headers)
                    assert answer.status_code == 200, answer.text
                else:
                    await bridge.reload_settings()

            async with anyio.create_task_group() as tg:
                for op, delay in ops:
                    tg.start_soon(run, op, delay)
            serial = {_serially(start, order) for order in itertools.permutations([op for op, _ in ops])}
            assert bridge.settings in serial, (bridge.settings, ops)
            assert load_settings(data_dir / SETTINGS_FILE) == bridge.settings

    anyio.run(scenario)
