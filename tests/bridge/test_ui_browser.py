"""The approvals page in a real headless Chromium (Debian's chromium through
Selenium and chromedriver): log in with the one-time link that
``brmcp-bridge ui`` prints, see a payment appear without a reload, approve
one and deny another in one click each, and check that the agent's call
completes (paid once, charged once) or is refused, that the page follows
without a reload, and that the page needs the admin-token login; a pending
payment shows its call's arguments as text, its time left counting down and
its expiry, a decision is confirmed on the page, and an approval that comes
too late says so. Skips with the reason where no browser can be had."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from brmcp.bridge.cli import main as bridge_main
from brmcp.bridge.daemon._runtime import RUNTIME_FILE, process_started
from tests.kit.bridge import BOT, CLIENT, Env, bridge_env, call, fixture_settings, joined, until
from tests.kit.ui import chromium_driver

pytestmark = pytest.mark.browser

WAIT = 20.0


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Any]:
    yield from chromium_driver(tmp_path)


def _write_runtime(env: Env) -> None:
    """Make the CLI find this in-process bridge as if it were the daemon."""
    pid = os.getpid()
    record = {
        "pid": pid,
        "started": process_started(pid),
        "url": env.base_url,
        "listen": "",
        "sighup": False,
    }
    (env.data_dir / RUNTIME_FILE).write_text(json.dumps(record))


async def _login_link(env: Env, capsys: pytest.CaptureFixture[str]) -> str:
    _write_runtime(env)
    code = await anyio.to_thread.run_sync(bridge_main, ["--datadir", str(env.data_dir), "ui"])
    out = capsys.readouterr()
    assert code == 0, out.err
    url = out.out.strip()
    assert url.startswith(f"{env.base_url}/ui/login?ticket=")
    assert "works once" in out.err
    return url


async def _browser(fn: Any, *args: Any) -> Any:
    return await anyio.to_thread.run_sync(fn, *args)


def _wait_for(driver: Any, predicate: Any) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(predicate)


def _pending_rows(driver: Any) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, "#approvals tr.pending"))


def _click(driver: Any, payment_id: str, verb: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f'#approvals button.{verb}[data-id="{payment_id}"]').click()


def _text(driver: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.ID, element_id).text)


async def test_approve_and_deny_from_the_page(
    tmp_path: Path, driver: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = fixture_settings(mode="approval")
    with anyio.fail_after(120):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env:
            link = await _login_link(env, capsys)
            await _browser(driver.get, link)
            await _browser(_wait_for, driver, lambda d: d.current_url == f"{env.base_url}/ui/")
            assert "No payments waiting for approval" in await _browser(_text, driver, "approvals")
            # A marker that a reload would wipe: every update below must keep it.
            await _browser(driver.execute_script, "window.__noReload = 42;")
            await _browser(_wait_for, driver, lambda d: _text(d, "status") == "live")

            async with env.session() as session:
                results: list[Any] = []
                async with anyio.create_task_group() as tg:

                    async def paid_call() -> None:
                        results.append(await call(session, "paid", {"text": "x", "count": 1}))

                    tg.start_soon(paid_call)
                    await until(lambda: len(env.bridge.pending_payments()) == 1, WAIT)
                    (pending,) = env.bridge.pending_payments()
                    await _browser(_wait_for, driver, lambda d: len(_pending_rows(d)) == 1)
                    row = (await _browser(_pending_rows, driver))[0].text
                    assert "paid" in row
                    assert "500" in row
                    assert await _browser(driver.execute_script, "return window.__noReload;") == 42
                    await _browser(_click, driver, pending.id, "approve")
                (approved,) = results
                assert not approved.is_error
                assert approved.structured_content == {"n": 1}
                assert env.payer.calls == [(BOT, 500)]
                assert env.executions == {"paid": 1}
                assert await env.harness.balance(CLIENT) == 0
                # The page follows: no pending row, the payment in the spend log.
                await _browser(_wait_for, driver, lambda d: not _pending_rows(d))
                await _browser(_wait_for, driver, lambda d: "paid" in _text(d, "spend"))
                spend = await _browser(_text, driver, "spend")
                assert "500 of 100,000 atoms" in spend
                assert "0" in await _browser(_text, driver, "balances")

                results.clear()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(paid_call)
                    await until(lambda: len(env.bridge.pending_payments()) == 1, WAIT)
                    (second,) = env.bridge.pending_payments()
                    await _browser(_wait_for, driver, lambda d: len(_pending_rows(d)) == 1)
                    await _browser(_click, driver, second.id, "deny")
                (denied,) = results
                assert denied.is_error
                assert "payment not made: payment denied by the user" in joined(denied)
                assert env.payer.calls == [(BOT, 500)]  # nothing more was paid
                assert env.executions == {"paid": 1}
                await _browser(_wait_for, driver, lambda d: not _pending_rows(d))
            assert await _browser(driver.execute_script, "return window.__noReload;") == 42
            assert [e.status for e in env.bridge.spend_log().entries] == ["paid"]


async def test_the_page_needs_the_admin_login(
    tmp_path: Path, driver: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with anyio.fail_after(60):
        async with bridge_env(tmp_path) as env:
            await _browser(driver.get, f"{env.base_url}/ui/")
            body = await _browser(_text, driver, "login-needed")
            assert "not logged in" in body
            assert f"brmcp-bridge --datadir {env.data_dir} ui" in body
            link = await _login_link(env, capsys)
            await _browser(driver.get, link)
            await _browser(_wait_for, driver, lambda d: d.current_url == f"{env.base_url}/ui/")
            assert "Waiting for approval" in await _browser(lambda: driver.page_source)
            # The link worked once: in a fresh browser session it is refused.
            await _browser(driver.delete_all_cookies)
            await _browser(driver.get, link)
            assert "unknown, used or expired" in await _browser(_text, driver, "login-needed")
            await _browser(driver.get, f"{env.base_url}/ui/")
            assert "not logged in" in await _browser(_text, driver, "login-needed")


def _texts(driver: Any, selector: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [str(e.text) for e in driver.find_elements(By.CSS_SELECTOR, selector)]


def _notice(driver: Any) -> tuple[str, str]:
    from selenium.webdriver.common.by import By

    element = driver.find_element(By.ID, "notice")
    return str(element.text), str(element.get_attribute("class"))


async def test_the_page_shows_arguments_time_left_and_what_became_of_each_decision(
    tmp_path: Path, driver: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = '<img src=x onerror="window.__xss=1">'
    settings = fixture_settings(mode="approval")
    prefix = f"{BOT[:16]}…"
    with anyio.fail_after(120):
        async with bridge_env(tmp_path, settings=settings, auto_clock=False) as env:
            link = await _login_link(env, capsys)
            await _browser(driver.get, link)
            await _browser(_wait_for, driver, lambda d: _text(d, "status") == "live")
            async with env.session() as session:
                results: list[Any] = []

                async def paid_call() -> None:
                    results.append(await call(session, "paid", {"text": hostile, "count": 1}))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(paid_call)
                    await until(lambda: len(env.bridge.pending_payments()) == 1, WAIT)
                    (pending,) = env.bridge.pending_payments()
                    await _browser(_wait_for, driver, lambda d: len(_pending_rows(d)) == 1)
                    # The agent's arguments, as text: no element was made of them.
                    (args,) = await _browser(_texts, driver, "#approvals pre.args")
                    assert '"text": "<img src=x onerror=\\"window.__xss=1\\">"' in args
                    assert not await _browser(_texts, driver, "#approvals img")
                    assert await _browser(_texts, driver, "#approvals td.bot") == [prefix]
                    (expires,) = await _browser(_texts, driver, "#approvals .expires")
                    assert expires == "refused at 2027-01-15 08:02:00 UTC"
                    # The countdown runs in the page (the bridge clock stands still here).
                    await _browser(
                        _wait_for, driver, lambda d: _texts(d, "#approvals .countdown") == ["1m 59s left"]
                    )
                    await _browser(_click, driver, pending.id, "approve")
                    await _browser(_wait_for, driver, lambda d: _notice(d)[0].startswith("Approved"))
                (approved,) = results
                assert not approved.is_error
                text, klass = await _browser(_notice, driver)
                assert text == (
                    f"Approved: 500 atoms to {prefix} for tool paid; the payment is being made (see Spending)"
                )
                assert "ok" in klass.split()
                await _browser(_wait_for, driver, lambda d: "Approved: 500 atoms" in _text(d, "decisions"))
                assert await _browser(driver.execute_script, "return window.__xss;") is None

                # A row left on screen after its time ran out: the approval is refused, and says why.
                results.clear()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(paid_call)
                    await until(lambda: len(env.bridge.pending_payments()) == 1, WAIT)
                    (late,) = env.bridge.pending_payments()
                    await _browser(_wait_for, driver, lambda d: len(_pending_rows(d)) == 1)
                    await _browser(
                        driver.execute_script,
                        "window.__stale = document.getElementById('approvals').innerHTML;",
                    )
                    env.clock.advance(120)
                (timed_out,) = results
                assert "approval timed out after 2m0s" in joined(timed_out)
                await _browser(_wait_for, driver, lambda d: not _pending_rows(d))
                await _browser(_wait_for, driver, lambda d: "Timed out: 500 atoms" in _text(d, "decisions"))
                await _browser(
                    driver.execute_script,
                    "document.getElementById('approvals').innerHTML = window.__stale;",
                )
                await _browser(_click, driver, late.id, "approve")
                await _browser(_wait_for, driver, lambda d: _notice(d)[0].startswith("too late"))
                text, klass = await _browser(_notice, driver)
                assert text == (
                    f"too late: payment {late.id} timed out after 2m0s without a decision; nothing was paid"
                    " and the agent was told the approval timed out"
                )
                assert "late" in klass.split()
            assert env.payer.calls == [(BOT, 500)]
