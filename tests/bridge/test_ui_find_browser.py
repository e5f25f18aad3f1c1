"""The approvals page's "Find tools" view and the agents' add-bot requests in
a real headless Chromium (Debian's chromium through Selenium and
chromedriver): a search shows the hits of an honest and a hostile directory
(markup in what the hostile one says is shown as text, never run) and the
directory that failed; searching adds nothing, an Add opens a confirmation
with the full uid and the caps, Cancel adds nothing, and Confirm adds
exactly that uid (after the introduction and the key exchange) with the cap
typed in; an agent's pending request to add a bot is approved and another
denied with the page's buttons. Skips with the reason where no browser can
be had."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx2
import pytest

from brmcp.bridge.find import MAX_TEXT_CHARS
from tests.bridge.test_discovery import (
    BRIDGE_NOW,
    DIR_A,
    HOSTILE,
    P1,
    STRANGER,
    Answer,
    World,
    bridge_settings,
    hostile_dir,
    huid,
    world,
)
from tests.kit import BOT, until
from tests.kit.bridge import bridge_env, fixture_settings
from tests.kit.ui import chromium_driver

pytestmark = pytest.mark.browser

WAIT = 20.0
XSS = '<img src=x onerror="window.__xss=1">'
#: A provider only the hostile directory claims to list.
LIAR = huid("the hostile directory's provider")


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Any]:
    yield from chromium_driver(tmp_path)


async def _browser(fn: Any, *args: Any) -> Any:
    return await anyio.to_thread.run_sync(fn, *args)


def _wait_for(driver: Any, predicate: Any) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(predicate)


def _find(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def _texts(driver: Any, selector: str) -> list[str]:
    """The texts of the elements ``selector`` matches, read again when a live
    update replaced them meanwhile."""
    from selenium.common.exceptions import StaleElementReferenceException

    def read(d: Any) -> tuple[list[str]] | None:
        try:
            return ([str(e.text) for e in _find(d, selector)],)
        except StaleElementReferenceException:
            return None

    (texts,) = _wait_for(driver, read)
    return list(texts)


def _click(driver: Any, selector: str) -> None:
    """Click the first element ``selector`` matches (again when a live
    update replaced it before the click landed)."""
    from selenium.common.exceptions import StaleElementReferenceException

    def click(d: Any) -> bool:
        try:
            _find(d, selector)[0].click()
        except (StaleElementReferenceException, IndexError):
            return False
        return True

    _wait_for(driver, click)


def _type(driver: Any, selector: str, text: str) -> None:
    element = _find(driver, selector)[0]
    element.clear()
    element.send_keys(text)


async def _log_in(driver: Any, base_url: str, admin_token: str) -> None:
    """Open the page with a one-time link minted with the admin token (what
    ``brmcp-bridge ui`` prints) and wait until it is live."""
    async with httpx2.AsyncClient(base_url=base_url, timeout=30) as http:
        minted = await http.post("/admin/ui-login", headers={"Authorization": f"Bearer {admin_token}"})
    assert minted.status_code == 200
    await _browser(driver.get, minted.json()["url"])
    await _browser(_wait_for, driver, lambda d: d.current_url == f"{base_url}/ui/")
    await _browser(_wait_for, driver, lambda d: _texts(d, "#status") == ["live"])


def _allowed(w: World) -> tuple[str, ...]:
    return w.bridge.settings.allowed_bots or ()


@asynccontextmanager
async def _directories(tmp_path: Path) -> AsyncIterator[World]:
    """DIR_A (lists P1's fortune), a hostile directory whose search claims
    P1 and LIAR with markup in its texts, and STRANGER, a configured
    directory the bridge's brclient has no key exchange with (it fails)."""
    lies = {
        "hits": [
            {
                "providerUid": LIAR,
                "tool": "fortune" + XSS,
                "description": XSS + "y" * 1000,
                "priceAtoms": 1,
                "tags": ["<b>bold</b>", "luck"],
                "lastVerifiedExecution": int(BRIDGE_NOW) - 7200,
                "catalogCheckedAt": int(BRIDGE_NOW) - 120,
            },
            {"providerUid": P1, "tool": "fortune", "priceAtoms": 0, "description": "free, trust me"},
        ],
        "total": 2,
    }
    settings = bridge_settings(directories=(DIR_A, HOSTILE, STRANGER))
    async with world(tmp_path, settings=settings) as w:
        bot = hostile_dir([w.fabric], Answer(lies))
        await w.stack.enter_async_context(bot)
        w.payer.hostile[HOSTILE] = bot
        yield w


async def test_find_shows_claims_as_text_and_adds_only_on_confirm(tmp_path: Path, driver: Any) -> None:
    with anyio.fail_after(150):
        async with _directories(tmp_path) as w:
            await _log_in(driver, w.base_url, w.bridge.admin_token)
            await _browser(_type, driver, "#find-query", "fortune")
            await _browser(_click, driver, "#find-go")
            await _browser(_wait_for, driver, lambda d: len(_find(d, "#find-results .hit")) == 2)
            hits = {
                str(h.get_attribute("data-provider")): str(h.text)
                for h in await _browser(_find, driver, "#find-results .hit")
            }
            assert set(hits) == {P1, LIAR}
            # The honest listing and the hostile one's claim about the same tool, each named.
            assert "provider " + P1 in hits[P1]
            assert f"claimed by directory {DIR_A}: 500 atoms, verified by a paid call 1h ago" in hits[P1]
            assert f"claimed by directory {HOSTILE}: free, never verified by a paid call" in hits[P1]
            # Markup in what the hostile directory said is shown as text, cut, and never run.
            liar = hits[LIAR]
            assert "fortune" + XSS in liar
            assert "[<b>bold</b>, luck]" in liar
            assert f"claimed by directory {HOSTILE}: 1 atoms, verified by a paid call 2h ago" in liar
            assert "catalog checked 2m ago" in liar
            (description,) = await _browser(_texts, driver, f'.hit[data-provider="{LIAR}"] .description')
            assert description.startswith(XSS)
            assert len(description) <= MAX_TEXT_CHARS
            assert not await _browser(_find, driver, "#find-results img")
            assert not await _browser(_find, driver, "#find-results b")
            assert await _browser(driver.execute_script, "return window.__xss;") is None
            (failed,) = await _browser(_texts, driver, "#find-results .find-failed li")
            assert failed.startswith(f"directory {STRANGER} ")
            assert "KX" in failed
            # Searching added nothing; opening the confirmation and cancelling adds nothing.
            assert _allowed(w) == ()
            await _browser(_click, driver, f'.hit[data-provider="{LIAR}"] button.add')
            await _browser(_wait_for, driver, lambda d: _find(d, "#add-confirm")[0].is_displayed())
            assert await _browser(_texts, driver, "#add-uid") == [LIAR]
            (caps,) = await _browser(_texts, driver, "#add-caps")
            assert (
                caps == "Caps that will apply: per call 10,000 atoms, per day 100,000 atoms (mode autopay)."
            )
            await _browser(_click, driver, "#add-cancel")
            await _browser(_wait_for, driver, lambda d: not _find(d, "#add-confirm")[0].is_displayed())
            assert _allowed(w) == ()
            assert w.suggester.sent == []
            # Confirm adds exactly the uid shown, after the introduction and the key exchange.
            await _browser(_click, driver, f'.hit[data-provider="{P1}"] button.add')
            await _browser(_wait_for, driver, lambda d: _texts(d, "#add-uid") == [P1])
            assert _allowed(w) == ()
            await _browser(_type, driver, "#add-per-call", "2000")
            await _browser(_click, driver, "#add-yes")
            await _browser(_wait_for, driver, lambda d: _texts(d, "#add-progress")[0].startswith("Added bot"))
            (done,) = await _browser(_texts, driver, "#add-progress")
            assert done.startswith(
                f"Added bot {P1} to allowed_bots; caps for every bot: 2,000 atoms per call, "
                "100,000 atoms per day"
            )
            assert _allowed(w) == (P1,)
            assert w.bridge.settings.per_call_cap_atoms == 2000
            assert w.bridge.settings.per_day_cap_atoms == 100_000
            assert [target for _, target in w.suggester.sent] == [P1]
            assert w.payer.calls == []  # the searches were free; nothing was paid
            await _browser(_wait_for, driver, lambda d: P1 in _texts(d, "#settings")[0])


async def test_an_agents_add_bot_requests_are_approved_and_denied_with_the_buttons(
    tmp_path: Path, driver: Any
) -> None:
    wanted, unwanted = huid("wanted bot"), huid("unwanted bot")
    reason = "I need its weather tool " + XSS
    with anyio.fail_after(120):
        async with bridge_env(tmp_path, settings=fixture_settings(mode="approval"), auto_clock=False) as env:
            await _log_in(driver, env.base_url, env.bridge.admin_token)
            assert "No agent asks to add a bot." in (await _browser(_texts, driver, "#bot-requests"))[0]
            queue = env.bridge.bot_requests
            outcomes: dict[str, str] = {}
            async with anyio.create_task_group() as tg:

                async def ask(who: str) -> None:
                    outcomes[who] = (await queue.request(who, reason=reason, agent="agent 1")).outcome

                tg.start_soon(ask, wanted)
                tg.start_soon(ask, unwanted)
                await until(lambda: len(queue.pending()) == 2)
                ids = {r.uid: r.id for r in queue.pending()}
                # The page follows without a reload (the long-poll).
                await _browser(
                    _wait_for, driver, lambda d: len(_find(d, "#bot-requests li.bot-request")) == 2
                )
                asks = await _browser(_texts, driver, "#bot-requests .ask")
                assert sorted(asks) == sorted(
                    f"An agent asks to add bot {u}: {reason}" for u in (wanted, unwanted)
                )
                assert not await _browser(_find, driver, "#bot-requests img")
                await _browser(_click, driver, f'#bot-requests button.approve[data-request="{ids[wanted]}"]')
                await _browser(_wait_for, driver, lambda d: _texts(d, "#notice")[0].startswith("Approved"))
                assert await _browser(_texts, driver, "#notice") == [
                    f"Approved: the agent's request to add bot {wanted}; outcome: approved"
                ]
                await _browser(_click, driver, f'#bot-requests button.deny[data-request="{ids[unwanted]}"]')
                await _browser(_wait_for, driver, lambda d: _texts(d, "#notice")[0].startswith("Denied"))
            assert outcomes == {wanted: "approved", unwanted: "denied"}
            assert env.bridge.settings.allowed_bots == (BOT, wanted)
            await _browser(_wait_for, driver, lambda d: not _find(d, "#bot-requests li.bot-request"))
            recent = (await _browser(_texts, driver, "#bot-requests"))[0]
            assert f"Bot {wanted}: approved" in recent
            assert f"Bot {unwanted}: denied" in recent
            assert await _browser(driver.execute_script, "return window.__xss;") is None
            assert env.payer.calls == []
