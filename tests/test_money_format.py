"""Issue 36 item 10: one money format. The dashboard (``spotopt ui``) shows a job's sub-cent
spend and ledger as ``jobs cost`` and ``jobs show`` print them (``render.usd``), and a ledger's
rows add up to its total (``render.usd_summed``), where cents made a ledger of $0.00 rows that
summed to $0.01. Both run as users run them: the console script and the
dashboard's own server, over one database."""

from __future__ import annotations

import html
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from spotopt.db.engine import Database
from spotopt.mover import jobs
from tests.helpers import ingest, price
from tests.mover_rows import AWS_V100, JOB, T0, market_id, place, seed_markets
from tests.servers import free_port, spotopt_server

SPOTOPT = Path(sys.executable).parent / "spotopt"


def _spotopt(url: str, *args: str) -> str:
    done = subprocess.run(
        [str(SPOTOPT), "--db", url, *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _money(text: str) -> Decimal:
    return Decimal(text.strip().lstrip("$").replace(",", ""))


@pytest.fixture
def url(db: Database, tmp_path: Path) -> str:
    """Two jobs on AWS at $0.20/h, each instance billed AWS's 60 s minimum ($0.00333): resnet
    ran two instances ($0.00667), vgg one."""
    seed_markets(db)
    ingest(db, [price(AWS_V100, "2026-03-01 11:30", 0.20)])  # the ledger bills the price in effect
    aws = market_id(db, AWS_V100)
    for name, instances in (("resnet", 2), ("vgg", 1)):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(JOB.replace("name: resnet", f"name: {name}"))
        job_id = int(jobs.submit(db, spec, now=T0).id)
        for k in range(instances):
            start = T0 + timedelta(minutes=5 * k)
            place(db, job_id, aws, start, start + timedelta(seconds=10), "finished", usd_per_hour=0.2)
    return db.engine.url.render_as_string(hide_password=False)


@pytest.fixture
def dashboard(url: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with spotopt_server(["--db", url, "ui", "--port", str(port)], base + "/", tmp_path / "ui.log"):
        yield base


def _page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as answer:
        return html.unescape(answer.read().decode())


def _cells(page: str, css: str) -> list[str]:
    return re.findall(rf'<td class="num {css}">([^<]*)</td>', page)


def test_dashboard_shows_sub_cent_money_as_jobs_cost_and_show_and_rows_add_up(
    url: str, dashboard: str
) -> None:
    cost = _spotopt(url, "jobs", "cost", "resnet")
    title = re.search(r"Job resnet: (\$[\d.,]+) over 2 instance interval", cost)
    assert title is not None
    printed = [line.split("│")[-3].strip() for line in cost.splitlines() if re.match(r"│ \d+ ", line)]
    assert len(printed) == 2

    page = _page(f"{dashboard}/jobs/resnet")
    total = re.search(r'id="job-ledger-total">([^<]*)<', page)
    assert total is not None
    assert total.group(1) == title.group(1) == "$0.00667"  # cents said $0.00
    assert _cells(page, "cost") == printed  # the same strings, row by row
    assert sum(map(_money, printed)) == _money(title.group(1))  # the rows shown add up to the total

    spent = re.search(r"│ spent\s+│ (\$[\d.,]+) of ", _spotopt(url, "jobs", "show", "resnet"))
    card = re.search(r'id="job-spent" class="big">([^<]*)<', page)
    assert spent is not None and card is not None and card.group(1) == spent.group(1) == "$0.00667"

    fleet = _page(f"{dashboard}/")  # each job's spend as its own `jobs show` says it
    spent_by_show = []
    for name in ("resnet", "vgg"):
        said = re.search(r"│ spent\s+│ (\$[\d.,]+) of ", _spotopt(url, "jobs", "show", name))
        assert said is not None
        spent_by_show.append(said.group(1))
    assert _cells(fleet, "spent") == spent_by_show == ["$0.00667", "$0.00333"]  # cents said $0.01, $0.00
