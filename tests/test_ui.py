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
from spotopt.mover.status import newest_placement
from tests.browser import chromium
from tests.helpers import cli, ingest, price, strict_json
from tests.servers import free_port, spotopt_server
from tests.ui_fleet import MARKUP, fill, job_names

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

SAVED = "demo <i>replay</i>"
TOKEN = "s3cret-token-0123456789"
LOG = "epoch 2 resumed at step 16,500\n<script>document.title='pwned'</script> & more\n"
"""The end of the running job's log (markup, to be shown as text)."""
STALE = ("aws", "us-west-2", "us-west-2a", "p3.2xlarge")
"""A V100 spot market priced once, in 2024, far below every fresh price: stale, so listed last."""
SCREENSHOTS = os.environ.get("SPOTOPT_SCREENSHOTS")
"""Where to also write each page's screenshot (the docs' are made with docs/screenshots)."""
SHOT_MAX_HEIGHT = 2400
"""Screenshots are of the whole page (1280 px wide: ``tests.browser``), cut at this height."""


ROW_SLACK_USD = 0.01
"""A row of a table with a total is rounded so the rows add up to it (``render.usd_summed``):
up or down, off by less than a cent; a figure on its own is off by at most half a cent."""


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
    cloud, region, zone, instance_type = STALE
    ingest(db, [price(instance_type, "2024-01-01 00:00", 0.10, cloud=cloud, region=region, zone=zone)])
    placement = newest_placement(db, "job-running")
    assert placement is not None and placement.instance_id is not None
    log = where / "state" / "instances" / placement.instance_id / "log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"step {k:,}\n" for k in range(0, 20_000, 10)) + LOG)
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
    args = ["--db", fleet["url"], "ui", "--port", str(port), "--state-dir", str(fleet["dir"] / "state")]
    with spotopt_server(args, base + "/", fleet["dir"] / "ui.log"):
        yield base


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


PAGE_WAIT_S = 60.0
"""How long a page may take to show its first table or heading (CI machines are shared)."""


