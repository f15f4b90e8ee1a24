"""The dashboard (``spotopt ui``) as a real server process, read by headless Chromium.

The pages must show what the terminal shows: each number is compared with ``jobs show`` /
``jobs cost`` / ``report run`` JSON over the same database. A running job's spend grows while
the test reads, so a spend may differ by what its $/h adds between the two reads (measured,
plus half a cent of rounding), nothing more.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from spotopt.db.models import JOB_STATES
from spotopt.history.setup import open_history
from tests.browser import chromium
from tests.helpers import cli, strict_json
from tests.servers import free_port, spotopt_server
from tests.ui_fleet import MARKUP, fill, job_names

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

SAVED = "demo <i>replay</i>"
TOKEN = "s3cret-token"
SCREENSHOTS = os.environ.get("SPOTOPT_SCREENSHOTS")
"""Where to also write each page's screenshot (the docs' are made with docs/screenshots)."""
SHOT_MAX_HEIGHT = 2400
"""Screenshots are of the whole page (1280 px wide: ``tests.browser``), cut at this height."""


def _usd(text: str) -> float:
    return float(text.replace("$", "").replace(",", "").removesuffix("/h"))


@pytest.fixture(scope="module")
def fleet(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A filled history, on SQLite then on PostgreSQL, and a stored what-if (``whatif --save``,
    its JSON kept). The fleet was submitted eight hours ago (the last whole hour's), so the pages
    read as a live fleet's; every check compares the page with the CLI at the time it reads."""
    where = tmp_path_factory.mktemp("fleet")
    url = module_db_url
    db = open_history(url)
    fill(db, where, start=datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=8))
    db.dispose()
    code, out, err = cli(
        "--db", url, "whatif", "--example", "--strategies", "spot,spotopt", "--save", SAVED, "-f", "json"
    )
    assert code == 0, err
    return {"url": url, "dir": where, "whatif": strict_json(out)}


