"""Abandonment of any kind withdraws a payment parked for approval
(BRIDGE.md §Resumability, §Failures, §Security model): the agent's TCP reset,
its FIN, its SDK cancel (``notifications/cancelled``), its HTTP session
DELETE, and the bridge closing. Each time the payment leaves the approval
queue, nothing is paid or run, and a later approval is refused with
``payment <id> was withdrawn: the agent went away; nothing was paid`` (admin
API 409, the approvals page, the CLI). Within the resume grace an approval
waits: it is paid only if the agent resumes the stream."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import pytest

import brmcp.bridge.agent._http as bridge_http
from brmcp.bridge.links import AgentCall
from brmcp.bridge.pay import PendingPayment, withdrawn_text
from tests.kit.bridge import BOT, CLIENT, INIT, TOKEN, Env, auth, bridge_env, call, fixture_settings, until

APPROVAL = fixture_settings(mode="approval", approval_timeout_secs=600)
#: The resume grace plus slack for the expiry task (wall time, BRIDGE.md §Resumability).
GRACE_LIMIT = bridge_http.RESUME_GRACE + 10


def _call(request_id: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "paid", "arguments": {"text": "x"}},
    }


async def _open(http: httpx2.AsyncClient) -> dict[str, str]:
    """An initialized agent HTTP session; its request headers."""
    response = await http.post(f"/mcp/{BOT}", json=INIT, headers=auth())
    assert response.status_code == 200
    headers = {
        **auth(),
        "mcp-session-id": response.headers["mcp-session-id"],
        "mcp-protocol-version": "2025-11-25",
    }
    notified = await http.post(
        f"/mcp/{BOT}", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
    )
    assert notified.status_code == 202
    return headers


def _raw_request(body: dict[str, Any], headers: dict[str, str], bot: str = BOT) -> bytes:
    data = json.dumps(body).encode()
    lines = [f"POST /mcp/{bot} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


@contextlib.contextmanager
def _raw_agent(
    address: tuple[str, int] | None, body: dict[str, Any], headers: dict[str, str], bot: str = BOT
) -> Iterator[socket.socket]:
    """A plain TCP connection to the bridge at ``address`` that sent
    ``body`` to bot ``bot`` and reads nothing."""
    assert address is not None
    sock = socket.create_connection(address, timeout=10)
    try:
        sock.sendall(_raw_request(body, headers, bot))
        yield sock
    finally:
        sock.close()


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the kernel sends a TCP RST, not a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _finish(sock: socket.socket) -> None:
    """Close cleanly: a FIN, after reading whatever the bridge sent (unread
    bytes would make the kernel send a RST instead)."""
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(GRACE_LIMIT)
    while sock.recv(65536):
        pass
    sock.close()


async def _parked(env: Env) -> PendingPayment:
    await until(lambda: len(env.bridge.pending_payments()) == 1)
    (payment,) = env.bridge.pending_payments()
    assert (payment.bot, payment.tool, payment.atoms) == (BOT, "paid", 500)
    return payment


def _calls(env: Env) -> list[AgentCall]:
    link = env.bridge.link(BOT)
    assert link is not None
    return list(link.relay._calls.values())


async def _nothing_paid(env: Env, payment: PendingPayment) -> None:
    """The books after a withdrawal: no payer.pay, no spend entry, no
    execution, nothing credited or charged at the bot; and the approval
    queue refuses a decision for the payment with the withdrawal text."""
    assert env.bridge.pending_payments() == []
    assert env.payer.calls == []
    assert env.bridge.spend_log().entries == ()
    assert env.executions == {}
    assert await env.harness.balance(CLIENT) == 0
    assert await env.harness.statement(CLIENT) == []
    assert not env.bridge.resolve_payment(payment.id, True)
    assert env.bridge._settler.approvals.withdrawn(payment.id) == withdrawn_text(payment.id)


async def _approve_refused(http: httpx2.AsyncClient, env: Env, payment: PendingPayment) -> None:
    admin = {"Authorization": f"Bearer {env.bridge.admin_token}"}
    refused = await http.post(f"/admin/approvals/{payment.id}/approve", headers=admin)
    assert refused.status_code == 409
    assert refused.json() == {
        "error": f"payment {payment.id} was withdrawn: the agent went away; nothing was paid"
    }
    assert env.payer.calls == []


async def test_a_tcp_reset_withdraws_the_parked_payment(tmp_path: Path) -> None:
    async with bridge_env(tmp_path, settings=APPROVAL, auto_clock=False) as env, env.http() as http:
        headers = await _open(http)
        with anyio.fail_after(30), _raw_agent(env.bridge.listen_address, _call(7), headers) as sock:
            payment = await _parked(env)
            _reset(sock)
            # Detached at once; gone (and withdrawn) when the grace runs out.
            await until(lambda: all(c.detached for c in _calls(env)), GRACE_LIMIT)
            await until(lambda: not env.bridge.pending_payments(), GRACE_LIMIT)
        await _nothing_paid(env, payment)
        await _approve_refused(http, env, payment)


async def test_a_fin_withdraws_the_parked_payment_and_the_page_says_so(tmp_path: Path) -> None:
    from tests.bridge.test_ui import _login

    async with bridge_env(tmp_path, settings=APPROVAL, auto_clock=False) as env, env.http() as http:
        headers = await _open(http)
        with anyio.fail_after(30), _raw_agent(env.bridge.listen_address, _call(8), headers) as sock:
            payment = await _parked(env)
            await anyio.to_thread.run_sync(_finish, sock)
            await until(lambda: not env.bridge.pending_payments(), GRACE_LIMIT)
        await _nothing_paid(env, payment)
        csrf = await _login(env, http)
        path = f"/ui/approvals/{payment.id}/approve"
        as_json = await http.post(path, headers={"X-CSRF-Token": csrf, "Accept": "application/json"})
        assert as_json.status_code == 409
        assert as_json.json() == {"error": withdrawn_text(payment.id)}
        as_form = await http.post(path, data={"csrf": csrf})
        assert as_form.status_code == 409
        assert withdrawn_text(payment.id) in as_form.text
        assert env.payer.calls == []


async def test_an_sdk_cancel_withdraws_the_parked_payment_at_once(tmp_path: Path) -> None:
    async with bridge_env(tmp_path, settings=APPROVAL, auto_clock=False) as env, env.http() as http:
        with anyio.fail_after(30):
            async with env.session() as session, anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def calling() -> None:
                    with scope:
                        await call(session, "paid", {"text": "x"})

                tg.start_soon(calling)
                payment = await _parked(env)
                scope.cancel()  # the SDK sends notifications/cancelled
                await until(lambda: not env.bridge.pending_payments())
                # No resume grace: a cancelled call has nobody to answer (its
                # entry goes right after the withdrawal; the clock never moves).
                await until(lambda: not _calls(env))
            await _nothing_paid(env, payment)
            await _approve_refused(http, env, payment)


async def test_a_session_delete_withdraws_the_parked_payment_at_once(tmp_path: Path) -> None:
    async with bridge_env(tmp_path, settings=APPROVAL, auto_clock=False) as env, env.http() as http:
        headers = await _open(http)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def calling() -> None:
                    with contextlib.suppress(httpx2.HTTPError):
                        async with http.stream("POST", f"/mcp/{BOT}", json=_call(9), headers=headers) as r:
                            async for _ in r.aiter_bytes():
                                pass

                tg.start_soon(calling)
                payment = await _parked(env)
                ended = await http.delete(f"/mcp/{BOT}", headers=headers)
                assert ended.status_code == 200
                await until(lambda: not env.bridge.pending_payments())
                assert all(c.gone.is_set() for c in _calls(env))
            await _nothing_paid(env, payment)
            await _approve_refused(http, env, payment)


async def test_closing_the_bridge_withdraws_the_parked_payment(tmp_path: Path) -> None:
    """``Bridge.__aexit__`` (a daemon stop) runs in the task that entered the
    bridge, with the agent's request in flight in another."""
    with anyio.fail_after(30):
        async with (
            anyio.create_task_group() as tg,
            bridge_env(tmp_path, settings=APPROVAL, auto_clock=False) as env,
            env.http() as http,
        ):
            headers = await _open(http)
            done = anyio.Event()

            async def calling() -> None:
                try:
                    with contextlib.suppress(httpx2.HTTPError):
                        async with http.stream(
                            "POST", f"/mcp/{BOT}", json=_call(10), headers=headers
                        ) as response:
                            async for _ in response.aiter_bytes():
                                pass
                finally:
                    done.set()

            tg.start_soon(calling)
            payment = await _parked(env)
            await env.bridge.__aexit__(None, None, None)
            assert env.bridge.closed
            await done.wait()
            await _nothing_paid(env, payment)


