"""Issue 14: output people enjoy reading, strict JSON everywhere, large outputs streamed or capped."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from rich.console import Console

from spotopt import render as render_module
from spotopt.db.engine import Database
from spotopt.errors import InputError
from spotopt.render import render
from spotopt.reports import frames
from spotopt.reports.registry import REPORTS
from tests import report_history as hist
from tests.helpers import cli, ingest, price, strict_json


@pytest.fixture
def history(sqlite_db: Database) -> str:
    hist.build(sqlite_db)
    return sqlite_db.engine.url.render_as_string()


WINDOW = ["-p", f"since={hist.iso(0)}", "-p", f"until={hist.iso(48)}"]


def _report_args(name: str) -> list[str]:
    report = REPORTS[name]
    args = ["report", "run", name, "-f", "json"]
    names = {p.name for p in report.params}
    if "since" in names:
        args += WINDOW
    if "at" in names:
        args += ["-p", f"at={hist.iso(12)}"]
    if any(p.name == "gpu" and p.required for p in report.params):
        args += ["-p", "gpu=V100"]
    return args


def test_every_json_output_is_strict_json(history: str, tmp_path: Path) -> None:
    commands = [
        ["prices", "show", "-f", "json"],
        ["prices", "cheapest", "--gpu", "V100", "--at", hist.iso(12), "-f", "json"],
        ["catalog", "list", "--gpu", "V100", "-f", "json"],
        ["report", "list", "-f", "json"],
        ["throughput", "list", "-f", "json"],
        *(_report_args(name) for name in REPORTS),
    ]
    csv_file = tmp_path / "p.csv"
    csv_file.write_text(
        "timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n"
        "2024-05-01T00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,9999\n"
    )
    commands.append(["import", "csv", str(csv_file), "-f", "json"])
    for args in commands:
        code, out, err = cli("--db", history, *args)
        assert code == 0, (args, err)
        strict_json(out)


def test_a_region_wide_zone_is_null_in_prices_and_report_json(history: str) -> None:
    at = hist.iso(12)
    _, out, _ = cli("--db", history, "prices", "cheapest", "--gpu", "V100", "--at", at, "-f", "json")
    gcp = [q for q in strict_json(out) if q["cloud"] == "gcp"]
    assert gcp and {q["zone"] for q in gcp} == {None}
    _, out, _ = cli("--db", history, "report", "run", "cheapest", *WINDOW, "-p", "cloud=gcp", "-f", "json")
    rows = strict_json(out)
    assert rows and {r["zone"] for r in rows} == {None}


def test_table_columns_are_formatted_as_a_whole() -> None:
    frame = pd.DataFrame(
        {
            "markets": [0.0, 1.0, None],  # pandas made the counts floats
            "gpu_count": [1.0, 8.0, 1.0],
            "usd": [0.0, 14.2416, 0.3461],
            "at": [datetime(2024, 5, 1, tzinfo=UTC)] * 3,
            "seen": [datetime(2024, 5, 1, 12, 30, tzinfo=UTC)] * 3,
        }
    )
    out = io.StringIO()
    render(frame, out=out)
    text = out.getvalue()
    assert "0.00" not in text and "1.0 " not in text and "8.0" not in text
    assert "│ 0 " in text and "14.24" in text and "0.3461" in text
    assert "2024-05-01 12:30" in text and "T00:00:00Z" not in text and "2024-05-01 00:00" not in text


def test_headers_break_between_words_only() -> None:
    out = io.StringIO()
    row = {"usd_per_gpu_hour": 1.5, "lowest_usd_per_gpu_hour": 1.2, "instance_type": "p3.2xlarge"}
    render([row], out=out)
    text = out.getvalue()
    assert "usd per gpu hour" in text and "instance type" in text and "_" not in text


MARKET = {
    "cloud": "aws",
    "region": "us-west-2",
    "zone": "us-west-2a",
    "instance_type": "p3.2xlarge",
    "market": "spot",
    "gpu_model": "V100-16GB",
}


def test_a_table_too_wide_for_the_screen_fits_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # At 80 columns, nine columns of one market's outages folded every word ("us-wes / t-2")
    # and ran off the screen: the columns with one value in every row go to the caption, once.
    monkeypatch.setattr(render_module, "_console", lambda out: Console(file=out, width=80))
    at = datetime(2022, 11, 16, tzinfo=UTC)
    rows = [
        MARKET
        | {"outage_from": at + timedelta(hours=k), "outage_to": at + timedelta(hours=k + 0.5), "hours": 0.5}
        for k in range(3)
    ]
    out = io.StringIO()
    render(rows, out=out, caption="2022-11-16 – 2022-11-23 UTC")
    text = out.getvalue()
    assert max(map(len, text.splitlines())) <= 80
    assert "│ 2022-11-16 01:00" in text and "│ aws" not in text  # one line per outage, no market columns
    caption = " ".join(text.split())
    assert (
        "cloud aws · region us-west-2 · zone us-west-2a" in caption
        and "2022-11-16 – 2022-11-23 UTC" in caption
    )
    # One row too wide: its fields down the screen, each with its value.
    out = io.StringIO()
    render([rows[0] | {"mean_outage_hours": 0.6458, "median_outage_hours": 0.5}], out=out)
    text = out.getvalue()
    assert max(map(len, text.splitlines())) <= 80
    assert "field" in text and "│ median outage hours │ 0.5" in text and "│ zone " in text
    # A table that fits stays as it is, its common columns included.
    out = io.StringIO()
    render([{"cloud": "aws", "usd": 1.0}, {"cloud": "aws", "usd": 2.0}], out=out)
    assert out.getvalue().count("│ aws") == 2


def test_a_table_that_can_fit_without_folding_a_word_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # At 80 columns rich narrowed the widest columns first, below their longest word: every
    # strategy of ``whatif --example`` folded ("uniform-p / rogress") beside a column of dashes.
    monkeypatch.setattr(render_module, "_console", lambda out: Console(file=out, width=80))
    rows = [
        {"job": job, "strategy": strategy, "cost_usd": 288.33, "bound_usd": None}
        | {"ratio_vs_spot": 2.9595, "deadline_met": None, "moves": 0}
        for job in ("transformer", "a3c")
        for strategy in ("uniform-progress", "up-failover", "multi-cloud")
    ]
    out = io.StringIO()
    render(rows, out=out)
    lines = out.getvalue().splitlines()
    assert max(map(len, lines)) <= 80
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == len(rows)  # one line per row: nothing folded or wrapped
    assert "│ transformer │ uniform-progress │ 288.33" in body[0]
    # Where the longest words cannot all fit, no word is cut (a name folded mid-word reads as
    # two, issue 36 item 12): each row is a block of fields and values.
    rows = [
        {"cloud": cloud, "region": region, "zone": zone, "instance_type": itype, "market": market}
        | {"gpu_count": gpus, "usd_per_gpu_hour": usd}
        for cloud, region, zone, itype, market, gpus, usd in (
            ("gcp", "us-central1", None, "n1-standard-16+2xnvidia-tesla-v100", "on-demand", 2, 2.86),
            ("azure", "southcentralus", None, "Standard_NC6s_v3", "spot", 1, 0.4446),
            ("aws", "us-west-2", "us-west-2a", "p3.2xlarge", "spot", 1, 0.7919),
        )
    ]
    out = io.StringIO()
    render(rows, out=out)
    text = out.getvalue()
    assert max(map(len, text.splitlines())) <= 80
    for name in ("n1-standard-16+2xnvidia-tesla-v100", "southcentralus", "us-west-2a", "p3.2xlarge"):
        assert f" {name} " in text
    assert text.count("│ instance type ") == 3 and text.count("│ zone ") == 3


def test_wide_shows_the_columns_a_table_leaves_out(history: str) -> None:
    _, narrow, _ = cli("--db", history, "prices", "show", "--limit", "3")
    _, wide, _ = cli("--db", history, "prices", "show", "--limit", "3", "--wide")
    assert "source" not in narrow.split("\n")[3] and "--wide adds gpu, gpu_count" in narrow
    assert "source" in wide and "--wide adds" not in wide
    _, out, _ = cli("--db", history, "prices", "show", "--limit", "3", "-f", "json")
    assert set(strict_json(out)[0]) >= {"source", "gpu", "gpu_count", "usd_per_gpu_hour"}


def test_prices_show_caps_tables_and_streams_csv(sqlite_db: Database) -> None:
    start = datetime(2024, 5, 1)
    ingest(
        sqlite_db,
        [price("p3.2xlarge", f"{start + timedelta(minutes=i)}", 1 + i / 1000) for i in range(250)],
    )
    url = sqlite_db.engine.url.render_as_string()
    window = ["--since", "2024-05-01", "--instance-type", "p3.2xlarge", "--market", "spot"]
    code, out, err = cli("--db", url, "prices", "show", *window)
    assert code == 0 and out.count("p3.2xlarge") == 200
    assert "note: showing the first 200 price points and more match: --limit N shows more" in err
    code, out, err = cli("--db", url, "prices", "show", *window, "--limit", "250")
    assert code == 0 and out.count("p3.2xlarge") == 250 and "showing the first" not in err
    code, out, _ = cli("--db", url, "prices", "show", *window, "-f", "csv")
    assert code == 0 and len(out.splitlines()) == 251


def test_csv_and_json_are_written_while_rows_are_produced() -> None:
    """Rows stream: output is written before the generator is exhausted (constant memory)."""
    produced: list[int] = []
    seen_at_first_write: list[int] = []

    class Out(io.StringIO):
        def write(self, text: str) -> int:
            if not seen_at_first_write:
                seen_at_first_write.append(len(produced))
            return super().write(text)

    def rows() -> Iterator[dict[str, Any]]:
        for i in range(1000):
            produced.append(i)
            yield {"i": i}

    for fmt in ("csv", "json"):
        produced.clear()
        seen_at_first_write.clear()
        out = Out()
        render(rows(), fmt, out=out)
        assert seen_at_first_write[0] <= 1 and len(produced) == 1000
    assert json.loads(out.getvalue()) == [{"i": i} for i in range(1000)]


def test_bucket_work_is_bounded_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frames, "MAX_BUCKET_PIECES", 200)
    day = 86_400 * 1_000_000
    iv = pd.DataFrame({"start": [0, 0], "end": [60 * day, 70 * day], "usd_per_gpu_hour": [1.0, 2.0]})
    assert len(frames.split_buckets(iv, timedelta(days=1))) == 130
    with pytest.raises(InputError, match=r"make 3,120 market-buckets, more than 200; use a wider bucket"):
        frames.split_buckets(iv, timedelta(hours=1))


def test_an_empty_report_says_what_the_history_covers(history: str) -> None:
    code, out, _ = cli(
        "--db", history, "report", "run", "cheapest", "-p", "since=2020-01-01", "-p", "until=2020-01-08"
    )
    assert code == 0
    assert "no rows in 2020-01-01 00:00 – 2020-01-08 00:00" in out
    assert "the history covers 2024-04-26 – 2024-05-02" in out
    assert "-p since=2024-04-26 -p until=2024-05-02" in out


def test_report_list_says_which_gpu_parameters_are_required() -> None:
    _, out, _ = cli("report", "list", "-f", "json")
    params = {r["report"]: r["parameters"] for r in strict_json(out)}
    assert "gpu: GPU model (V100-32GB) or family (V100); required" in params["price-board"]
    assert "gpu: GPU model (V100-32GB) or family (V100); default all" in params["cheapest"]


def test_report_tables_leave_secondary_columns_to_wide(history: str) -> None:
    args = ["--db", history, "report", "run", "cheapest", *WINDOW]
    _, narrow, _ = cli(*args)
    _, wide, _ = cli(*args, "--wide")
    assert "--wide adds lowest_usd_per_gpu_hour, markets" in narrow and "lowest usd" not in narrow
    assert "┃ lowest" in wide and "--wide adds" not in wide  # its header wraps between words


def test_gpu_counts_are_whole_numbers_in_json_and_csv(history: str) -> None:
    _, out, _ = cli("--db", history, "report", "run", "price-board", "-p", "gpu=V100", "-f", "json")
    counts = {r["gpu_count"] for r in strict_json(out)}
    assert counts and all(type(c) is int for c in counts)
    _, out, _ = cli("--db", history, "prices", "show", "--limit", "5", "-f", "csv")
    assert ",1.0," not in out and ",4.0," not in out


def test_an_empty_price_listing_says_what_the_history_covers(history: str) -> None:
    code, out, _ = cli("--db", history, "prices", "show", "--until", "2001-01-01")
    assert code == 0 and "no price point matches these filters and times" in out
    assert "the history covers 2024-04-26 – 2024-05-02" in out