@pytest.fixture(scope="module")
def server(fleet: dict[str, Any]) -> Iterator[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = ["--db", fleet["url"], "ui", "--port", str(port)]
    with spotopt_server(args, base + "/", fleet["dir"] / "ui.log"):
        yield base


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


def _open(browser: Any, url: str, shot: str | None = None) -> Any:
    browser.get(url)
    if shot and SCREENSHOTS:
        # The whole page as laid out in the 1280 px window, beyond the viewport (Chromium's own
        # capture through the DevTools protocol), cut at SHOT_MAX_HEIGHT.
        size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        clip = {
            "x": 0,
            "y": 0,
            "width": size["width"],
            "height": min(size["height"], SHOT_MAX_HEIGHT),
            "scale": 1,
        }
        shot_png = browser.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        (Path(SCREENSHOTS) / f"{shot}.png").write_bytes(base64.b64decode(shot_png["data"]))
    return browser


def _cells(browser: Any, css: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in browser.find_elements(By.CSS_SELECTOR, css)]


def _chart(browser: Any, chart_id: str) -> Any:
    """The data a chart was drawn from (its ``<script type="application/json">``)."""
    from selenium.webdriver.common.by import By

    return json.loads(browser.find_element(By.ID, chart_id).get_attribute("textContent"))


def _json(*args: str) -> Any:
    code, out, err = cli(*args)
    assert code == 0, err
    return strict_json(out)


def test_fleet_page_shows_what_jobs_show_says(fleet: dict[str, Any], server: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    before = time.monotonic()
    _open(browser, server + "/", "fleet")
    rows = browser.find_elements(By.CSS_SELECTOR, "#fleet-jobs tbody tr")
    shown = {
        row.find_element(By.CSS_SELECTOR, "td.name").text: {
            "state": row.find_element(By.CSS_SELECTOR, ".state").text,
            "usd_per_hour": row.find_element(By.CSS_SELECTOR, ".usd-per-hour").text,
            "spent": row.find_element(By.CSS_SELECTOR, ".spent").text,
            "budget": row.find_element(By.CSS_SELECTOR, ".budget").text,
            "open_moves": row.find_element(By.CSS_SELECTOR, ".open-moves").text,
        }
        for row in rows
    }
    names = job_names(open_history(fleet["url"]))
    assert list(shown) == names
    details = {name: _json("--db", fleet["url"], "jobs", "show", name, "-f", "json") for name in names}
    elapsed_h = (time.monotonic() - before) / 3600
    rate = 0.0
    for name, got in shown.items():
        want = details[name]
        place = want["placement"]
        slack = 0.005 + (place["usd_per_hour"] if place else 0.0) * elapsed_h
        assert got["state"] == want["state"]
        assert abs(_usd(got["spent"]) - want["spent_usd"]) <= slack, name
        assert _usd(got["budget"]) == pytest.approx(want["budget_usd"])
        if place is None:
            assert got["usd_per_hour"] == "–"
        else:
            assert _usd(got["usd_per_hour"]) == pytest.approx(place["usd_per_hour"], abs=0.005)
            rate += place["usd_per_hour"]
        assert int(got["open_moves"]) == sum(1 for m in want["moves"] if m["outcome"] is None)
    assert rate > 0
    assert _usd(browser.find_element(By.ID, "fleet-usd-per-hour").text) == pytest.approx(rate, abs=0.005)
    states = _cells(browser, "#fleet-states li")
    assert states == [f"{s} 1" for s in JOB_STATES]  # one job in every state


def test_job_page_shows_what_jobs_cost_and_show_say(fleet: dict[str, Any], server: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    for name in ("job-running", MARKUP, "job-done"):
        before = time.monotonic()
        _open(browser, f"{server}/jobs/{quote(name)}", "job" if name == "job-running" else None)
        cost = _json("--db", fleet["url"], "jobs", "cost", name, "-f", "json")
        show = _json("--db", fleet["url"], "jobs", "show", name, "-f", "json")
        place = show["placement"]
        slack = 0.005 + (place["usd_per_hour"] if place else 0.0) * (time.monotonic() - before) / 3600
        assert browser.find_element(By.ID, "job-name").text == name
        assert abs(_usd(browser.find_element(By.ID, "job-ledger-total").text) - cost["total_usd"]) <= slack
        assert abs(_usd(browser.find_element(By.ID, "job-spent").text) - show["spent_usd"]) <= slack
        ledger = browser.find_elements(By.CSS_SELECTOR, "#job-ledger tbody tr")
        if cost["intervals"]:
            assert len(ledger) == len(cost["intervals"])
            for row, want in zip(ledger, cost["intervals"], strict=True):
                got = row.find_element(By.CSS_SELECTOR, ".cost").text
                assert abs(_usd(got) - want["cost_usd"]) <= slack
        assert int(browser.find_element(By.ID, "job-moves").text) == len(show["moves"])
        assert int(browser.find_element(By.ID, "job-preemptions").text) == show["preemptions"]
        timeline = " ".join(_cells(browser, "#job-timeline td"))
        for event in show["events"]:
            assert event["reason"] in timeline
        # The charts end where `jobs show` and `jobs cost` are: the steps of the newest heartbeat,
        # the ledger's total; both are drawn by the vendored uPlot (canvases), with no network.
        progress, spend = _chart(browser, "job-progress-chart"), _chart(browser, "job-cost-chart")
        if show["progress"]["steps"]:
            assert progress["series"][0]["y"][-1] == show["progress"]["steps"]
            assert progress["series"][1]["y"][-1] == show["progress"]["work_steps"]
        else:
            assert progress["x"] == []
        if cost["intervals"]:
            assert abs(spend["series"][0]["y"][-1] - cost["total_usd"]) <= slack
        assert len(browser.find_elements(By.CSS_SELECTOR, "div.chart canvas")) == bool(progress["x"]) + bool(
            spend["x"]
        )
    _open(browser, f"{server}/jobs/no-such-job")
    assert "no-such-job" in browser.find_element(By.ID, "error").text


def test_markup_in_user_text_is_shown_literally(fleet: dict[str, Any], server: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, server + "/")
    assert browser.title == "spotopt · fleet"  # the name's <script> did not run
    cell = browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{MARKUP}"] td.name')
    assert cell.text == MARKUP
    assert not cell.find_elements(By.TAG_NAME, "b") and not cell.find_elements(By.TAG_NAME, "script")
    _open(browser, f"{server}/jobs/{quote(MARKUP)}", "job-markup")
    assert browser.title == f"spotopt · {MARKUP}"
    assert browser.find_element(By.ID, "job-name").text == MARKUP
    assert MARKUP in browser.find_element(By.ID, "job-run").text
    assert f"cheaper: {MARKUP}" in _cells(browser, "#job-timeline td.detail")
    # Only the page's own chart data is a script in <main>: none came from the job's text.
    assert not browser.find_elements(By.CSS_SELECTOR, "main b, main script:not([type='application/json'])")
    _open(browser, f"{server}/whatif/{quote(SAVED)}")
    assert browser.find_element(By.ID, "whatif-name").text == SAVED
    assert not browser.find_elements(By.CSS_SELECTOR, "main i")


def test_markets_page_shows_the_price_board(fleet: dict[str, Any], server: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, server + "/markets", "markets")
    gpu = browser.find_element(By.ID, "markets-gpu").text
    until = browser.find_element(By.ID, "window").get_attribute("data-until")
    board = _json(
        "--db",
        fleet["url"],
        "report",
        "run",
        "price-board",
        "-p",
        f"gpu={gpu}",
        "-p",
        f"at={until}",
        "-f",
        "json",
    )
    rows = browser.find_elements(By.CSS_SELECTOR, "#markets-board tbody tr")
    assert len(rows) == len(board)
    for row, want in zip(rows, board, strict=True):
        assert _usd(row.find_element(By.CSS_SELECTOR, ".usd-per-hour").text) == pytest.approx(
            want["usd_per_hour"], abs=0.005
        )
    assert browser.find_elements(By.CSS_SELECTOR, "div.chart canvas")
    _open(browser, server + "/markets?gpu=NOPE")
    assert "NOPE" in browser.find_element(By.ID, "error").text


def test_availability_page_shows_the_report(fleet: dict[str, Any], server: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, server + "/availability", "availability")
    window = browser.find_element(By.ID, "window")
    since, until = (window.get_attribute(f"data-{end}") for end in ("since", "until"))
    report = _json(
        "--db",
        fleet["url"],
        "report",
        "run",
        "availability",
        "-p",
        f"since={since}",
        "-p",
        f"until={until}",
        "-f",
        "json",
    )
    shares = _cells(browser, "#availability-markets td.share")
    assert shares == [f"{row['available_share']:.0%}" for row in report["markets"]]
    assert len(shares) == 3
    # The heatmap over time: a row per market, least available first, whose columns (equal
    # spans of the window, every market observed from its start) average to the report's share.
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#availability-heatmap .heatmap-row[data-market]')]"
        ".map(r => [r.dataset.market, [...r.querySelectorAll('.cell')].map(c => c.dataset.share)]);"
    )
    want = {
        f"{m['cloud']} {m['zone'] or m['region']} {m['instance_type']} spot": m["available_share"]
        for m in report["markets"]
    }
    assert [label for label, _ in rows] == sorted(want, key=want.__getitem__)
    for label, cells in rows:
        assert sum(float(c) for c in cells) / len(cells) == pytest.approx(want[label], abs=1e-9)


def test_whatif_page_shows_the_saved_replay(fleet: dict[str, Any], server: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, server + "/whatif")
    assert SAVED in _cells(browser, "#whatif-runs td")
    _open(browser, f"{server}/whatif/{quote(SAVED)}", "whatif")
    for want in fleet["whatif"]["results"]:
        table = browser.find_element(By.CSS_SELECTOR, f'table.whatif-results[data-job="{want["job"]}"]')
        got = table.find_element(By.CSS_SELECTOR, f'tr.cost_usd td[data-strategy="{want["strategy"]}"]').text
        assert _usd(got) == pytest.approx(want["cost_usd"], abs=0.005)
    placed = browser.find_elements(By.CSS_SELECTOR, "#whatif-placements tbody tr")
    assert len(placed) == len(fleet["whatif"]["placements"]) > 0


def test_whatif_save_refuses_a_taken_name(fleet: dict[str, Any]) -> None:
    code, _, err = cli("--db", fleet["url"], "whatif", "--example", "--save", SAVED)
    assert code == 2
    assert "--save" in err and "choose another name" in err


@pytest.mark.parametrize("module_db_url", ["sqlite"], indirect=True)  # the rule is the server's
def test_token_is_required_off_loopback_and_enforced(fleet: dict[str, Any], browser: Any) -> None:
    from selenium.webdriver.common.by import By

    code, _, err = cli("--db", fleet["url"], "ui", "--host", "0.0.0.0")
    assert code == 2
    assert "SPOTOPT_UI_TOKEN" in err and "--host" in err
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = ["--db", fleet["url"], "ui", "--port", str(port)]
    with spotopt_server(args, base + "/", fleet["dir"] / "ui-token.log", env={"SPOTOPT_UI_TOKEN": TOKEN}):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(base + "/", headers=headers), timeout=10)
            assert refused.value.code == 401
        with urllib.request.urlopen(
            urllib.request.Request(base + "/markets", headers={"Authorization": f"Bearer {TOKEN}"}),
            timeout=10,
        ) as ok:
            assert ok.status == 200
        _open(browser, base + "/")
        assert "401" in browser.find_element(By.TAG_NAME, "body").text
        _open(browser, base + f"/?token={TOKEN}")
        assert browser.current_url == base + "/"  # the token left the address bar for a cookie
        assert browser.find_element(By.ID, "fleet-jobs")
        browser.delete_all_cookies()


def test_static_files_are_the_vendored_ones(server: str) -> None:
    """htmx and uPlot come from the package, as VENDORED.md records them (no CDN)."""
    import hashlib

    from spotopt.ui.app import STATIC

    table = (STATIC / "VENDORED.md").read_text()
    for name in ("htmx.min.js", "uPlot.iife.min.js", "uPlot.min.css"):
        with urllib.request.urlopen(f"{server}/static/{name}", timeout=10) as served:
            digest = hashlib.sha256(served.read()).hexdigest()
        assert f"`{name}`" in table and digest in table