def _open(browser: Any, url: str, shot: str | None = None, ready: str = "main h1") -> Any:
    """``url`` in the browser once ``ready`` (CSS) is on the page. A page that is not the
    dashboard's yet (Chromium's error page for a refused or reset connection on a loaded
    machine) is loaded again until ``PAGE_WAIT_S``; then the test fails showing what was there."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + PAGE_WAIT_S
    browser.get(url)
    while not browser.find_elements(By.CSS_SELECTOR, ready):
        if time.monotonic() > deadline:
            text = browser.find_element(By.TAG_NAME, "body").text[:1500]
            raise AssertionError(f"{url}: no {ready!r} in {PAGE_WAIT_S:.0f} s; the page shows: {text!r}")
        time.sleep(1.0)
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
    _open(browser, server + "/", "fleet", ready="#fleet-jobs tbody tr")
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
        slack = ROW_SLACK_USD + (place["usd_per_hour"] if place else 0.0) * elapsed_h
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
                assert abs(_usd(got) - want["cost_usd"]) <= slack - 0.005 + ROW_SLACK_USD
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
    at = browser.find_element(By.ID, "markets-board").get_attribute("data-at")
    board = _json(
        "--db",
        fleet["url"],
        "report",
        "run",
        "price-board",
        "-p",
        f"gpu={gpu}",
        "-p",
        f"at={at}",
        "-f",
        "json",
    )
    rows = browser.find_elements(By.CSS_SELECTOR, "#markets-board tbody tr")
    assert len(rows) == len(board)
    for row, want in zip(rows, board, strict=True):
        assert _usd(row.find_element(By.CSS_SELECTOR, ".usd-per-hour").text) == pytest.approx(
            want["usd_per_hour"], abs=0.005
        )
        assert row.get_attribute("data-stale") == str(want["stale"]).lower()
        assert float(
            row.find_element(By.CSS_SELECTOR, ".age").get_attribute("data-age-days")
        ) == pytest.approx(want["age_days"])
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
        _open(browser, base + "/", ready="body")
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


PAGES = (
    "/",
    "/jobs/job-running",
    "/jobs/job-failed",
    "/markets",
    "/availability",
    "/whatif",
    f"/whatif/{SAVED}",
)
OVERFLOWING = """
// Every element of <main> that reaches past the window's sides with no box between that scrolls
// or clips it (a table in its .wide box may be wider than the window: it scrolls there).
const width = document.documentElement.clientWidth;
const found = [];
for (const el of document.querySelectorAll("main *")) {
  const box = el.getBoundingClientRect();
  if (box.width === 0 || (box.left >= -1 && box.right <= width + 1)) continue;
  let up = el.parentElement, held = false;
  while (up && up !== document.body && !held) {
    const style = getComputedStyle(up), outer = up.getBoundingClientRect();
    held = style.overflowX !== "visible" && outer.left >= -1 && outer.right <= width + 1;
    up = up.parentElement;
  }
  const name = el.tagName + (el.id ? "#" + el.id : "") + "." + el.className;
  if (!held) found.push(name + " " + Math.round(box.left) + ".." + Math.round(box.right));
}
return [document.documentElement.scrollWidth, width, found.slice(0, 10)];
"""


@pytest.mark.parametrize("width", [1280, 420])
def test_pages_fit_the_window_at_desktop_and_phone_widths(server: str, browser: Any, width: int) -> None:
    """No page scrolls sideways and nothing sticks out of it: wide tables scroll inside their
    own box, charts are as wide as theirs (issue 36 item 12)."""
    from selenium.webdriver.common.by import By

    browser.set_window_size(width, 1000)
    try:
        for page in PAGES:
            _open(browser, server + quote(page), None)
            page_width, window, outside = browser.execute_script(OVERFLOWING)
            assert window <= width and page_width <= window, (page, page_width, window)
            assert outside == [], (page, outside)
            for chart in browser.find_elements(By.CSS_SELECTOR, "div.chart"):
                canvas = chart.find_elements(By.TAG_NAME, "canvas")
                if canvas:
                    assert canvas[0].size["width"] <= chart.size["width"], page
    finally:
        browser.set_window_size(1280, 1000)


def test_the_content_security_policy_blocks_nothing_the_pages_use(server: str, browser: Any) -> None:
    """Every page carries the policy and no-framing headers, and runs under them: no violation,
    the charts drawn, the heatmap coloured by script (no inline style or handler is allowed)."""
    from selenium.webdriver.common.by import By

    with urllib.request.urlopen(server + "/markets", timeout=10) as answer:
        assert "frame-ancestors 'none'" in answer.headers["Content-Security-Policy"]
        assert "script-src 'self';" in answer.headers["Content-Security-Policy"]
        assert answer.headers["X-Frame-Options"] == "DENY"
    watch = browser.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument",
        {
            "source": "window.__violations = []; document.addEventListener('securitypolicyviolation', "
            "e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));"
        },
    )
    try:
        for page in PAGES:
            _open(browser, server + quote(page))
            assert browser.execute_script("return window.__violations") == [], page
        _open(browser, server + "/availability")
        cells = browser.find_elements(By.CSS_SELECTOR, "#availability-heatmap .cell[data-share]")
        coloured = [c for c in cells if c.get_attribute("data-share")]
        assert coloured and all(
            "hsl" in (c.get_attribute("style") or "") or "rgb" in c.get_attribute("style") for c in coloured
        )
        _open(browser, server + "/markets")
        assert browser.find_elements(By.CSS_SELECTOR, "#markets-price-chart ~ *, div.chart canvas")
        assert browser.execute_script("return window.__violations") == []
    finally:
        browser.execute_cdp_cmd(
            "Page.removeScriptToEvaluateOnNewDocument", {"identifier": watch["identifier"]}
        )


def test_markets_chart_spans_the_window_it_names(fleet: dict[str, Any], server: str, browser: Any) -> None:
    """The price chart's time axis is the 30-day window of its caption, whatever the points
    (issue 36 item 7: it spanned 2024-2027), and each line holds its price to the window's end."""
    from selenium.webdriver.common.by import By

    _open(browser, server + "/markets")
    window = browser.find_element(By.ID, "window")
    since, until = (datetime.fromisoformat(window.get_attribute(f"data-{end}")) for end in ("since", "until"))
    assert until - since <= timedelta(days=30, seconds=1)
    data = _chart(browser, "markets-price-chart")
    assert data["range"] == [since.timestamp(), until.timestamp()]
    assert data["x"][0] == since.timestamp() and data["x"][-1] == until.timestamp()
    assert all(s["y"][-1] is not None for s in data["series"])
    drawn = browser.execute_script("const x = charts[0].plot.scales.x; return [x.min, x.max];")
    assert drawn == [since.timestamp(), until.timestamp()]


