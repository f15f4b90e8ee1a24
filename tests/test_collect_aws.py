"""AWS collectors against offline fakes (moto + scripted operations + responses), on both databases."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import responses
from moto import mock_aws
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotopt.clouds.aws.advisor import bucket_upper_bound, snapshot_time
from spotopt.db.engine import Database
from spotopt.db.models import InstanceType, Interruption, Market, PricePoint, Run, Watermark
from spotopt.history import collect as collect_module
from spotopt.history.collect import CollectRequest, ScopeResult, run_collect
from tests.collect_fakes import (
    ADVISOR_URL,
    NOW,
    AwsError,
    AwsFake,
    Sleeps,
    aws_env,
    fixture,
    no_wait_retry,
    script_aws_defaults,
)

LAST_MODIFIED = "Thu, 19 Nov 2026 23:05:12 GMT"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsFake]:
    aws_env(monkeypatch)
    with mock_aws():
        yield AwsFake()


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.get(
            ADVISOR_URL, json=fixture("aws", "spot_advisor.json"), headers={"Last-Modified": LAST_MODIFIED}
        )
        yield mock


def collect(db: Database, fake: AwsFake, sleeps: Sleeps | None = None, **request: Any) -> list[ScopeResult]:
    request.setdefault("regions", ("us-east-1",))
    now = request.pop("now", NOW)
    return run_collect(
        db,
        CollectRequest(clouds=("aws",), **request),
        lambda cloud: fake.clients(),
        retry=no_wait_retry(sleeps),
        now=now,
    )


def by_name(results: list[ScopeResult]) -> dict[str, ScopeResult]:
    return {f"{r.collector}/{r.scope}": r for r in results}


def spot_points(db: Database) -> list[tuple[str, str, str, float, str]]:
    with db.session() as s:
        rows = s.execute(
            select(
                InstanceType.name,
                Market.zone,
                PricePoint.observed_at,
                PricePoint.usd_per_hour,
                Market.zone_id,
            )
            .join(Market, Market.instance_type_id == InstanceType.id)
            .join(PricePoint, PricePoint.market_id == Market.id)
            .where(PricePoint.source == "aws-spot-prices")
            .order_by(InstanceType.name, Market.zone, PricePoint.observed_at)
        )
        return [(n, z, t.isoformat(), p, zid) for n, z, t, p, zid in rows]


def test_collect_all_aws_collectors(db: Database, fake: AwsFake, rsps: responses.RequestsMock) -> None:
    script_aws_defaults(fake)
    results = by_name(collect(db, fake))

    assert {k: r.status for k, r in results.items()} == {
        "aws-catalog/us-east-1": "ok",
        "aws-spot-prices/us-east-1": "ok",
        "aws-on-demand/us-east-1": "ok",
        "aws-placement-scores/us-east-1": "ok",
        "aws-spot-advisor/global": "ok",
    }
    # Spot history: two pages, zone IDs learnt, a Windows price and a bad price rejected.
    assert spot_points(db) == [
        ("g5.2xlarge", "us-east-1a", "2026-11-18T03:02:11+00:00", 0.5139, "use1-az6"),
        ("g5.xlarge", "us-east-1a", "2026-09-01T00:00:00+00:00", 0.431, "use1-az6"),
        ("g5.xlarge", "us-east-1a", "2026-11-20T09:14:03+00:00", 0.4123, "use1-az6"),
        ("g5.xlarge", "us-east-1b", "2026-11-19T22:40:51+00:00", 0.3981, "use1-az1"),
    ]
    spot = results["aws-spot-prices/us-east-1"]
    assert (spot.inserted, spot.rejected) == (4, 2)
    assert "malformed item ×1" in spot.note and "not a Linux/UNIX price" in spot.note
    # The first run backfills the 90 days AWS keeps, asking for GPU types only, Linux only.
    asked = fake.requests["DescribeSpotPriceHistory"]
    assert [a.get("NextToken") for a in asked] == [None, "page-2"]
    assert asked[0]["StartTime"] == NOW - timedelta(days=90) and asked[0]["EndTime"] == NOW
    assert sorted(asked[0]["InstanceTypes"]) == ["g5.2xlarge", "g5.xlarge", "g9x.4xlarge"]
    assert asked[0]["ProductDescriptions"] == ["Linux/UNIX"]

    with db.session() as s:
        # Catalog: the unknown GPU is kept verbatim and reported; the bundled facts of g5.xlarge win.
        g9 = s.scalar(select(InstanceType).where(InstanceType.name == "g9x.4xlarge"))
        assert g9 is not None and (g9.gpu_model, g9.gpu_name_raw, g9.gpu_count) == (None, "NVIDIA Z900", 2)
        assert g9.origin == "aws-catalog"
        g5 = s.scalar(select(InstanceType).where(InstanceType.name == "g5.xlarge"))
        assert g5 is not None and (g5.gpu_model, g5.origin) == ("A10G", "catalog")
        on_demand = s.execute(
            select(InstanceType.name, PricePoint.usd_per_hour)
            .join(Market, Market.instance_type_id == InstanceType.id)
            .join(PricePoint, PricePoint.market_id == Market.id)
            .where(PricePoint.source == "aws-on-demand")
            .order_by(InstanceType.name)
        ).all()
        interruptions = s.execute(
            select(
                InstanceType.name, Interruption.zone, Interruption.kind, Interruption.value, Interruption.raw
            )
            .join(InstanceType, InstanceType.id == Interruption.instance_type_id)
            .order_by(Interruption.kind, InstanceType.name, Interruption.zone)
        ).all()
        advisor_times = set(
            s.scalars(select(Interruption.observed_at).where(Interruption.kind == "advisor-bucket"))
        )
        runs = s.execute(select(Run.source, Run.scope, Run.status, Run.inserted).order_by(Run.id)).all()
        marks = {c: u for c, u in s.execute(select(Watermark.collector, Watermark.until))}
    assert on_demand == [("g5.2xlarge", 1.212), ("g5.xlarge", 1.006)]  # m5.large is no GPU type
    assert "catalog" in results["aws-catalog/us-east-1"].note or results["aws-catalog/us-east-1"].unknown
    assert results["aws-catalog/us-east-1"].unknown == ["g9x.4xlarge (NVIDIA Z900)"]
    assert "malformed item" in results["aws-catalog/us-east-1"].note
    assert interruptions == [
        ("g5.2xlarge", "", "advisor-bucket", 100.0, ">20%"),
        ("g5.xlarge", "", "advisor-bucket", 10.0, "5-10%"),
        # use1-az99 is no zone of the region: rejected, not guessed.
        ("g5.2xlarge", "us-east-1b", "placement-score", 7.0, "7"),
        ("g5.2xlarge", "us-east-1c", "placement-score", 3.0, "3"),
        ("g5.xlarge", "us-east-1b", "placement-score", 7.0, "7"),
        ("g5.xlarge", "us-east-1c", "placement-score", 3.0, "3"),
        ("g9x.4xlarge", "us-east-1b", "placement-score", 7.0, "7"),
        ("g9x.4xlarge", "us-east-1c", "placement-score", 3.0, "3"),
    ]
    assert {t.isoformat() for t in advisor_times} == {"2026-11-19T23:05:12+00:00"}
    assert sorted(runs) == [
        ("aws-catalog", "us-east-1", "ok", 1),
        ("aws-on-demand", "us-east-1", "ok", 2),
        ("aws-placement-scores", "us-east-1", "ok", 6),
        ("aws-spot-advisor", "global", "ok", 2),
        ("aws-spot-prices", "us-east-1", "ok", 4),
    ]
    assert marks["aws-spot-prices"] == NOW


def test_second_run_starts_at_the_watermark_inserts_no_duplicate_and_leaves_no_gap(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock
) -> None:
    script_aws_defaults(fake)
    collect(db, fake)
    before = spot_points(db)
    later = NOW + timedelta(hours=6)
    fake.script("ec2", "DescribeSpotPriceHistory", fixture("aws", "spot_history_later.json"))
    results = by_name(collect(db, fake, now=later))

    asked = fake.requests["DescribeSpotPriceHistory"][-1]
    # Starts before the first run's end: the windows overlap, so nothing between them is missed.
    assert asked["StartTime"] <= NOW and asked["StartTime"] == NOW - timedelta(hours=1)
    assert asked["EndTime"] == later
    spot = results["aws-spot-prices/us-east-1"]
    assert (spot.inserted, spot.duplicate) == (1, 1)
    assert spot_points(db) == sorted(
        [*before, ("g5.xlarge", "us-east-1a", "2026-11-20T15:31:00+00:00", 0.4207, "use1-az6")]
    )
    # The same list prices (same effective date) and the same advisor snapshot are not stored again.
    on_demand = results["aws-on-demand/us-east-1"]
    assert (on_demand.inserted, on_demand.duplicate) == (0, 2)
    assert results["aws-spot-advisor/global"].inserted == 0
    with db.session() as s:
        assert s.get(Watermark, ("aws-spot-prices", "us-east-1")).until == later  # type: ignore[union-attr]


def test_throttling_then_success_is_retried_with_jittered_backoff(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock
) -> None:
    script_aws_defaults(fake)
    fake.script(
        "ec2",
        "DescribeSpotPriceHistory",
        AwsError("RequestLimitExceeded", 503),
        AwsError("Throttling", 400),
        fixture("aws", "spot_history_page1.json"),
        fixture("aws", "spot_history_page2.json"),
    )
    sleeps = Sleeps()
    results = by_name(collect(db, fake, sleeps))
    assert results["aws-spot-prices/us-east-1"].status == "ok"
    assert results["aws-spot-prices/us-east-1"].inserted == 4
    # rng 0.5 × min(cap, 1 s · 2^(n-1)): bounded, growing, never the full ceiling.
    assert sleeps == [0.5, 1.0]


def test_5xx_that_exhausts_retries_fails_one_scope_and_keeps_the_others(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock
) -> None:
    script_aws_defaults(fake)
    fake.answer("ec2", "DescribeSpotPriceHistory", lambda p: AwsError("InternalError", 500))
    sleeps = Sleeps()
    results = by_name(collect(db, fake, sleeps))
    failed = results["aws-spot-prices/us-east-1"]
    assert failed.status == "failed"
    assert "aws/us-east-1: ec2:DescribeSpotPriceHistory failed: still failing after 3 attempts" in failed.note
    assert len(fake.requests["DescribeSpotPriceHistory"]) == 3 and len(sleeps) == 2
    assert results["aws-on-demand/us-east-1"].status == "ok"
    assert spot_points(db) == []
    with db.session() as s:
        assert s.get(Watermark, ("aws-spot-prices", "us-east-1")) is None
        run = s.scalar(select(Run).where(Run.source == "aws-spot-prices"))
        assert run is not None and run.status == "failed" and "InternalError" in (run.error or "")


def test_permanent_error_is_not_retried(db: Database, fake: AwsFake, rsps: responses.RequestsMock) -> None:
    script_aws_defaults(fake)
    fake.answer("pricing", "GetProducts", lambda p: AwsError("InvalidParameterException", 400))
    sleeps = Sleeps()
    result = by_name(collect(db, fake, sleeps))["aws-on-demand/us-east-1"]
    assert result.status == "failed" and "pricing:GetProducts" in result.note
    assert len(fake.requests["GetProducts"]) == 1 and sleeps == []


def test_crash_mid_scope_leaves_that_watermark_where_its_committed_data_ends(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock
) -> None:
    script_aws_defaults(fake)
    collect(db, fake)  # us-east-1 committed up to NOW
    later = NOW + timedelta(hours=6)

    def second_page_breaks(params: dict[str, Any]) -> Any:
        if params.get("NextToken"):
            return AwsError("InvalidNextToken", 400)
        return fixture("aws", "spot_history_later.json") | {"NextToken": "page-2"}

    fake.answer("ec2", "DescribeSpotPriceHistory", second_page_breaks)
    results = by_name(collect(db, fake, now=later))
    assert results["aws-spot-prices/us-east-1"].status == "failed"
    assert results["aws-on-demand/us-east-1"].status == "ok"
    with db.session() as s:
        assert s.get(Watermark, ("aws-spot-prices", "us-east-1")).until == NOW  # type: ignore[union-attr]
    assert ("g5.xlarge", "us-east-1a", "2026-11-20T15:31:00+00:00", 0.4207, "use1-az6") not in spot_points(db)


def test_empty_region_and_gpu_filter(db: Database, fake: AwsFake, rsps: responses.RequestsMock) -> None:
    script_aws_defaults(fake)
    fake.answer("ec2", "DescribeSpotPriceHistory", lambda p: {"SpotPriceHistory": []})
    results = by_name(collect(db, fake, gpus=("A10G",)))
    spot = results["aws-spot-prices/us-east-1"]
    assert (spot.status, spot.records, spot.inserted) == ("ok", 0, 0)
    assert sorted(fake.requests["DescribeSpotPriceHistory"][0]["InstanceTypes"]) == [
        "g5.2xlarge",
        "g5.xlarge",
    ]
    assert results["aws-catalog/us-east-1"].unknown == []
    asked = {r["InstanceTypes"][0] for r in fake.requests["GetSpotPlacementScores"]}
    assert asked == {"g5.2xlarge", "g5.xlarge"}


def test_placement_scores_not_permitted_is_skipped_with_a_note(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock
) -> None:
    script_aws_defaults(fake)
    fake.answer("ec2", "GetSpotPlacementScores", lambda p: AwsError("UnauthorizedOperation", 403))
    results = by_name(collect(db, fake))
    scores = results["aws-placement-scores/us-east-1"]
    assert scores.status == "skipped"
    assert "not permitted" in scores.note and "spot placement scores" in scores.note
    assert results["aws-spot-prices/us-east-1"].status == "ok"


def test_without_credentials_aws_is_reported_and_the_advisor_still_runs(
    db: Database, monkeypatch: pytest.MonkeyPatch, rsps: responses.RequestsMock
) -> None:
    aws_env(monkeypatch)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key)
    from spotopt.clouds.aws.adaptor import AwsClients

    results = run_collect(
        db, CollectRequest(clouds=("aws",)), lambda cloud: AwsClients(), retry=no_wait_retry(), now=NOW
    )
    statuses = {r.collector: (r.status, r.note) for r in results}
    assert statuses["aws-spot-advisor"][0] == "ok"
    status, note = statuses["aws-spot-prices"]
    assert status == "skipped" and note.startswith("configure AWS credentials")
    assert note.endswith("to collect spot price history")
    with db.session() as s:
        assert s.scalar(select(Interruption.id).where(Interruption.kind == "advisor-bucket")) is not None


def test_default_regions_come_from_describe_regions(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock
) -> None:
    script_aws_defaults(fake)
    results = collect(db, fake, regions=())
    assert {r.scope for r in results} == {"us-east-1", "global"}


def test_malformed_advisor_document_is_a_rejection(db: Database, fake: AwsFake) -> None:
    script_aws_defaults(fake)
    with responses.RequestsMock() as mock:
        mock.get(ADVISOR_URL, json={"ranges": "nope"})
        result = by_name(collect(db, fake))["aws-spot-advisor/global"]
    assert (result.status, result.rejected) == ("ok", 1) and "malformed document" in result.note


@pytest.mark.parametrize(
    ("label", "bound"), [("<5%", 5.0), ("5-10%", 10.0), ("15-20%", 20.0), (">20%", 100.0), ("n/a", None)]
)
def test_advisor_bucket_upper_bound(label: str, bound: float | None) -> None:
    assert bucket_upper_bound(label) == bound


def test_a_page_token_handed_back_twice_fails_instead_of_looping(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock
) -> None:
    script_aws_defaults(fake)
    fake.answer("ec2", "DescribeSpotPriceHistory", lambda p: fixture("aws", "spot_history_page1.json"))
    result = by_name(collect(db, fake))["aws-spot-prices/us-east-1"]
    assert result.status == "failed" and "pagination repeated a page token" in result.note
    assert len(fake.requests["DescribeSpotPriceHistory"]) == 2


def _spot_requests_by_type(fake: AwsFake) -> dict[str, Any]:
    """instance type → StartTime of the spot-history requests (first pages) that asked for it."""
    return {
        name: asked["StartTime"]
        for asked in fake.requests["DescribeSpotPriceHistory"]
        if not asked.get("NextToken")
        for name in asked["InstanceTypes"]
    }


def test_a_gpu_filtered_run_does_not_cost_the_other_types_their_backfill(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock
) -> None:
    script_aws_defaults(fake)
    collect(db, fake, gpus=("A10G",))  # g5.xlarge and g5.2xlarge, up to NOW
    later = NOW + timedelta(hours=6)
    fake.requests["DescribeSpotPriceHistory"].clear()
    fake.answer("ec2", "DescribeSpotPriceHistory", lambda p: {"SpotPriceHistory": []})
    results = by_name(collect(db, fake, now=later))

    assert results["aws-spot-prices/us-east-1"].status == "ok"
    assert _spot_requests_by_type(fake) == {
        "g5.xlarge": NOW - timedelta(hours=1),
        "g5.2xlarge": NOW - timedelta(hours=1),
        "g9x.4xlarge": later - timedelta(days=90),  # never collected: the full backfill
    }
    with db.session() as s:
        rows = s.execute(
            select(Watermark.scope, Watermark.until).where(Watermark.collector == "aws-spot-prices")
        )
        marks = {scope: until for scope, until in rows}
    assert marks == {
        "us-east-1": later,  # only the unfiltered run covered the whole region
        "us-east-1/g5.xlarge": later,
        "us-east-1/g5.2xlarge": later,
        "us-east-1/g9x.4xlarge": later,
    }


def test_a_type_aws_adds_later_gets_its_backfill(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock
) -> None:
    script_aws_defaults(fake)
    fake.answer(
        "ec2",
        "DescribeInstanceTypes",
        lambda p: fixture("aws", "instance_types_page1.json") | {"NextToken": None},
    )
    collect(db, fake)  # the region offers g5.xlarge only
    assert {n for a in fake.requests["DescribeSpotPriceHistory"] for n in a["InstanceTypes"]} == {"g5.xlarge"}
    later = NOW + timedelta(days=2)
    fake.requests["DescribeSpotPriceHistory"].clear()
    fake.answer(
        "ec2",
        "DescribeInstanceTypes",
        lambda p: fixture(
            "aws", "instance_types_page2.json" if p.get("NextToken") else "instance_types_page1.json"
        ),
    )
    fake.answer("ec2", "DescribeSpotPriceHistory", lambda p: {"SpotPriceHistory": []})
    collect(db, fake, now=later)

    assert _spot_requests_by_type(fake) == {
        "g5.xlarge": NOW - timedelta(hours=1),
        "g5.2xlarge": later - timedelta(days=90),
        "g9x.4xlarge": later - timedelta(days=90),
    }


@pytest.mark.parametrize(("code", "status"), [("AuthFailure", 401), ("InvalidClientTokenId", 403)])
def test_rejected_credentials_fail_the_scope_instead_of_skipping_it(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock, code: str, status: int
) -> None:
    script_aws_defaults(fake)
    fake.answer("ec2", "DescribeSpotPriceHistory", lambda p: AwsError(code, status))
    spot = by_name(collect(db, fake))["aws-spot-prices/us-east-1"]
    assert spot.status == "failed"
    assert spot.note.startswith("aws/us-east-1: ec2:DescribeSpotPriceHistory failed: credentials rejected:")
    assert len(fake.requests["DescribeSpotPriceHistory"]) == 1  # not retried


def test_a_crash_in_the_write_after_a_flushed_batch_leaves_nothing_of_that_scope(
    db: Database, fake: AwsFake, rsps: responses.RequestsMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    script_aws_defaults(fake)
    collect(db, fake)  # committed up to NOW
    before = spot_points(db)
    with db.session() as s:
        marks_before = {
            scope: until
            for scope, until in s.execute(
                select(Watermark.scope, Watermark.until).where(Watermark.collector == "aws-spot-prices")
            )
        }
    monkeypatch.setattr("spotopt.history.ingest.BATCH_ROWS", 1)  # every price is flushed as it comes
    flushed: list[int] = []

    advance = collect_module._advance

    def crash(session: Session, collector: str, scope: str, until: datetime) -> None:
        advance(session, collector, scope, until)
        if collector == "aws-spot-prices" and "/" in scope:
            # Inside the spot scope's write: its rows flushed, region and one type watermark moved.
            spot = select(func.count()).where(PricePoint.source == "aws-spot-prices")
            flushed.append(session.scalar(spot) or 0)
            raise RuntimeError("disk full")

    monkeypatch.setattr(collect_module, "_advance", crash)
    fake.script("ec2", "DescribeSpotPriceHistory", fixture("aws", "spot_history_later.json"))
    results = by_name(collect(db, fake, now=NOW + timedelta(hours=6)))

    spot = results["aws-spot-prices/us-east-1"]
    assert spot.status == "failed" and spot.note == "RuntimeError: disk full"
    assert flushed[0] == len(before) + 1  # the new point had been written when the crash came
    assert spot_points(db) == before
    with db.session() as s:
        marks_after = {
            scope: until
            for scope, until in s.execute(
                select(Watermark.scope, Watermark.until).where(Watermark.collector == "aws-spot-prices")
            )
        }
        run = s.scalars(select(Run).where(Run.source == "aws-spot-prices").order_by(Run.id)).all()[-1]
    assert marks_after == marks_before
    assert marks_after["us-east-1/g5.xlarge"] == NOW
    assert (run.status, run.inserted) == ("failed", 0)


@pytest.mark.parametrize(
    "header",
    ["Thu, 19 Nov 2026 23:05:12 GMT", "Thu, 19 Nov 2026 23:05:12 -0000", "Fri, 20 Nov 2026 00:05:12 +0100"],
)
def test_advisor_snapshot_time_is_utc_whatever_the_zone_spelling(header: str) -> None:
    at = snapshot_time({"Last-Modified": header}, NOW)
    assert at.tzinfo is not None and at.utcoffset() == timedelta(0)
    assert at == datetime(2026, 11, 19, 23, 5, 12, tzinfo=UTC)
