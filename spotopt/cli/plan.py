"""``spotopt plan JOBS.yaml --policy NAME``: where each job should run, for what share, at what cost."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from spotopt.cli.common import WideOption, parse_time, state
from spotopt.db.queries import MarketFilter
from spotopt.errors import InputError
from spotopt.history.market import snapshot
from spotopt.history.throughput_store import stored_figures
from spotopt.jobspec import load_jobs
from spotopt.plan import build_problem, plan_report, solve
from spotopt.policies.base import get_policy
from spotopt.render import Format, render, say, to_json, usd

COLUMNS = [
    "job",
    "where",
    "instance_type",
    "market",
    "gpus",
    "share",
    "cost_usd",
    "finish_h",
    "slack_h",
    "usd_per_step",
    "runner_up",
    "throughput",
    "age_days",
    "stale",
]
"""Table columns; ``runner_up`` is the best $/step among options the job did not get, ``age_days``
the price's age and ``stale`` whether it is older than the setting ``price_max_age_days`` (a job
is planned on a stale price only when it has no fresh one); ``throughput`` the figure's source
and, for an estimate, its 80 % interval. JSON has all fields."""


def plan(
    ctx: typer.Context,
    jobs_file: Annotated[Path, typer.Argument(metavar="JOBS.yaml", help="Job spec (docs/guides/plan.md).")],
    policy: Annotated[
        str, typer.Option(help="min-cost, min-cost-slo, min-makespan-budget or max-throughput.")
    ] = "min-cost-slo",
    at: Annotated[
        str | None, typer.Option(help="Plan with prices at this time (ISO 8601, default now).")
    ] = None,
    budget: Annotated[
        float | None, typer.Option(min=0, help="Total budget in USD (min-makespan-budget).")
    ] = None,
    capacity: Annotated[
        float | None,
        typer.Option(min=0, help="Instances per market you may hold at once (default unlimited)."),
    ] = None,
    horizon: Annotated[
        float | None,
        typer.Option(min=1, help="Planning horizon in hours (default max(720, latest deadline))."),
    ] = None,
    billing: Annotated[
        str,
        typer.Option(
            help="instance (rent whole instances, as the daemon does) or gpu (the thesis' packing)."
        ),
    ] = "instance",
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table, csv or json.")] = Format.TABLE,
    wide: WideOption = False,
) -> None:
    """Plan jobs on the markets priced at --at with a policy; shows shares, cost, finish and slack."""
    get_policy(policy)  # an unknown name fails before any work, with a did-you-mean
    if budget is not None and policy != "min-makespan-budget":
        raise InputError(f"--budget is used by the min-makespan-budget policy only, not by {policy}")
    spec = load_jobs(jobs_file)
    when = parse_time(at, "--at") or datetime.now(UTC)
    with state(ctx).db().session() as session:
        markets = snapshot(session, when, MarketFilter())
        figures = stored_figures(session)
    if not markets:
        raise InputError(
            f"--at {when.isoformat()}: no market has a price then; import prices or pick another time"
        )
    problem = build_problem(
        spec,
        markets,
        when,
        figures,
        horizon_hours=horizon,
        budget_usd=budget,
        capacity=math.inf if capacity is None else capacity,
        billing=billing,
    )
    report = plan_report(problem, solve(policy, problem.input), str(jobs_file))
    for warning in report["warnings"]:
        say(warning, label="warning:", style="yellow", err=True)
    if fmt is Format.JSON:
        typer.echo(to_json(report))
        return
    for job in report["jobs"]:  # JSON has them per job as "excluded"
        if job["excluded"]:
            ruled_out = "; ".join(
                f"{x['gpu_model']} x{x['gpu_count']}: {x['reason']}" for x in job["excluded"]
            )
            say(f"{job['name']}: not offered {ruled_out} (memory)", label="note:", err=True)
    render(
        _rows(report),
        fmt,
        title=_title(report),
        columns=COLUMNS,
        caption=f"stale: last priced more than {report['price_max_age_days']:g} days before "
        "(setting price_max_age_days), used only where a job has no fresh price",
        wide_only=("gpus", "share", "usd_per_step", "runner_up", "throughput"),
        wide=wide,
    )


def _title(report: dict[str, Any]) -> str:
    return (
        f"{report['policy']}: {report['status']}, total {usd(report['total_cost_usd'])}, "
        f"makespan {report['makespan_hours'] or math.inf:.1f} h (prices at {report['at']:%Y-%m-%d %H:%M} UTC)"
    )


def _rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for job in report["jobs"]:
        runner = job["runner_up"]
        for k, item in enumerate(job["allocation"]):
            first = k == 0
            rows.append(
                {
                    "job": job["name"] if first else "",
                    "where": f"{item['cloud']}/{item['zone'] or item['region']}",
                    "instance_type": item["instance_type"],
                    "market": item["market"],
                    "gpus": item["gpus"],
                    "share": item["share"],
                    "cost_usd": job["cost_usd"] if first else None,
                    "finish_h": job["finish_hours"] if first else None,
                    "slack_h": job["slack_hours"] if first else None,
                    "usd_per_step": item["usd_per_step"],
                    "runner_up": runner["usd_per_step"] if first and runner else None,
                    "throughput": _throughput(item),
                    "age_days": item["price_age_days"],
                    "stale": item["stale"],
                }
            )
    return rows


def _throughput(item: dict[str, Any]) -> str:
    """The figure's source, with its 80 % interval (effective steps/s) where it is an estimate."""
    if item["throughput_low"] == item["throughput_high"]:
        return str(item["throughput_source"])
    return f"{item['throughput_source']} {item['throughput_low']:.3g}-{item['throughput_high']:.3g}/s"
