"""``interruptions``: interruption data per market over time, and the survival of spot instances.

Section ``observations``: per time bucket and (instance type, region, zone, kind) the number of
observations and their mean, lowest, highest and last value, where ``kind`` is what the source
measured (``advisor-bucket`` in % per month, ``placement-score`` 1–10, ``eviction-rate`` in %,
``preemption`` = one observed preemption, so its count is the number of preemptions).

Section ``survival``: per spot market, the lifetimes of instances started in the window, with
the Kaplan–Meier median life in hours and the probability of surviving 24 h. Instances still
running at ``until`` or terminated by their owner count as censored, not as preemptions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sqlalchemy import select

from spotopt.db.models import InstanceLifetime, InstanceType, Interruption, Market
from spotopt.reports import frames, params, survival
from spotopt.reports.base import AnySelect, Args, Param, Report, ReportResult
from spotopt.reports.sql import MARKET_COLUMNS, MARKET_SELECT, filter_markets, raw

PARTS = ("all", "observations", "survival")
OBS_KEYS = ["bucket", "cloud", "region", "zone", "instance_type", "gpu_model", "kind"]
OBS_COLUMNS = [*OBS_KEYS, "observations", "mean_value", "min_value", "max_value", "last_value"]
SURVIVAL_COLUMNS = [
    *MARKET_COLUMNS,
    "instances",
    "preempted",
    "censored",
    "median_hours",
    "survival_24h",
    "longest_hours",
]


def statements(args: Args) -> dict[str, AnySelect]:
    out: dict[str, AnySelect] = {}
    if args["part"] in ("all", "observations"):
        obs = (
            select(
                InstanceType.cloud,
                Interruption.region,
                Interruption.zone,
                InstanceType.name.label("instance_type"),
                InstanceType.gpu_model,
                Interruption.kind,
                Interruption.value,
                raw(Interruption.observed_at).label("observed_at"),
            )
            .join(InstanceType, InstanceType.id == Interruption.instance_type_id)
            .where(Interruption.observed_at >= args["since"], Interruption.observed_at < args["until"])
        )
        if args.get("gpu"):
            gpu = args["gpu"]
            obs = obs.where((InstanceType.gpu_model == gpu) | InstanceType.gpu_model.like(f"{gpu}-%"))
        if args.get("cloud"):
            obs = obs.where(InstanceType.cloud == args["cloud"])
        if args.get("region"):
            obs = obs.where(Interruption.region == args["region"])
        out["observations"] = obs
    if args["part"] in ("all", "survival"):
        lifetimes = (
            select(
                *MARKET_SELECT,
                raw(InstanceLifetime.started_at).label("started_at"),
                raw(InstanceLifetime.ended_at).label("ended_at"),
                InstanceLifetime.end_reason,
            )
            .select_from(InstanceLifetime)
            .join(Market, Market.id == InstanceLifetime.market_id)
            .join(InstanceType, InstanceType.id == Market.instance_type_id)
            .where(InstanceLifetime.started_at >= args["since"], InstanceLifetime.started_at < args["until"])
        )
        out["lifetimes"] = filter_markets(
            lifetimes, {**args, "market": "spot"}
        )  # lifetimes of spot instances
    return out


def _observations(rows: pd.DataFrame, args: Args) -> pd.DataFrame:
    rows = rows.assign(zone=rows["zone"].fillna(""), t=frames.to_us(rows["observed_at"]))
    rows["bucket"] = frames.bucket_of(rows["t"].to_numpy(dtype=np.int64), params.BUCKETS[args["bucket"]])
    rows = rows.sort_values([*OBS_KEYS, "t"], kind="stable")
    grouped = rows.groupby(OBS_KEYS, sort=True, dropna=False)["value"]
    table = pd.DataFrame(
        {
            "observations": grouped.size(),
            "mean_value": grouped.mean(),
            "min_value": grouped.min(),
            "max_value": grouped.max(),
            "last_value": grouped.last(),
        }
    ).reset_index()
    table["bucket"] = frames.from_us(table["bucket"].to_numpy(dtype=np.int64))
    return table[OBS_COLUMNS]


def _survival(rows: pd.DataFrame, args: Args) -> pd.DataFrame:
    until_us = frames.dt_us(args["until"])
    start = frames.to_us(rows["started_at"])
    ended = rows["ended_at"]
    end = np.full(len(rows), until_us, dtype=np.int64)
    has_end = ended.notna().to_numpy()
    end[has_end] = frames.to_us(ended[has_end])
    # An end after ``until`` was not known at ``until``: censor there, like a running instance.
    preempted = has_end & (rows["end_reason"] == "preempted").to_numpy() & (end <= until_us)
    rows = rows.assign(
        zone=rows["zone"].fillna(""),
        hours=(np.minimum(end, until_us) - start) / frames.US_PER_HOUR,
        preempted=preempted,
    )
    records = []
    for market_id, group in rows.groupby("market_id", sort=True):
        hours, events = group["hours"].to_numpy(), group["preempted"].to_numpy()
        first = group.iloc[0]
        records.append(
            {
                "market_id": market_id,
                **{c: first[c] for c in MARKET_COLUMNS},
                "instances": len(group),
                "preempted": int(events.sum()),
                "censored": int((~events).sum()),
                "median_hours": survival.median(hours, events),
                "survival_24h": survival.survival_at(hours, events, 24.0),
                "longest_hours": float(hours.max()),
            }
        )
    return pd.DataFrame(records, columns=["market_id", *SURVIVAL_COLUMNS])[SURVIVAL_COLUMNS]


def compute(results: dict[str, pd.DataFrame], args: Args) -> ReportResult:
    sections = {}
    if "observations" in results:
        sections["observations"] = _observations(results["observations"], args)
    if "lifetimes" in results:
        sections["survival"] = _survival(results["lifetimes"], args)
    return ReportResult(sections, args["since"], args["until"], [], "Interruptions and instance survival")


REPORT = Report(
    name="interruptions",
    summary="interruption buckets/scores/eviction rates per market over time; survival of spot "
    "instances (Kaplan–Meier median, censored lifetimes counted)",
    params=(
        params.gpu(),
        params.cloud(),
        params.region(),
        params.bucket(),
        params.since(),
        params.until(),
        Param("part", f"which section: {', '.join(PARTS)}; default all", params.choice(PARTS), "all"),
    ),
    statements=statements,
    compute=compute,
    resolve=params.window,
)
