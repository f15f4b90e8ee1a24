"""The daemon's view of the market: options priced at ``at`` from the history, with the forecast
learnt from the hours before ``at`` and nothing after it; option keys stable across snapshots."""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from spotopt.db.engine import Database
from spotopt.decide.options import enumerate_options, initial_state
from spotopt.history.market import snapshot
from spotopt.jobspec import parse_jobs
from spotopt.mover.market_view import market_view
from spotopt.types import MarketKind
from tests.helpers import ingest, price, t

SPEC = parse_jobs({"jobs": [{"name": "j", "throughput": {"K80": 1.0, "V100": 9.6}, "work": {"steps": 1e6}}]})
AT = t("2024-03-01 12:00")


def calm_history() -> list:  # type: ignore[type-arg]
    return [
        price("p3.2xlarge", "2024-01-01 00:00", 0.9),
        price("p2.xlarge", "2024-01-01 00:00", 0.3, zone="us-east-1b"),
        price("p3.2xlarge", "2024-01-01 00:00", 3.06, zone=None, kind=MarketKind.ON_DEMAND),
    ]


def test_a_calm_history_gives_the_snapshot_prices_plan_uses(db: Database) -> None:
    ingest(db, calm_history())
    with db.session() as session:
        view = market_view(session, SPEC, AT, [])
        markets = snapshot(session, AT)
    _, plain = initial_state(SPEC, enumerate_options(SPEC, markets, AT), markets, AT)
    assert view.options.n_options == plain.n_options > 0
    assert np.array_equal(view.options.key, plain.key)
    assert np.allclose(view.options.usd_per_hour, plain.usd_per_hour)
    assert np.allclose(view.options.baseline_usd_per_hour, view.options.usd_per_hour)
    assert np.isinf(view.options.revert_h).all()


def test_the_forecast_learns_from_the_past_and_reads_nothing_after_at(db: Database) -> None:
    records = calm_history()
    # Twelve past spikes of the V100 spot market, each 5 h long, then one that began 2 h before AT.
    for k in range(12):
        start = AT - timedelta(days=25) + timedelta(days=2 * k)
        records.append(price("p3.2xlarge", f"{start:%Y-%m-%d %H:%M}", 2.7))
        records.append(price("p3.2xlarge", f"{start + timedelta(hours=5):%Y-%m-%d %H:%M}", 0.9))
    records.append(price("p3.2xlarge", f"{AT - timedelta(hours=2):%Y-%m-%d %H:%M}", 2.7))
    ingest(db, records)
    with db.session() as session:
        before = market_view(session, SPEC, AT, [])
    spiking = before.options.usd_per_hour == 2.7
    assert spiking.any()
    assert np.allclose(before.options.baseline_usd_per_hour[spiking], 0.9)
    # expected to last 5 h in all, 2 h (plus the hour being decided) are gone: 2 h left
    assert np.allclose(before.options.revert_h[spiking], 2.0)
    ingest(db, [price("p3.2xlarge", f"{AT + timedelta(minutes=30):%Y-%m-%d %H:%M}", 0.1)], source="later")
    with db.session() as session:
        again = market_view(session, SPEC, AT, [])
    assert np.array_equal(again.options.usd_per_hour, before.options.usd_per_hour)
    assert np.array_equal(again.options.revert_h, before.options.revert_h)


def test_option_keys_and_locations_stay_valid_when_a_market_appears(db: Database) -> None:
    ingest(db, calm_history())
    locations: list[tuple[str, str]] = []
    with db.session() as session:
        first = market_view(session, SPEC, AT, locations)
    ingest(
        db,
        [price("p3.2xlarge", "2024-03-01 13:00", 0.8, region="us-west-2", zone="us-west-2a")],
        source="new",
    )
    with db.session() as session:
        later = market_view(session, SPEC, AT + timedelta(hours=2), locations)
    assert set(first.options.key.tolist()) < set(later.options.key.tolist())
    assert ("aws", "us-west-2") in locations and locations.index(("aws", "us-east-1")) == 0
    same = np.isin(later.options.key, first.options.key)
    assert np.array_equal(later.options.location[same], first.options.location)
