"""The daemon and the what-if engine decide through one function: on a frozen market, the
daemon's first round places every managed job where the what-if engine's ``spotopt`` strategy
places it at the same moment, from the same SQL history."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import yaml

from spotopt.db.engine import Database
from spotopt.decide.guardrails import Guardrails
from spotopt.jobspec import JobSpec, parse_jobs
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.types import MarketKey, MarketKind, PriceObservation
from spotopt.whatif.preemptions import PreemptionMode
from spotopt.whatif.replay import ReplayRequest, replay
from tests.helpers import ingest
from tests.test_decision_core import AT, JOBS, MARKETS


def frozen_history() -> list[PriceObservation]:
    """Every market of the decision-core tests at a constant price from a week before AT on."""
    out = []
    for cloud, region, zone, itype, kind, _gpu, _count, usd, _rate in MARKETS:
        key = MarketKey(cloud, region, zone, itype, MarketKind(kind))
        out += [PriceObservation(key, AT + timedelta(days=d), usd) for d in range(-7, 20)]
    return out


def test_the_daemon_places_each_job_where_the_whatif_engine_does(db: Database, tmp_path: Path) -> None:
    ingest(db, frozen_history())
    for job in JOBS["jobs"]:
        managed = {**job, "run": "python train.py", "checkpoint": {"uri": "ckpt"}, "budget_usd": 1000}
        path = tmp_path / f"{job['name']}.yaml"
        path.write_text(yaml.safe_dump({"jobs": [managed]}), encoding="utf-8")
        jobstore.submit(db, path, now=AT)
    settings = DaemonSettings(period_h=1.0, guardrails=Guardrails(period_h=1.0), dry_run=True)
    report = Daemon(db, None, settings, clock=lambda: AT).tick()
    daemon = {d["job"]: (d["to"], d["gpus"]) for d in report.decisions}

    spec = JobSpec(jobs=parse_jobs(JOBS).jobs)
    result = replay(
        db, ReplayRequest(spec=spec, start=AT, strategies=("spotopt",), preemptions=PreemptionMode.NONE)
    )
    first: dict[str, tuple[str, int]] = {}
    for p in result.placements():
        if p["job"] not in first:
            where = p["zone"] or p["region"]
            first[p["job"]] = (f"{p['cloud']}/{where}/{p['instance_type']}/{p['market']}", p["gpus"])
    assert set(daemon) == {j["name"] for j in JOBS["jobs"]}
    assert daemon == first


def test_a_job_past_its_deadline_is_still_placed_as_soon_as_it_can(db: Database, tmp_path: Path) -> None:
    # A job can outlive its deadline (a replay of the example jobs did); the round must not stop
    # on it as `spotopt plan --at` refuses a past deadline: the core finishes it as soon as it
    # can, as the what-if engine does with jobs past their deadline: on its quickest option
    # (4 V100s on spot, 8.6 h at the low end of its figure; no on-demand option is within 5 % of
    # it: the quickest of those takes 24 h), a deadline move.
    ingest(db, frozen_history())
    (job,) = [j for j in JOBS["jobs"] if j.get("deadline")][:1]
    managed = {**job, "run": "python train.py", "checkpoint": {"uri": "ckpt"}, "budget_usd": 1000}
    path = tmp_path / "late.yaml"
    path.write_text(yaml.safe_dump({"jobs": [managed]}), encoding="utf-8")
    jobstore.submit(db, path, now=AT)
    late = AT + timedelta(days=19)
    settings = DaemonSettings(period_h=1.0, guardrails=Guardrails(period_h=1.0), dry_run=True)
    report = Daemon(db, None, settings, clock=lambda: late).tick()
    (decision,) = report.decisions
    assert decision["job"] == job["name"] and decision["kind"] == "start"
    assert (decision["reason"], decision["to"]) == ("deadline", "aws/us-west-2b/p3.8xlarge/spot")