# -- an approval within the resume grace ---------------------------------------------------


@contextlib.asynccontextmanager
async def _dropped_with_priming(
    env: Env, http: httpx2.AsyncClient, headers: dict[str, str], request_id: int
) -> AsyncIterator[str]:
    """POST a paid call, read its priming event once the stream is released,
    then drop the connection; yields the priming event's id."""
    primed = ""
    async with http.stream("POST", f"/mcp/{BOT}", json=_call(request_id), headers=headers) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("id:"):
                primed = line[3:].strip()
                break
    assert primed
    await until(lambda: bool(_calls(env)) and all(c.detached for c in _calls(env)))
    yield primed


@pytest.fixture
def quick_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream a held call's SSE at once (priming event first) instead of after 5 s."""
    monkeypatch.setattr(bridge_http, "MAX_HOLD_SECONDS", 0.05)


@pytest.mark.usefixtures("quick_release")
async def test_an_approval_within_the_grace_waits_and_is_withdrawn_if_the_agent_does_not_return(
    tmp_path: Path,
) -> None:
    async with bridge_env(tmp_path, settings=APPROVAL, auto_clock=False) as env, env.http() as http:
        headers = await _open(http)
        with anyio.fail_after(30):
            payment_id = ""
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    nonlocal payment_id
                    payment_id = (await _parked(env)).id

                tg.start_soon(watch)
                async with _dropped_with_priming(env, http, headers, 11):
                    await until(lambda: bool(payment_id))
                    # Accepted while the connection is detached, but not paid.
                    assert env.bridge.resolve_payment(payment_id, True)
                    (detached,) = _calls(env)
                    assert detached.detached
                    assert not detached.gone.is_set()
                    assert env.payer.calls == []
                    # The grace runs out: the approved payment is withdrawn unpaid.
                    await detached.gone.wait()
                    await until(lambda: not _calls(env))
        assert env.payer.calls == []
        assert env.bridge.spend_log().entries == ()
        assert env.executions == {}
        assert await env.harness.balance(CLIENT) == 0
        admin = {"Authorization": f"Bearer {env.bridge.admin_token}"}
        again = await http.post(f"/admin/approvals/{payment_id}/approve", headers=admin)
        assert (again.status_code, again.json()) == (409, {"error": withdrawn_text(payment_id)})