def test_cheapest_now_ranks_a_stale_price_last_and_shows_ages(
    fleet: dict[str, Any], server: str, browser: Any
) -> None:
    """A 2024 price far below every fresh one is listed after them, marked stale with its age,
    the limit (price_max_age_days, 7 days by default) said under the table (issue 36 item 6)."""
    from selenium.webdriver.common.by import By

    _open(browser, server + "/markets")
    rows = browser.find_elements(By.CSS_SELECTOR, "#markets-board tbody tr")
    flags = [row.get_attribute("data-stale") == "true" for row in rows]
    assert False in flags and flags == sorted(flags)  # every fresh price before every stale one
    _, _, zone, instance_type = STALE
    stale = [r for r in rows if zone in r.text and instance_type in r.text and "spot" in r.text]
    assert len(stale) == 1 and stale[0].get_attribute("data-stale") == "true"
    age = stale[0].find_element(By.CSS_SELECTOR, ".age").text
    assert age.endswith(" d stale") and int(age.split()[0].replace(",", "")) > 365
    fresh_age = rows[0].find_element(By.CSS_SELECTOR, ".age").text
    assert fresh_age.endswith(" h") or fresh_age.endswith(" d")
    caption = browser.find_element(By.ID, "markets-board-caption").text
    assert "more than 7 days" in caption and "price_max_age_days" in caption


def test_failed_job_shows_its_reason_first_and_every_job_its_log(
    fleet: dict[str, Any], server: str, browser: Any
) -> None:
    """A failed job's page opens with why it failed (issue 36 item 13: it was only at the
    bottom of its timeline); a job's page ends with the tail of its log, markup shown as text."""
    from selenium.webdriver.common.by import By

    for name in ("job-failed", "job-over-budget"):
        show = _json("--db", fleet["url"], "jobs", "show", name, "-f", "json")
        reason = next(e["reason"] for e in reversed(show["events"]) if e["to_state"] == show["state"])
        _open(browser, f"{server}/jobs/{name}")
        failure = browser.find_element(By.ID, "job-failure")
        assert reason in failure.text and show["state"] in failure.text
        above = browser.execute_script(
            "return document.getElementById('job-failure').getBoundingClientRect().top < "
            "document.querySelector('section.cards').getBoundingClientRect().top"
        )
        assert above, name
    _open(browser, f"{server}/jobs/job-running", "job-log")
    assert not browser.find_elements(By.ID, "job-failure")
    log = browser.find_element(By.ID, "job-log")
    assert log.text.endswith(LOG.strip()) and "step 19,990" in log.text
    assert browser.title == "spotopt · job-running"  # the log's <script> did not run
    assert not log.find_elements(By.TAG_NAME, "script")
    note = browser.find_element(By.ID, "job-log-note").text
    assert "jobs logs job-running" in note and "KiB" not in note  # the whole log fits
    _open(browser, f"{server}/jobs/job-pending")
    assert "not launched yet" in browser.find_element(By.ID, "job-log-note").text
    assert not browser.find_elements(By.ID, "job-log")
