"""``spotopt import lifetimes``: recorded spot lives (CSV, spot-traces preemption JSON) into
``instance_lifetimes``, where the rate estimates and ``--preemptions replay`` read them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotopt.cli.imports import LIFETIMES_SOURCE
from spotopt.db.engine import Database
from spotopt.db.queries import observed_lifetimes, preemption_ends
from tests.import_helpers import counts, import_json, run_cli
from tests.traces import LIFETIMES_HEADER, TRACE_MARKET, spot_trace, stored_lifetimes, write_csv

T0 = datetime(2023, 4, 22, tzinfo=UTC)
MARKET = "aws,us-east-1,us-east-1a,p3.2xlarge"


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def test_csv_lifetimes_are_stored_once_and_read_as_preemptions(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    path = write_csv(
        tmp_path / "lives.csv",
        LIFETIMES_HEADER,
        [
            f"{MARKET},i-1,2023-04-22T00:00:00Z,2023-04-22T05:00:00Z,preempted",
            f"{MARKET},i-2,2023-04-22T06:00:00+02:00,2023-04-22T10:00:00Z,terminated",
            f"{MARKET},i-3,2023-04-22T12:00:00Z,,",
        ],
    )
    first = import_json(db_url, "lifetimes", path)
    assert (first["inserted"], first["source"]) == (3, LIFETIMES_SOURCE)
    assert stored_lifetimes(db_url) == [
        ("us-east-1a", "i-1", h(0), h(5), "preempted"),
        ("us-east-1a", "i-2", h(4), h(10), "terminated"),
        ("us-east-1a", "i-3", h(12), None, None),
    ]
    again = import_json(db_url, "lifetimes", path)
    assert (again["inserted"], again["duplicate"]) == (0, 3)
    with db.session() as session:
        ((market_id, ended),) = preemption_ends(session, h(0), h(24))
        # At h14: one preemption; exposure 5 h + 6 h + 2 h (the running one, censored at h14).
        assert (ended, observed_lifetimes(session, h(14), [market_id])) == (h(5), {market_id: (1, 13.0)})


def test_a_preemption_trace_is_one_life_per_run_of_ones(db_url: str, tmp_path: Path) -> None:
    # Probes every 30 s: gone, up, up, gone, gone, up, up, up (the probe stops while it runs).
    trace = spot_trace(tmp_path / "us-west-2a_v100_1.json", 30, [0, 1, 1, 0, 0, 1, 1, 1], prices=[0.9] * 8)
    args = ("--start", "2023-04-22T00:00:00Z", *TRACE_MARKET)
    assert import_json(db_url, "lifetimes", trace, *args)["inserted"] == 2
    s = timedelta(seconds=1)
    assert stored_lifetimes(db_url) == [
        ("us-west-2a", "probe-2023-04-22T00:00:30.000000Z", T0 + 30 * s, T0 + 90 * s, "preempted"),
        ("us-west-2a", "probe-2023-04-22T00:02:30.000000Z", T0 + 150 * s, T0 + 210 * s, "terminated"),
    ]
    assert import_json(db_url, "lifetimes", trace, *args)["inserted"] == 0


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            f"{MARKET},i-1,2023-04-22T00:00:00Z,2023-04-22T05:00:00Z,stopped",
            "line 2: end_reason: 'stopped' is not an end",
        ),
        (
            f"{MARKET},i-1,2023-04-22T00:00:00Z,2023-04-22T05:00:00Z,",
            "line 2: end_reason: empty while ended_at is set",
        ),
        (f"{MARKET},i-1,2023-04-22T00:00:00Z,,preempted", "line 2: ended_at: empty while end_reason is set"),
        (
            f"{MARKET},i-1,2023-04-22T05:00:00Z,2023-04-22T00:00:00Z,preempted",
            "line 2: ended_at: 2023-04-22 00:00:00 is before launched_at",
        ),
        (f"{MARKET},,2023-04-22T00:00:00Z,,", "line 2: instance_id: '' is not an instance id"),
        (f"{MARKET},i-1,noon,,", "line 2: launched_at: 'noon' is not an ISO 8601 time"),
        (
            "aws,us-east-1,us-east-1a,p3.2xlarge,i-1",
            "line 2: too few fields (no launched_at, ended_at, end_reason)",
        ),
    ],
)
def test_bad_rows_are_named_and_change_nothing(db_url: str, tmp_path: Path, row: str, message: str) -> None:
    path = write_csv(tmp_path / "lives.csv", LIFETIMES_HEADER, [f"{MARKET},i-0,2023-04-21T00:00:00Z,,", row])
    before = counts(db_url)
    result = run_cli(db_url, "import", "lifetimes", path)
    assert result.exit_code == 2, result.stdout
    assert (
        message.replace("line 2", "lives.csv: line 3") in result.stderr and "Traceback" not in result.stderr
    )
    assert counts(db_url) == before


def test_a_multi_node_preemption_trace_is_refused(db_url: str, tmp_path: Path) -> None:
    trace = spot_trace(tmp_path / "t.json", 300, [4, 3, 0])
    result = run_cli(db_url, "import", "lifetimes", trace, "--start", "2023-08-03T00:00:00Z", *TRACE_MARKET)
    assert result.exit_code == 2 and "t.json: data[0]: 4: a multi-node trace" in result.stderr
    assert stored_lifetimes(db_url) == []