@pytest.mark.usefixtures("quick_release")
async def test_an_approval_within_the_grace_is_paid_once_the_agent_resumes(tmp_path: Path) -> None:
    async with bridge_env(tmp_path, settings=APPROVAL, auto_clock=False) as env, env.http() as http:
        headers = await _open(http)
        with anyio.fail_after(30):
            payment_id = ""
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    nonlocal payment_id
                    payment_id = (await _parked(env)).id

                tg.start_soon(watch)
                async with _dropped_with_priming(env, http, headers, 12) as primed:
                    await until(lambda: bool(payment_id))
                    assert env.bridge.resolve_payment(payment_id, True)
                    await until(lambda: not env.bridge.pending_payments())
                    assert env.payer.calls == []  # held while detached
                    resume = {**headers, "last-event-id": primed, "accept": "text/event-stream"}
                    answer: dict[str, Any] = {}
                    async with http.stream("GET", f"/mcp/{BOT}", headers=resume) as response:
                        assert response.status_code == 200
                        async for line in response.aiter_lines():
                            if line.startswith("data:") and line[5:].strip():
                                answer = json.loads(line[5:])
                                if answer.get("id") == 12:
                                    break
        assert answer["result"]["structuredContent"] == {"n": 1}
        # The books: one pay, one paid entry, one execution, charged once.
        assert env.payer.calls == [(BOT, 500)]
        assert [(e.atoms, e.status) for e in env.bridge.spend_log().entries] == [(500, "paid")]
        assert env.executions == {"paid": 1}
        assert await env.harness.balance(CLIENT) == 0


