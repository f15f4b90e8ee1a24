"""Observed lifetimes refine a spot market's preemption rate (censored exponential, cloud prior)."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy import select

from spotopt.db.engine import Database
from spotopt.db.models import InstanceLifetime, Market
from spotopt.history.ingest import run_ingest
from spotopt.history.market import DEFAULT_RATE_PER_HOUR, PRIOR_HOURS, snapshot
from spotopt.types import InterruptionObservation
from spotopt.whatif.timeline import load_timeline
from tests.helpers import ingest, price, t

AT = t("2024-03-01 00:00")


def spot_rate(db: Database) -> tuple[float, str]:
    with db.session() as session:
        (state,) = [s for s in snapshot(session, AT) if s.quote.market == "spot"]
    return state.preemptions_per_hour, state.rate_source


def add_lives(db: Database, lives: list[tuple[str, str | None, str | None]]) -> None:
    with db.session() as session:
        market_id = session.scalar(select(Market.id).where(Market.kind == "spot"))
        for k, (start, end, reason) in enumerate(lives):
            session.add(
                InstanceLifetime(
                    market_id=market_id,
                    instance_ref=f"i-{k}",
                    started_at=t(start),
                    ended_at=None if end is None else t(end),
                    end_reason=reason,
                    source="test",
                )
            )


def test_without_lifetimes_the_cloud_rate_stands(db: Database) -> None:
    ingest(db, [price("p3.2xlarge", "2024-01-01 00:00", 0.9)])
    assert spot_rate(db) == (pytest.approx(DEFAULT_RATE_PER_HOUR["aws"]), "default")


def test_lifetimes_move_the_rate_with_censored_lives_and_nothing_after_at(db: Database) -> None:
    ingest(db, [price("p3.2xlarge", "2024-01-01 00:00", 0.9)])
    add_lives(
        db,
        [
            ("2024-02-01 00:00", "2024-02-01 10:00", "preempted"),  # 10 h, preempted
            ("2024-02-02 00:00", "2024-02-02 06:00", "preempted"),  # 6 h, preempted
            ("2024-02-03 00:00", "2024-02-03 20:00", "terminated"),  # 20 h, censored
            ("2024-02-29 20:00", None, None),  # still running: 4 h up to AT, censored
            ("2024-02-29 22:00", "2024-03-01 05:00", "preempted"),  # 2 h before AT; its end is later
            ("2024-03-02 00:00", "2024-03-02 01:00", "preempted"),  # after AT: unknown then
        ],
    )
    rate, source = spot_rate(db)
    events, hours = 2, 10 + 6 + 20 + 4 + 2
    prior = DEFAULT_RATE_PER_HOUR["aws"]
    assert rate == pytest.approx((events + prior * PRIOR_HOURS) / (hours + PRIOR_HOURS))
    assert source == "observed+default"
    assert rate > prior  # 2 preemptions in 42 h is worse than one per 48 h


def test_many_lifetimes_converge_to_the_observed_rate(db: Database) -> None:
    ingest(db, [price("p3.2xlarge", "2024-01-01 00:00", 0.9)])
    start = t("2024-01-02 00:00")
    lives = []
    for k in range(200):  # 200 lives of 5 h, one in four preempted: 50 per 1000 h
        begin = start + timedelta(hours=5 * k)
        end = begin + timedelta(hours=5)
        lives.append(
            (f"{begin:%Y-%m-%d %H:%M}", f"{end:%Y-%m-%d %H:%M}", "preempted" if k % 4 == 0 else "terminated")
        )
    add_lives(db, lives)
    rate, _ = spot_rate(db)
    assert rate == pytest.approx(50 / 1000, rel=0.05)


def advisor(zone: str | None, when: str, percent: float) -> InterruptionObservation:
    return InterruptionObservation(
        "aws", "us-east-1", zone, "p3.2xlarge", t(when), "advisor-bucket", percent, ""
    )


@pytest.mark.parametrize("hours", [0.0, 1.5, 2.0, 5.0, 20.0, 30.0, 34.0, 71.0])
def test_the_whatif_timeline_learns_the_rate_the_daemon_would_see_at_each_hour(
    db: Database, hours: float
) -> None:
    # The what-if engine loads the lives once and refines the rates as its clock advances; at
    # every hour they must be the daemon's snapshot then (the lives recorded by that time), and
    # a run's own lives (what a daemon records as it goes) count as if they had been recorded.
    ingest(db, [price("p3.2xlarge", "2024-01-01 00:00", 0.9)])
    # The cloud publishes rates before and during the window: the region's, then the zone's
    # own (which wins), then the region's again (which does not).
    run_ingest(
        db,
        "test",
        "advisor",
        [
            advisor(None, "2024-02-20 00:00", 10.0),
            advisor(None, "2024-03-01 02:00", 15.0),
            advisor("us-east-1a", "2024-03-01 20:00", 20.0),
            advisor(None, "2024-03-02 10:00", 5.0),
        ],
    )
    add_lives(
        db,
        [
            ("2024-02-01 00:00", "2024-02-01 10:00", "preempted"),  # before the window
            ("2024-02-28 20:00", "2024-03-01 03:00", "preempted"),  # ends in the window
            ("2024-02-29 00:00", "2024-03-02 00:00", "terminated"),  # censored in the window
            ("2024-03-01 04:00", None, None),  # starts in it, still running
            ("2024-03-01 06:00", "2024-03-01 20:00", "preempted"),
        ],
    )
    with db.session() as session:
        tl = load_timeline(session, AT, 72.0)
        (m,) = [i for i, s in enumerate(tl.markets) if s.quote.market == "spot"]
        (daemon,) = [s for s in snapshot(session, AT + timedelta(hours=hours)) if s.quote.market == "spot"]
    assert tl.rates_at(hours)[m] == pytest.approx(daemon.preemptions_per_hour, rel=1e-12)
    assert tl.rates_at(0.0)[m] == pytest.approx(tl.rate[m], rel=1e-12)
    own = (np.eye(tl.n_markets)[m] * 2, np.eye(tl.n_markets)[m] * 7.5)  # two preemptions in 7.5 h
    with db.session() as session:
        market_id = session.scalar(select(Market.id).where(Market.kind == "spot"))
        for k, (start, end) in enumerate([(-7.5, -5.0), (-5.0, 0.0)]):
            session.add(
                InstanceLifetime(
                    market_id=market_id,
                    instance_ref=f"own-{k}",
                    started_at=AT + timedelta(hours=hours + start),
                    ended_at=AT + timedelta(hours=hours + end),
                    end_reason="preempted",
                    source="spotopt-mover",
                )
            )
    with db.session() as session:
        (later,) = [s for s in snapshot(session, AT + timedelta(hours=hours)) if s.quote.market == "spot"]
    assert tl.rates_at(hours, own)[m] == pytest.approx(later.preemptions_per_hour, rel=1e-12)
