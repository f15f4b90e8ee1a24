"""Every report on the hand-made history of ``tests/report_history.py``, on SQLite and PostgreSQL.

The expected numbers are worked out by hand in the comments from the table in that module.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from sqlalchemy import bindparam, text

from spotopt.db.engine import Database
from spotopt.db.models import UTCDateTime
from spotopt.errors import InputError
from spotopt.history.setup import open_history
from spotopt.reports import survival
from spotopt.reports.registry import REPORTS
from tests import report_history as hist
from tests.report_history import h, iso

WINDOW = {"since": iso(0), "until": iso(48)}


def run(db: Database, name: str, **given: str) -> dict[str, pd.DataFrame]:
    report = REPORTS.lookup(name)
    args = report.parse(given, now=h(48))
    with db.session() as session:
        return report.run(session, args).sections


@pytest.fixture
def history(db: Database) -> Database:
    hist.build(db)
    return db


def rows(frame: pd.DataFrame, columns: list[str]) -> list[tuple[object, ...]]:
    return [tuple(r) for r in frame[columns].itertuples(index=False)]


def test_cheapest_per_day_per_cloud_and_overall(history: Database) -> None:
    table = run(history, "cheapest", gpu="V100", market="spot", **WINDOW)["cheapest"]
    got = rows(
        table, ["bucket", "cloud", "instance_type", "zone", "usd_per_gpu_hour", "lowest_usd_per_gpu_hour"]
    )
    day1, day2 = pd.Timestamp(h(0)), pd.Timestamp(h(24))
    # Day 1: A is 1.0 for 6 h then 0.5 for 18 h -> 0.625 (lowest 0.5); B 3.2/4 = 0.8; A2 0.9;
    # G 0.7 from h12. Day 2: A 0.5 for 6 h then 2.0 for 18 h -> 1.625, so B (0.8) is aws's cheapest
    # and G (0.7) the cheapest overall; A's 0.5 at the start of day 2 is still the lowest.
    assert got == [
        (day1, "all", "tst.v100.1", "us-east-1a", 0.625, 0.5),
        (day1, "aws", "tst.v100.1", "us-east-1a", 0.625, 0.5),
        (day1, "gcp", "tst-g-v100-1", "", 0.7, 0.7),
        (day2, "all", "tst-g-v100-1", "", 0.7, 0.5),
        (day2, "aws", "tst.v100.4", "us-east-1b", 0.8, 0.5),
        (day2, "gcp", "tst-g-v100-1", "", 0.7, 0.7),
    ]
    assert list(table["markets"]) == [4, 3, 1, 4, 3, 1]


def test_cheapest_hour_and_week_buckets(history: Database) -> None:
    hourly = run(history, "cheapest", gpu="V100", market="spot", cloud="aws", bucket="hour", **WINDOW)
    table = hourly["cheapest"]
    assert len(table) == 48 and set(table["cloud"]) == {"aws"}
    assert table.loc[table["bucket"] == pd.Timestamp(h(5)), "usd_per_gpu_hour"].item() == 0.8
    assert table.loc[table["bucket"] == pd.Timestamp(h(6)), "usd_per_gpu_hour"].item() == 0.5
    weekly = run(history, "cheapest", gpu="V100", market="on-demand", bucket="week", **WINDOW)["cheapest"]
    # 2024-05-01 is a Wednesday: the ISO week starts on Monday 2024-04-29.
    assert set(weekly["bucket"]) == {pd.Timestamp("2024-04-29", tz="UTC")}
    overall = weekly[weekly["cloud"] == "all"].iloc[0]
    # OD is 3.0 for 36 h and 1.8 for 12 h -> 2.7; OD4 12/4 = 3.0; ODW 3.0; GOD 2.1 -> GOD.
    assert (overall["instance_type"], overall["usd_per_gpu_hour"]) == ("tst-g-v100-1", 2.1)


def test_volatility_per_market(history: Database) -> None:
    table = run(history, "volatility", gpu="V100", **WINDOW)["volatility"]
    assert list(table["market"].unique()) == ["spot"]
    a = table[(table["zone"] == "us-east-1a")].iloc[0]
    # A over [0, 48): 1.0 for 6 h, 0.5 for 24 h, 2.0 for 18 h; two changes in two days.
    assert a["changes"] == 2 and a["changes_per_day"] == 1.0
    assert (a["min_usd_per_hour"], a["median_usd_per_hour"], a["max_usd_per_hour"]) == (0.5, 0.5, 2.0)
    assert a["mean_usd_per_hour"] == pytest.approx(54 / 48)
    mean = 54 / 48
    std = math.sqrt((6 * 1.0 + 24 * 0.25 + 18 * 4.0) / 48 - mean**2)
    assert a["cv"] == pytest.approx(std / mean)
    # On-demand drops to 1.8 at h36 while spot is 2.0: 12 of 48 hours at or above on-demand.
    assert a["share_at_or_above_on_demand"] == pytest.approx(0.25)
    assert table.iloc[0]["zone"] == "us-east-1a"  # the most volatile first
    g = table[table["cloud"] == "gcp"].iloc[0]
    assert (g["hours"], g["changes"], g["cv"], g["share_at_or_above_on_demand"]) == (36.0, 0, 0.0, 0.0)


def test_spot_discount_best_case_and_median(history: Database) -> None:
    table = run(history, "spot-discount", gpu="V100", **WINDOW)["spot-discount"].set_index(
        ["cloud", "region"]
    )
    east = table.loc[("aws", "us-east-1")]
    # A vs OD: 3 (6 h), 6 (24 h), 1.5 (6 h), 0.9 (12 h); B vs OD4: 12/3.2 = 3.75 (48 h).
    # Pooled over 96 h the time-weighted median is 3.75; the best case 6.0 from h6 on A.
    assert (east["best_x"], east["median_x"]) == (6.0, 3.75)
    assert (east["best_instance_type"], east["best_zone"], east["best_at"]) == (
        "tst.v100.1",
        "us-east-1a",
        pd.Timestamp(h(6)),
    )
    assert (east["spot_usd_per_gpu_hour"], east["on_demand_usd_per_gpu_hour"], east["spot_markets"]) == (
        0.5,
        3.0,
        2,
    )
    assert table.loc[("aws", "us-west-2"), "best_x"] == pytest.approx(3.0 / 0.9)
    gcp = table.loc[("gcp", "us-central1")]
    assert (gcp["best_x"], gcp["median_x"], gcp["hours"]) == (pytest.approx(3.0), pytest.approx(3.0), 36.0)


def test_regional_spread(history: Database) -> None:
    table = run(history, "regional-spread", gpu="V100", **WINDOW)["regional-spread"]
    aws = table[table["cloud"] == "aws"]
    # Day 1: us-east-1's best market is A (0.625), us-west-2 has A2 at 0.9.
    # Day 2: us-east-1's best is B (0.8), us-west-2 still 0.9.
    assert rows(aws, ["cheapest_region", "cheapest_usd_per_gpu_hour", "priciest_region", "regions"]) == [
        ("us-east-1", 0.625, "us-west-2", 2),
        ("us-east-1", 0.8, "us-west-2", 2),
    ]
    assert list(aws["spread_x"]) == pytest.approx([0.9 / 0.625, 0.9 / 0.8])
    gcp = table[table["cloud"] == "gcp"]
    assert list(gcp["spread_x"]) == [1.0, 1.0]


def test_price_board_at_a_time(history: Database) -> None:
    board = run(history, "price-board", gpu="V100", at=iso(12))["price-board"]
    # G's point at exactly h12 counts (at or before T); A's 0.5 beats source zz's 0.9 at h6.
    assert rows(board, ["cloud", "region", "instance_type", "market", "usd_per_gpu_hour", "source"]) == [
        ("aws", "us-east-1", "tst.v100.1", "spot", 0.5, "test"),
        ("gcp", "us-central1", "tst-g-v100-1", "spot", 0.7, "test"),
        ("aws", "us-east-1", "tst.v100.4", "spot", 0.8, "test"),
        ("aws", "us-west-2", "tst.v100.1", "spot", 0.9, "test"),
        ("gcp", "us-central1", "tst-g-v100-1", "on-demand", 2.1, "test"),
        ("aws", "us-east-1", "tst.v100.1", "on-demand", 3.0, "test"),
        ("aws", "us-east-1", "tst.v100.4", "on-demand", 3.0, "test"),
        ("aws", "us-west-2", "tst.v100.1", "on-demand", 3.0, "test"),
    ]
    assert board.iloc[0]["since"] == pd.Timestamp(h(6))
    before = run(history, "price-board", gpu="V100", at=iso(-50))["price-board"]
    assert set(before["market"]) == {"on-demand"}  # no spot market had a price yet


def test_interruptions_observations_and_survival(history: Database) -> None:
    sections = run(history, "interruptions", gpu="V100", **WINDOW)
    obs = sections["observations"]
    assert rows(obs, ["bucket", "kind", "observations", "mean_value", "last_value"])[:1] == [
        (pd.Timestamp(h(0)), "advisor-bucket", 2, 12.5, 15.0)
    ]
    assert rows(obs, ["bucket", "kind", "observations"])[1:] == [
        (pd.Timestamp(h(0)), "preemption", 1),
        (pd.Timestamp(h(24)), "advisor-bucket", 1),
    ]
    surv = sections["survival"].set_index("zone")
    a = surv.loc["us-east-1a"]
    # Lifetimes on A: 3 (P), 5 (P), 8 (P), 8 (censored: ended after `until`), 10 (terminated),
    # 46 (running). KM: S = 5/6 after 3 h, x 4/5 after 5 h, x 3/4 after 8 h = 0.5 -> median 8 h.
    # Dropping the censored ones would give a median of 5 h.
    assert (a["instances"], a["preempted"], a["censored"]) == (6, 3, 3)
    assert (a["median_hours"], a["survival_24h"], a["longest_hours"]) == (8.0, pytest.approx(0.5), 46.0)
    b = surv.loc["us-east-1b"]
    assert math.isnan(b["median_hours"]) and b["survival_24h"] == 1.0 and b["censored"] == 1
    only = run(history, "interruptions", part="survival", **WINDOW)
    assert list(only) == ["survival"]


def test_kaplan_meier_edge_cases() -> None:
    assert math.isnan(survival.median([], []))
    assert survival.median([2.0, 4.0], [True, True]) == 2.0
    # Censored at the same time as an event: still at risk at that time.
    assert survival.curve([1.0, 1.0, 2.0], [True, False, True])[1].tolist() == pytest.approx([2 / 3, 0.0])
    assert math.isnan(survival.survival_at([1.0, 2.0], [True, False], 5.0))
    assert survival.survival_at([1.0, 2.0], [True, True], 5.0) == 0.0


def test_coverage(history: Database) -> None:
    sections = run(history, "coverage", gpu="V100", since=iso(-10), until=iso(48), gap_hours="20")
    markets = sections["markets"].set_index(["region", "zone", "market", "instance_type"])
    a = markets.loc[("us-east-1", "us-east-1a", "spot", "tst.v100.1")]
    # A in [h-10, h48): h-1, h6 (two sources), h30; the h6 -> h30 step is a 24 h gap.
    assert (a["points"], a["gaps"], a["longest_gap_hours"], a["hours_since_last"]) == (4, 1, 24.0, 18.0)
    assert (a["first_observed"], a["last_observed"]) == (pd.Timestamp(h(-1)), pd.Timestamp(h(30)))
    od = markets.loc[("us-east-1", "", "on-demand", "tst.v100.1")]
    assert (od["points"], od["first_observed"], od["hours_since_last"]) == (1, pd.Timestamp(h(-100)), 12.0)
    assert rows(sections["gaps"], ["zone", "gap_from", "gap_to", "gap_hours"]) == [
        ("us-east-1a", pd.Timestamp(h(6)), pd.Timestamp(h(30)), 24.0)
    ]
    runs = sections["runs"].set_index("source")
    assert runs.loc["zz", "status"] == "failed" and "lost its connection" in runs.loc["zz", "error"]
    assert (runs.loc["test", "status"], runs.loc["test", "inserted"]) == ("ok", len(hist.PRICES))
    exact = run(history, "coverage", gpu="V100", since=iso(-10), until=iso(48), gap_hours="24")
    assert exact["gaps"].empty  # a gap of exactly 24 h is not longer than 24 h


def _interval_rows(db: Database, where: str, **binds: object) -> pd.DataFrame:
    stmt = text(f"SELECT * FROM price_intervals WHERE {where} ORDER BY market_id, valid_from, source")
    stmt = stmt.bindparams(*(bindparam(k, type_=UTCDateTime()) for k in binds))
    with db.session() as session:
        result = session.execute(stmt, binds)
        frame = pd.DataFrame(result.fetchall(), columns=list(result.keys()))
    for col in ("valid_from", "valid_to"):
        frame[col] = pd.to_datetime(frame[col], utc=True, format="ISO8601")
    return frame


def test_price_intervals_view_matches_the_reports(history: Database) -> None:
    until = pd.Timestamp(h(48))
    a = _interval_rows(history, "instance_type = 'tst.v100.1' AND zone = 'us-east-1a'")
    assert list(zip(a["source"], a["usd_per_hour"], strict=True)) == [
        ("test", 1.0),
        ("test", 0.5),
        ("zz", 0.9),
        ("test", 2.0),
    ]
    assert a.loc[1, "valid_to"] == pd.Timestamp(h(30))
    assert a.loc[2, "valid_from"] == a.loc[2, "valid_to"]  # zz's duplicate holds for no time
    assert pd.isna(a.iloc[-1]["valid_to"])  # the last point is still in effect
    start = a["valid_from"].clip(lower=pd.Timestamp(h(0)))
    end = a["valid_to"].fillna(until).clip(upper=until)
    hours = ((end - start).dt.total_seconds() / 3600).clip(lower=0)
    volatility = run(history, "volatility", gpu="V100", **WINDOW)["volatility"]
    expected = volatility.loc[volatility["zone"] == "us-east-1a", "mean_usd_per_hour"].item()
    assert (a["usd_per_hour"] * hours).sum() / hours.sum() == pytest.approx(expected)

    at = h(12)
    board = run(history, "price-board", gpu="V100", at=iso(12))["price-board"]
    live = _interval_rows(
        history,
        "valid_from <= :at AND (valid_to > :at OR valid_to IS NULL) AND gpu_model LIKE 'V100%'",
        at=at,
    )
    assert sorted(zip(live["instance_type"], live["zone"], live["usd_per_gpu_hour"], strict=True)) == sorted(
        zip(board["instance_type"], board["zone"], board["usd_per_gpu_hour"], strict=True)
    )


def test_latest_prices_view_matches_the_price_board(history: Database) -> None:
    with history.session() as session:
        result = session.execute(
            text("SELECT instance_type, zone, market, usd_per_gpu_hour, source FROM latest_prices")
        )
        latest = sorted(tuple(r) for r in result)
    board = run(history, "price-board", gpu="V100", at=iso(48))["price-board"]
    assert latest == sorted(rows(board, ["instance_type", "zone", "market", "usd_per_gpu_hour", "source"]))


def test_sqlite_and_postgresql_give_identical_frames(sqlite_db: Database, pg_url: str) -> None:
    pg_db = open_history(pg_url)
    try:
        hist.build(sqlite_db)
        hist.build(pg_db)
        cases = [(name, dict(WINDOW)) for name in REPORTS if name != "price-board"]
        cases += [("price-board", {"at": iso(12), "gpu": "V100"}), ("cheapest", {**WINDOW, "bucket": "hour"})]
        cases += [("coverage", {"since": iso(-200), "until": iso(48), "gap_hours": "5"})]
        for name, given in cases:
            lite, pg = run(sqlite_db, name, **given), run(pg_db, name, **given)
            assert list(lite) == list(pg)
            for section in lite:
                assert not lite[section].empty or name == "coverage", (name, section)
                if section == "runs":  # started/finished are the clock of each run
                    lite[section] = lite[section].drop(columns=["started_at", "finished_at"])
                    pg[section] = pg[section].drop(columns=["started_at", "finished_at"])
                pd.testing.assert_frame_equal(
                    lite[section], pg[section], check_exact=True, obj=f"{name}/{section}"
                )
    finally:
        pg_db.dispose()


@pytest.mark.parametrize(
    ("name", "given", "message"),
    [
        (
            "cheapest",
            {"bucket": "month"},
            "parameter bucket: 'month' is not valid; use one of hour, day, week",
        ),
        ("cheapest", {"bukcet": "day"}, "unknown parameter 'bukcet' (did you mean 'bucket'?)"),
        ("volatility", {"market": "reserved"}, "parameter market"),
        ("cheapest", {"gpu": "Q900"}, "parameter gpu: 'Q900' matches no GPU model"),
        ("cheapest", {"since": "yesterday"}, "parameter since"),
        ("cheapest", {"since": iso(10), "until": iso(0)}, "parameter since"),
        ("coverage", {"gap_hours": "-3"}, "parameter gap_hours"),
        ("price-board", {}, "parameter 'gpu' is required"),
    ],
)
def test_bad_parameters_name_the_parameter(name: str, given: dict[str, str], message: str) -> None:
    with pytest.raises(InputError) as err:
        REPORTS.lookup(name).parse(given)
    assert message in str(err.value)


def test_unknown_report_suggests_a_name() -> None:
    with pytest.raises(InputError, match=r"did you mean 'spot-discount'\?.*reports: availability, cheapest"):
        REPORTS.lookup("spot-discont")
