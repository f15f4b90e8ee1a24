"""The bundled example: a **synthetic**, seeded spot market and four example jobs.

It lets ``spotopt whatif --example`` run on a fresh machine with no credentials and no files. The
prices are made up by the generator below and written into the history under the source
``synthetic-example``; every what-if output over them says "synthetic". Nothing here is a
measurement.

Generator (per spot market, one window of ``DAYS`` days from ``START``):

- *Levels* come from published facts. The on-demand price is the bundled catalog's dated list
  price (``data/list_prices.csv``, 2020-02-01: AWS us-east-1, GCP us-central1, Azure eastus).
  The spot floor is the on-demand price divided by the thesis' best-case spot discount for that
  cloud and GPU (Table 6.3: AWS K80 2.7×, V100 3.3×; GCP 3.4×, 3.4×, 3.3×; Azure 7.3×, 8.0×,
  5.1× for K80, P100, V100).
- *When prices change* follows §6.3.2: AWS and Azure spot prices change "only daily" (one change
  per market per day, at a random hour); GCP preemptible prices are constant; AWS's
  ``p3.16xlarge`` showed no variation (Fig. 6.1). Spot prices never exceed on-demand.
- *Shape* (our choice, not the thesis'): the price is ``floor · exp(y)`` with a mean-reverting
  daily walk ``y ← RHO·y + SIGMA·|N(0,1)|`` (per-GPU prices of multi-GPU instances move half as
  much, Fig. 6.4), and on a day with probability ``CAP_PROBABILITY`` a zone sits at the
  on-demand price (the capped p2.xlarge zone of Fig. 6.1).
- *Preemptions* are not generated: the replay takes them from ``spotopt.history.market`` (its defaults
  come from the same §6.3: GCP at least daily, AWS on the order of hours).

Markets: AWS us-east-1 zones a, b, c, f (p2 and p3), GCP us-central1 (N1 + K80/P100/V100),
Azure eastus (NC, NCv2, NCv3): the clouds, GPUs and instance sizes of the thesis' study.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from spotopt.catalog import list_prices
from spotopt.db.engine import Database
from spotopt.history.ingest import run_ingest
from spotopt.jobspec import JobSpec, parse_jobs
from spotopt.price import quoted
from spotopt.types import MarketKey, MarketKind, PriceObservation
from spotopt.whatif.timeline import SYNTHETIC_SOURCE

START = datetime(2020, 2, 1, tzinfo=UTC)
DAYS = 60
SEED = 20200201
RHO = 0.8
SIGMA = 0.25
CAP_PROBABILITY = 0.03

SPOT_DISCOUNT = {
    ("aws", "K80"): 2.7,
    ("aws", "V100"): 3.3,
    ("gcp", "K80"): 3.4,
    ("gcp", "P100"): 3.4,
    ("gcp", "V100"): 3.3,
    ("azure", "K80"): 7.3,
    ("azure", "P100"): 8.0,
    ("azure", "V100"): 5.1,
}
"""Thesis Table 6.3: best-case cost reduction from on-demand to spot, single GPU, per cloud."""

MARKETS: dict[str, list[tuple[str, str, int, tuple[str, ...]]]] = {
    "aws": [
        ("p2.xlarge", "K80", 1, ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1f")),
        ("p2.8xlarge", "K80", 8, ("us-east-1a", "us-east-1c")),
        ("p2.16xlarge", "K80", 16, ("us-east-1a",)),
        ("p3.2xlarge", "V100", 1, ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1f")),
        ("p3.8xlarge", "V100", 4, ("us-east-1a", "us-east-1c")),
        ("p3.16xlarge", "V100", 8, ("us-east-1a",)),
    ],
    "gcp": [
        ("n1-standard-4+1xnvidia-tesla-k80", "K80", 1, ("",)),
        ("n1-standard-8+1xnvidia-tesla-p100", "P100", 1, ("",)),
        ("n1-standard-8+1xnvidia-tesla-v100", "V100", 1, ("",)),
        ("n1-standard-32+4xnvidia-tesla-v100", "V100", 4, ("",)),
    ],
    "azure": [
        ("Standard_NC6", "K80", 1, ("",)),
        ("Standard_NC24", "K80", 4, ("",)),
        ("Standard_NC6s_v2", "P100", 1, ("",)),
        ("Standard_NC6s_v3", "V100", 1, ("",)),
        ("Standard_NC24s_v3", "V100", 4, ("",)),
    ],
}
REGION = {"aws": "us-east-1", "gcp": "us-central1", "azure": "eastus"}
STATIC = {"p3.16xlarge"}

EXAMPLE_JOBS: dict[str, Any] = {
    "jobs": [
        {
            "name": "resnet50",
            "throughput": {"K80": 1.0, "P100": 3.7, "V100": 9.6},
            "work": {"gpu_days": 4, "gpu": "V100"},
            "checkpoint_gb": 0.098,
            "restart_s": 300,
            "dataset": {"gb": 150, "cloud": "aws", "region": "us-east-1"},
        },
        {
            "name": "a3c",
            "throughput": {"K80": 1.0, "P100": 1.2, "V100": 2.2},
            "work": {"gpu_days": 4, "gpu": "V100"},
            "checkpoint_gb": 0.01,
            "restart_s": 300,
        },
        {
            "name": "transformer",
            "throughput": {"K80": 1.0, "P100": 3.3, "V100": 3.3},
            "work": {"gpu_days": 4, "gpu": "V100"},
            "deadline": "6d",
            "checkpoint_gb": 0.5,
            "restart_s": 300,
        },
        {
            "name": "cyclegan",
            "throughput": {"K80": 1.0, "P100": 4.5, "V100": 9.3},
            "work": {"gpu_days": 2, "gpu": "V100"},
            "deadline": "3d",
            "checkpoint_gb": 0.05,
            "restart_s": 300,
        },
    ]
}
"""Throughputs relative to a K80 from thesis Table 6.1 (steps/s in K80 units); ResNet-50's
dataset (ImageNet, 150 GB) and checkpoint (0.098 GB) from Table 6.2; 4 V100-days as Fig. 6.5."""


def example_jobs() -> JobSpec:
    return parse_jobs(EXAMPLE_JOBS, "example jobs")


def generate(seed: int = SEED, start: datetime = START, days: int = DAYS) -> Iterator[PriceObservation]:
    """The synthetic spot price points, deterministic in ``seed`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    od = {
        (p.market.cloud, p.market.instance_type): p.usd_per_hour
        for p in list_prices()
        if p.observed_at <= start
    }
    for cloud, entries in MARKETS.items():
        for instance_type, gpu, gpus, zones in entries:
            on_demand = od[(cloud, instance_type)]
            floor = on_demand / SPOT_DISCOUNT[(cloud, gpu)]
            sigma = 0.0 if instance_type in STATIC else SIGMA / (2.0 if gpus > 1 else 1.0)
            for zone in zones:
                market = MarketKey(cloud, REGION[cloud], zone or None, instance_type, MarketKind.SPOT)
                if cloud == "gcp":
                    yield PriceObservation(market, start, quoted(floor))
                    continue
                y = 0.0
                for day in range(days):
                    y = RHO * y + sigma * abs(float(rng.standard_normal()))
                    capped = rng.random() < CAP_PROBABILITY
                    hour = 0 if day == 0 else int(rng.integers(0, 24))
                    price = on_demand if capped else min(on_demand, floor * math.exp(y))
                    when = start + timedelta(days=day, hours=hour)
                    yield PriceObservation(market, when, quoted(price))


def load_example(db: Database, seed: int = SEED) -> int:
    """Write the example market into the history (idempotent: a second call inserts nothing)."""
    summary = run_ingest(db, SYNTHETIC_SOURCE, f"seed={seed}", generate(seed))
    return int(summary.stats.inserted)