async def test_the_cli_refuses_to_approve_a_withdrawn_payment(tmp_path: Path) -> None:
    """Through the daemon on the fake brclient: the agent resets its
    connection while its payment is parked; ``approvals approve ID`` prints
    the withdrawal on one line and exits 1; no TipUser was sent."""
    from brmcp.bridge import BridgeDaemon, SystemClock
    from tests.bridge.test_daemon import bridge_settings, cli, prepare_bridge_dir
    from tests.kit.clientrpc import FAST
    from tests.kit.serve import serve_network

    with anyio.fail_after(120):
        async with serve_network(tmp_path) as env:
            bot, alice = env.bot, env.alice
            datadir = tmp_path / "bridge"
            settings = bridge_settings(bot.uid, mode="approval", approval_timeout_secs=600)
            prepare_bridge_dir(datadir, alice, settings)
            daemon = BridgeDaemon.from_datadir(
                datadir, listen="127.0.0.1:0", clock=SystemClock(), client_options=FAST
            )
            async with anyio.create_task_group() as daemon_tg:
                await daemon_tg.start(daemon.run)
                await daemon.client.wait_connected()
                base = daemon.base_url
                async with httpx2.AsyncClient(base_url=base, timeout=30) as http:
                    init = await http.post(f"/mcp/{bot.uid}", json=INIT, headers=_daemon_auth())
                    headers = {
                        **_daemon_auth(),
                        "mcp-session-id": init.headers["mcp-session-id"],
                        "mcp-protocol-version": "2025-11-25",
                    }
                    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                    assert (await http.post(f"/mcp/{bot.uid}", json=note, headers=headers)).status_code == 202
                    body = {**_call(13), "params": {"name": "fortune", "arguments": {}}}
                    with _raw_agent(daemon.bridge.listen_address, body, headers, bot.uid) as sock:
                        await until(lambda: len(daemon.bridge.pending_payments()) == 1, 60)
                        (payment,) = daemon.bridge.pending_payments()
                        _reset(sock)
                        await until(lambda: not daemon.bridge.pending_payments(), GRACE_LIMIT)
                status, out, err = await cli("--datadir", str(datadir), "approvals", "approve", payment.id)
                assert (status, out) == (1, "")
                assert err == f"brmcp-bridge: {withdrawn_text(payment.id)}\n"
                assert daemon.bridge.spend_log().entries == ()
                daemon_tg.cancel_scope.cancel()
            assert [m for m, _ in alice.requests if m == "PaymentsService.TipUser"] == []
            assert await env.app.harness.statement(alice.uid) == []


def _daemon_auth() -> dict[str, str]:
    from tests.bridge.test_daemon import TOKEN as DAEMON_TOKEN

    assert DAEMON_TOKEN != TOKEN
    return {
        "Authorization": f"Bearer {DAEMON_TOKEN}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
