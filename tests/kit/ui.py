"""A headless Debian Chromium driven by Selenium (through Debian's
chromedriver) for the approvals-page tests; skips with the reason when the
browser, the driver or the selenium package is missing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)
INSTALL_HINT = "run .ci/install.d/40-chromium.sh (apt-get install chromium chromium-driver)"


def _binary(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    for name in names:
        path = Path("/usr/bin") / name
        if path.exists():
            return str(path)
    return None


def chromium_driver(tmp_path: Path) -> Iterator[Any]:
    """A started ``selenium.webdriver.Chrome`` on Debian's chromium (quit on exit)."""
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    browser = _binary("chromium", "chromium-browser")
    driver_path = _binary("chromedriver")
    if browser is None or driver_path is None:
        pytest.skip(f"no headless Chromium and chromedriver here; {INSTALL_HINT}")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in CHROMIUM_ARGS:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    try:
        driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    except WebDriverException as exc:
        pytest.skip(f"Chromium could not be started: {str(exc).splitlines()[0]}")
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
