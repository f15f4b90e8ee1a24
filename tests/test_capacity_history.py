"""Capacity observations in the history: the table the migration builds, ``capacity_history``
(the engine's query) and the ``availability`` report, on a hand-built trace with known answers,
on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect, select

from spotopt.db.engine import Database
from spotopt.db.models import Market
from spotopt.db.queries import CapacityRow, capacity_history
from spotopt.errors import InputError
from spotopt.history.importers.availability_files import read_availability_trace
from spotopt.history.importers.spot_traces import TraceOptions, read_trace
from spotopt.history.ingest import run_ingest
from spotopt.reports.registry import REPORTS
from spotopt.types import AvailabilityObservation, MarketKey, MarketKind
from tests.helpers import cli, strict_json
from tests.traces import spot_trace

T0 = datetime(2024, 5, 1, tzinfo=UTC)
IMPORT, DAEMON = "import-availability", "daemon"


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def spot(zone: str, instance_type: str = "p3.2xlarge") -> MarketKey:
    return MarketKey("aws", "us-east-1", zone, instance_type, MarketKind.SPOT)


A, B, C, U = spot("us-east-1a"), spot("us-east-1b"), spot("us-east-1c"), spot("us-east-1d", "p9.unknown")


def observe(db: Database, source: str, *rows: tuple[MarketKey, float, bool]) -> None:
    records = [AvailabilityObservation(m, h(t), up, int(up), 1) for m, t, up in rows]
    run_ingest(db, source, "test", records)


@pytest.fixture
def trace(db: Database) -> Database:
    """Market A: up at h0, down h2 (seen again h3), up h5, down h10.
    Market B: first seen at h4, down; at h6 the import says up but the daemon down (the first
    source by name, ``daemon``, wins); the daemon saw it up at h8.
    Market C: seen only at h20, after the windows below. Market U: a type missing from the
    catalog (unknown GPU), up from h1."""
    observe(db, IMPORT, (A, 0, True), (A, 2, False), (A, 3, False), (A, 5, True), (A, 10, False))
    observe(db, IMPORT, (B, 4, False), (B, 6, True), (C, 20, True), (U, 1, True))
    observe(db, DAEMON, (B, 6, False), (B, 8, True))
    return db


def ids(db: Database) -> dict[str, int]:
    with db.session() as session:
        return {
            zone: i
            for i, zone in session.execute(select(Market.id, Market.zone).where(Market.kind == "spot"))
        }


def test_the_migration_builds_the_table_with_its_key_and_index(db: Database) -> None:
    inspector = inspect(db.engine)
    columns = {c["name"]: c["nullable"] for c in inspector.get_columns("capacity_observations")}
    assert columns == {
        "market_id": False,
        "observed_at": False,
        "source": False,
        "available": False,
        "launched": True,
        "requested": True,
        "run_id": True,
    }
    assert inspector.get_pk_constraint("capacity_observations")["constrained_columns"] == [
        "market_id",
        "observed_at",
        "source",
    ]
    indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes("capacity_observations")}
    assert indexes["ix_capacity_observations_observed_at"] == ["observed_at"]


def test_capacity_history_opens_with_the_observation_in_effect(trace: Database) -> None:
    m = ids(trace)
    a, b = m["us-east-1a"], m["us-east-1b"]
    with trace.session() as session:
        rows = capacity_history(session, [a, b], h(6), h(10))
        at_an_observation = capacity_history(session, [a], h(5), h(6))
        everything = capacity_history(session, None, h(0), h(30))
        assert capacity_history(session, [], h(0), h(30)) == []
    # A: h5 is in effect at h6, nothing inside (h10 is the window's end, left out). B: both
    # sources' rows at h6 (daemon first), then h8.
    assert rows == [
        CapacityRow(a, h(5), True, 1, 1, IMPORT),
        CapacityRow(b, h(6), False, 0, 1, DAEMON),
        CapacityRow(b, h(6), True, 1, 1, IMPORT),
        CapacityRow(b, h(8), True, 1, 1, DAEMON),
    ]
    assert at_an_observation == [CapacityRow(a, h(5), True, 1, 1, IMPORT)]  # once, not twice
    assert len(everything) == 11 and everything == sorted(
        everything, key=lambda r: (r.market_id, r.observed_at, r.source)
    )
    assert all(r.observed_at.tzinfo is UTC for r in everything)


def run(db: Database, **given: str) -> dict[str, pd.DataFrame]:
    report = REPORTS.lookup("availability")
    with db.session() as session:
        return report.run(session, report.parse(given, now=h(48))).sections


def test_report_shares_and_outages_on_a_hand_built_trace(trace: Database) -> None:
    sections = run(trace, since=h(1).isoformat(), until=h(12).isoformat())
    table = sections["markets"].set_index("zone")
    assert sorted(table.index) == ["us-east-1a", "us-east-1b", "us-east-1d"]  # C: no state before h12
    a, b, u = table.loc["us-east-1a"], table.loc["us-east-1b"], table.loc["us-east-1d"]
    # A over [h1, h12): up [1,2) and [5,10), down [2,5) and [10,12): 6 of 11 h; outages 3 h and 2 h.
    assert (a["hours"], a["available_share"], a["outages"]) == (11.0, 6 / 11, 2)
    assert (a["mean_outage_hours"], a["median_outage_hours"], a["max_outage_hours"]) == (2.5, 2.5, 3.0)
    assert (a["observations"], a["sources"]) == (4, IMPORT)  # h2, h3, h5, h10 (h0 opened the window)
    # B known from h4: down [4,8) (the daemon's h6 wins over the import's), up [8,12).
    assert (b["hours"], b["available_share"], b["outages"], b["max_outage_hours"]) == (8.0, 0.5, 1, 4.0)
    assert (b["observations"], b["sources"]) == (4, f"{DAEMON},{IMPORT}")
    assert (b["first_observed"], b["last_observed"]) == (pd.Timestamp(h(4)), pd.Timestamp(h(8)))
    # U (unknown GPU: still reported, availability needs no GPU count): up all along, no outage.
    assert (u["available_share"], u["outages"]) == (1.0, 0)
    assert pd.isna(u["gpu_model"]) and pd.isna(u["max_outage_hours"])
    outages = sections["outages"]
    assert [(r.zone, r.outage_from, r.outage_to, r.outage_hours) for r in outages.itertuples()] == [
        ("us-east-1a", pd.Timestamp(h(2)), pd.Timestamp(h(5)), 3.0),
        ("us-east-1a", pd.Timestamp(h(10)), pd.Timestamp(h(12)), 2.0),
        ("us-east-1b", pd.Timestamp(h(4)), pd.Timestamp(h(8)), 4.0),
    ]


def test_report_filters_and_an_empty_window(trace: Database) -> None:
    only_v100 = run(trace, gpu="V100", since=h(1).isoformat(), until=h(12).isoformat())["markets"]
    assert sorted(only_v100["zone"]) == ["us-east-1a", "us-east-1b"]
    before_any = run(
        trace, since=(T0 - timedelta(days=2)).isoformat(), until=(T0 - timedelta(days=1)).isoformat()
    )
    assert before_any["markets"].empty and before_any["outages"].empty


def test_a_window_after_the_observations_says_their_state_is_carried(trace: Database, db_url: str) -> None:
    # A week after the last observation, every market's row carries its last state (A out,
    # B and C and U up): the rows are right by the step rule, and a note on stderr says so,
    # with the span to ask for; stdout stays data only.
    report = REPORTS.lookup("availability")
    with trace.session() as session:
        inside = report.run(session, report.parse({"since": h(1).isoformat(), "until": h(12).isoformat()}))
        after = report.run(
            session, report.parse({"since": h(24 * 7).isoformat(), "until": h(24 * 8).isoformat()})
        )
    assert inside.notes == []
    assert after.sections["markets"]["observations"].tolist() == [0, 0, 0, 0]
    assert after.notes == [
        "no observation in this window for 4 of 4 markets: their rows carry the state of their "
        "last one before it (the latest at 2024-05-01 20:00 UTC); for the week before it, ask for "
        "-p until=2024-05-02"
    ]
    window = ["-p", f"since={h(24 * 7).isoformat()}", "-p", f"until={h(24 * 8).isoformat()}"]
    code, out, err = cli("--db", db_url, "report", "run", "availability", *window, "-f", "json")
    assert code == 0, err
    assert len(strict_json(out)["markets"]) == 4
    assert "no observation in this window" in err and "-p until=2024-05-02" in err
    # A window with capacity all along: its outages section is empty because there were none,
    # not because the history is (it once said "the history holds only catalog list prices").
    window = ["-p", f"since={h(8).isoformat()}", "-p", f"until={h(10).isoformat()}"]
    code, out, err = cli("--db", db_url, "report", "run", "availability", *window)
    assert code == 0, err
    assert "outages: none in 2024-05-01 08:00 – 2024-05-01 10:00" in out and "catalog" not in out


def test_report_cli_json_plot_and_sql(trace: Database, db_url: str, tmp_path: Path) -> None:
    window = ["-p", f"since={h(1).isoformat()}", "-p", f"until={h(12).isoformat()}"]
    png = tmp_path / "availability.png"
    code, out, err = cli(
        "--db", db_url, "report", "run", "availability", *window, "-f", "json", "--plot", png
    )
    assert code == 0, err
    result = strict_json(out)
    assert {m["zone"]: m["available_share"] for m in result["markets"]}["us-east-1a"] == 6 / 11
    assert len(result["outages"]) == 3
    assert png.read_bytes().startswith(b"\x89PNG")
    for dialect in ("sqlite", "postgresql"):
        code, out, err = cli("--db", db_url, "report", "sql", "availability", *window, "--dialect", dialect)
        assert code == 0 and "capacity_observations" in out, err


def test_report_lists_itself_with_a_plot() -> None:
    _code, out, _err = cli("report", "list", "-f", "json")
    (row,) = [r for r in json.loads(out) if r["report"] == "availability"]
    assert row["plot"] == "yes"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(st.integers(0, 1), min_size=1, max_size=60),
    gap_s=st.integers(1, 7200),
    noise=st.binary(max_size=30),
)
def test_a_trace_read_and_reported_gives_its_own_counts(
    tmp_path: Path, values: list[int], gap_s: int, noise: bytes
) -> None:
    """Any 0/1 trace, read as the importer reads it and reported over exactly its span: the share
    is the mean of the probes, the outages are its runs of zeros, the longest the longest run.
    Garbage (``noise``) instead of a trace is an ``InputError`` naming the file, never a crash."""
    path = spot_trace(tmp_path / "t.json", gap_s, values)
    options = TraceOptions(T0, A, None)
    records = list(read_availability_trace(path, options))
    assert [(r.observed_at, r.available) for r in records] == [
        (T0 + i * timedelta(seconds=gap_s), bool(v)) for i, v in enumerate(values)
    ]
    until = T0 + len(values) * timedelta(seconds=gap_s)
    frame = pd.DataFrame(
        {
            "market_id": 1,
            "cloud": "aws",
            "region": "us-east-1",
            "zone": "us-east-1a",
            "instance_type": "p3.2xlarge",
            "market": "spot",
            "gpu_model": "V100-16GB",
            "gpu_count": 1.0,
            "observed_at": [r.observed_at.isoformat() for r in records],
            "available": [r.available for r in records],
            "source": IMPORT,
        }
    )
    report = REPORTS.lookup("availability")
    args = report.parse({"since": T0.isoformat(), "until": until.isoformat()}, now=until)
    (row,) = report.compute({"observations": frame}, args).sections["markets"].itertuples()
    zero_runs = [len(list(run)) for up, run in itertools.groupby(values) if not up]
    assert row.available_share == pytest.approx(sum(values) / len(values))
    assert row.outages == len(zero_runs)
    if zero_runs:
        assert row.max_outage_hours == pytest.approx(max(zero_runs) * gap_s / 3600)
    garbage = tmp_path / "g.json"
    garbage.write_bytes(b"{" + noise)
    with pytest.raises(InputError, match=r"g\.json: "):
        read_trace(garbage)


def test_the_dashboard_page_shows_the_note_of_a_market_no_longer_observed(db: Database) -> None:
    # The page's window is the 30 days before the last observation: market C, seen 40 days
    # later than the others, leaves them with no observation inside it. Their rows carry their
    # last state, and the page says so with the report's note, as the CLI does on stderr.
    from spotopt.ui import views
    from spotopt.ui.app import templates

    observe(db, IMPORT, (A, 0, True), (A, 2, False), (B, 4, True), (C, 24 * 40, True))
    page = views.availability(db, h(24 * 41))
    assert [(row["zone"], row["observations"]) for row in page["markets"]] == [
        ("us-east-1a", 0),
        ("us-east-1b", 0),
        ("us-east-1c", 1),
    ]
    assert page["notes"] == [
        "no observation in this window for 2 of 3 markets: their rows carry the state of their "
        "last one before it (the latest at 2024-05-01 04:00 UTC); for the week before it, ask for "
        "-p until=2024-05-02"
    ]
    html = templates().get_template("availability.html").render(page_name="availability", **page)
    assert html.count('<p class="note">') == 1 and "2 of 3 markets" in html
    observe(db, IMPORT, (A, 24 * 39, True), (B, 24 * 39, True))
    html = (
        templates()
        .get_template("availability.html")
        .render(page_name="availability", **views.availability(db, h(24 * 41)))
    )
    assert '<p class="note">' not in html
