"""The ledger (``spotopt.mover.ledger``) and ``spotopt jobs cost``: each placement billed by its
cloud's rule at the price in effect, on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select

from spotopt.db.engine import Database
from spotopt.db.models import Market, PricePoint
from spotopt.mover import ledger
from tests.helpers import cli, ingest, price, strict_json, t
from tests.mover_rows import AWS_V100, AZURE_V100, GCP_V100, T0, market_id, place, seed_markets, submit


def rows(db: Database, job_id: int, now: datetime = T0 + timedelta(days=1)) -> list[ledger.Interval]:
    with db.session() as session:
        return ledger.intervals(session, job_id, now)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def test_each_cloud_bills_by_its_rule(db: Database, tmp_path: Path) -> None:
    seed_markets(db)
    job = submit(db, tmp_path)
    aws, aws_od = market_id(db, AWS_V100), market_id(db, AWS_V100, "on-demand")
    gcp, azure = market_id(db, GCP_V100), market_id(db, AZURE_V100)
    cases = [
        # (market, ran, end reason, billed seconds, $/h)
        (aws, s(30), "terminated", 60, 0.90),  # AWS: 60 s minimum
        (aws, s(1200), "preempted", 0, 0.90),  # AWS spot reclaimed within the first hour: free
        (aws, s(7200), "preempted", 7200, 0.90),  # reclaimed after it: every second
        (aws, s(1200), "exited", 1200, 0.90),  # ended by us (or its job) early: per second
        (aws_od, s(1200), "preempted", 1200, 3.06),  # the refund is a Spot rule, not on-demand's
        (gcp, s(45), "preempted", 60, 0.74),  # GCP: one minute minimum, no refund
        (azure, s(6 * 60 + 45), "terminated", 360, 0.60),  # Azure: whole minutes (its FAQ's 6m45s)
        (azure, s(59), "preempted", 0, 0.60),
    ]
    start = T0
    for market, ran, reason, _, _ in cases:
        place(db, job, market, start, start + ran, reason)
        start += timedelta(hours=3)
    found = rows(db, job)
    assert [(r.billed_s, r.usd_per_hour) for r in found] == [(c[3], pytest.approx(c[4])) for c in cases]
    for row, (_, _, reason, billed, usd) in zip(found, cases, strict=True):
        assert row.cost_usd == pytest.approx(usd * billed / 3600)
        assert row.end_reason == reason
    assert [r.cloud for r in found] == ["aws"] * 5 + ["gcp", "azure", "azure"]
    assert found[0].market == "aws/us-east-1/us-east-1a/p3.2xlarge/spot"
    assert found[4].market == "aws/us-east-1/-/p3.2xlarge/on-demand"
    assert ledger.total_usd(found) == pytest.approx(sum(r.cost_usd for r in found))
    with db.session() as session:
        spent = ledger.spent_usd(session, job, T0 + timedelta(days=1))
    assert spent == pytest.approx(ledger.total_usd(found))


def test_a_price_change_mid_interval_is_time_weighted(db: Database, tmp_path: Path) -> None:
    """$0.90 until 12:30, then $2.10 (two sources report 12:30; the later name holds):
    a placement 12:00-13:30 pays (0.5 h x 0.90 + 1 h x 2.10) / 1.5 h = $1.70/h on average."""
    seed_markets(db)
    ingest(db, [price(AWS_V100, "2026-03-01 12:30", 2.50)], source="a-feed")
    ingest(db, [price(AWS_V100, "2026-03-01 12:30", 2.10)], source="b-feed")
    job = submit(db, tmp_path)
    aws = market_id(db, AWS_V100)
    place(db, job, aws, T0, T0 + timedelta(minutes=90), "terminated")
    # half an instance per job slot (two jobs share one): half the instance price
    place(db, job, aws, T0, T0 + timedelta(minutes=90), "terminated", instances=0.5, usd_per_hour=0.45)
    whole, half = rows(db, job)
    assert whole.usd_per_hour == pytest.approx((0.5 * 0.90 + 1.0 * 2.10) / 1.5)
    assert (whole.billed_s, whole.cost_usd) == (5400, pytest.approx(0.5 * 0.90 + 1.0 * 2.10))
    assert half.usd_per_hour == pytest.approx(whole.usd_per_hour / 2)
    assert half.cost_usd == pytest.approx(whole.cost_usd / 2)


def test_before_the_first_price_the_launch_price_holds(db: Database, tmp_path: Path) -> None:
    seed_markets(db)  # first price at 11:00
    job = submit(db, tmp_path)
    aws = market_id(db, AWS_V100)
    place(db, job, aws, T0 - timedelta(hours=2), T0 - timedelta(hours=1), "terminated", usd_per_hour=1.2)
    place(db, job, aws, T0 - timedelta(hours=2), T0, "terminated", usd_per_hour=1.2)
    early, spanning = rows(db, job)
    assert early.usd_per_hour == pytest.approx(1.2)
    assert spanning.usd_per_hour == pytest.approx((1.2 + 0.9) / 2)


def test_running_instances_bill_up_to_now_and_unstarted_ones_not_at_all(db: Database, tmp_path: Path) -> None:
    seed_markets(db)
    job = submit(db, tmp_path)
    aws = market_id(db, AWS_V100)
    second = place(db, job, aws, T0 + timedelta(hours=1), None, epoch=2)
    first = place(db, job, aws, T0, T0 + timedelta(hours=1), "terminated", epoch=1)
    place(db, job, aws, None, epoch=3)  # a launch in flight: nothing to bill yet
    found = rows(db, job, now=T0 + timedelta(hours=3))
    assert [r.placement_id for r in found] == [first, second]  # oldest first
    assert (found[1].ended_at, found[1].end_reason, found[1].billed_s) == (None, None, 7200)
    assert [r.epoch for r in found] == [1, 2]
    # a running AWS instance seen just after launch already owes its 60 s minimum
    assert rows(db, job, now=T0 + timedelta(hours=1, seconds=5))[1].billed_s == 60


def test_cli_jobs_cost(db_url: str, db: Database, tmp_path: Path) -> None:
    seed_markets(db)
    job = submit(db, tmp_path)
    aws, azure = market_id(db, AWS_V100), market_id(db, AZURE_V100)
    place(db, job, aws, T0, T0 + timedelta(minutes=20), "preempted", epoch=1)
    resumed = T0 + timedelta(minutes=25)
    place(db, job, azure, resumed, resumed + timedelta(minutes=65, seconds=30), "exited", epoch=2)
    started = datetime.now(UTC) - timedelta(hours=1)
    place(db, job, aws, started, None, epoch=3, provider="aws")

    code, out, err = cli("--db", db_url, "jobs", "cost", "resnet", "--format", "json")
    assert code == 0, err
    doc = strict_json(out)
    assert doc["job"] == "resnet" and doc["budget_usd"] == 50.0
    first, second, third = doc["intervals"]
    assert (first["end_reason"], first["billed_s"], first["cost_usd"]) == ("preempted", 0, 0)
    assert (second["billed_s"], second["cost_usd"]) == (3900, pytest.approx(0.60 * 3900 / 3600))
    assert second["market"] == "azure/eastus/-/Standard_NC6s_v3/spot" and second["epoch"] == 2
    assert (third["ended_at"], third["end_reason"], third["provider"]) == (None, "running", "aws")
    assert 3600 <= third["billed_s"] < 3600 + 600  # billed up to the command's now
    assert doc["total_usd"] == pytest.approx(sum(i["cost_usd"] for i in doc["intervals"]))
    documented = "placement_id epoch provider instance_id market started_at ended_at end_reason"
    documented += " usd_per_hour billed_s cost_usd egress_from egress_to egress_gb egress_usd"
    assert set(first) == set(documented.split())  # as docs/guides/managed-jobs.md says
    assert set(doc) == {"job", "at", "total_usd", "egress_usd", "budget_usd", "intervals"}

    code, out, _ = cli("--db", db_url, "jobs", "cost", "resnet", "--format", "csv")
    header, *lines = out.splitlines()
    assert code == 0 and header.startswith("placement_id,epoch,provider,instance_id,market,started_at")
    assert len(lines) == 3 and lines[1].endswith(",exited,0.6,3900.0,0.65,,,0.0,0.0")  # no move: no egress

    code, out, _ = cli("--db", db_url, "jobs", "cost", "resnet")
    assert code == 0
    # The title's total is the column's (the rows, rounded together, add up to it: render.usd_summed)
    title = re.search(r"Job resnet: \$([\d,.]+) over 3 instance interval\(s\)", out)
    assert title is not None and float(title.group(1).replace(",", "")) == pytest.approx(
        doc["total_usd"], abs=0.005
    )
    assert "running" in out and "--wide adds epoch, provider, instance_id" in out


def test_cli_jobs_cost_of_a_job_that_never_ran_or_of_none(db_url: str, db: Database, tmp_path: Path) -> None:
    submit(db, tmp_path)
    code, out, _ = cli("--db", db_url, "jobs", "cost", "resnet", "--format", "json")
    assert code == 0 and strict_json(out)["total_usd"] == 0.0 and strict_json(out)["intervals"] == []
    code, out, _ = cli("--db", db_url, "jobs", "cost", "resnet")
    assert code == 0 and "no instance has run yet" in out
    code, _, err = cli("--db", db_url, "jobs", "cost", "nope")
    assert code == 2 and "no managed job named 'nope'" in err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    points=st.dictionaries(st.integers(0, 599), st.floats(0.01, 10.0), max_size=8),
    start=st.integers(-60, 660),
    minutes=st.integers(0, 300),
)
def test_price_in_effect_is_the_mean_of_the_step_function(
    db: Database, points: dict[int, float], start: int, minutes: int
) -> None:
    """Against a brute force: the price minute by minute (the last point at or before it, the
    fallback before the first), averaged over the interval."""
    base = t("2026-01-01 00:00")
    with db.session() as session:
        market = session.scalar(select(Market.id).order_by(Market.id).limit(1))
        assert market is not None
        session.execute(delete(PricePoint).where(PricePoint.market_id == market))
        for offset, usd in points.items():
            at = base + timedelta(minutes=offset)
            session.add(PricePoint(market_id=market, observed_at=at, source="test", usd_per_hour=usd))
    fallback = 0.5

    def at_minute(m: int) -> float:
        known = [o for o in points if o <= m]
        return points[max(known)] if known else fallback

    begin, end = base + timedelta(minutes=start), base + timedelta(minutes=start + minutes)
    expected = (
        at_minute(start) if minutes == 0 else sum(map(at_minute, range(start, start + minutes))) / minutes
    )
    with db.session() as session:
        assert ledger.price_in_effect(session, market, begin, end, fallback) == pytest.approx(expected)
