"""Headless Debian Chromium driven through chromedriver (Selenium), for the dashboard tests.

Both come from Debian (``apt-get install chromium chromium-driver``; ``.ci/run`` installs them).
Without them the tests skip, except in CI, where a skip would hide a missing install."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1280,1000",
)


def _binaries() -> tuple[str, str] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


@contextmanager
def chromium(profile: Path) -> Iterator[object]:
    """A Selenium ``WebDriver`` on a fresh profile directory; quit on exit."""
    found = _binaries()
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but no chromium/chromedriver: .ci/run must install chromium chromium-driver")
        pytest.skip("no chromium/chromedriver (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(found[1]))
    try:
        yield driver
    finally:
        driver.quit()
