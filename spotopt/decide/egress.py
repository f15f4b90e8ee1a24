"""Per-GB egress prices (``data/egress.csv``) and the dollars a move transfers.

Moving a job moves its checkpoint (and, into a region that holds no copy, its dataset). Within
one region nothing is paid: checkpoints live in the region's object storage, which every zone
reads for free. Between regions of one cloud the source cloud's ``inter-region`` price applies,
between clouds its ``internet`` price (ingress is free everywhere). Prices are dated; the row in
effect at a time is the latest one at or before it, so a replay of 2020 uses 2020 prices.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

import numpy as np

from spotopt.errors import InputError

KINDS = ("internet", "inter-region")


@dataclass(frozen=True, slots=True)
class EgressPrice:
    cloud: str
    kind: str
    usd_per_gb: float
    as_of: datetime
    source_url: str


@cache
def egress_prices() -> tuple[EgressPrice, ...]:
    """All rows of the bundled ``egress.csv``, oldest first."""
    text = resources.files("spotopt.data").joinpath("egress.csv").read_text(encoding="utf-8")
    rows = []
    for row in csv.DictReader(line for line in text.splitlines() if not line.startswith("#")):
        if row["kind"] not in KINDS:
            raise InputError(f"egress.csv: kind {row['kind']!r} is not one of {', '.join(KINDS)}")
        rows.append(
            EgressPrice(
                cloud=row["cloud"],
                kind=row["kind"],
                usd_per_gb=float(row["usd_per_gb"]),
                as_of=datetime.fromisoformat(row["as_of"]).replace(tzinfo=UTC),
                source_url=row["source_url"],
            )
        )
    return tuple(sorted(rows, key=lambda r: r.as_of))


@cache
def usd_per_gb(cloud: str, kind: str, at: datetime) -> float:
    """The list price of ``kind`` egress out of ``cloud`` in effect at ``at`` (earliest row before any)."""
    rows = [r for r in egress_prices() if r.cloud == cloud and r.kind == kind]
    if not rows:
        raise InputError(f"egress.csv has no {kind} price for cloud {cloud!r}; add a dated row")
    current = [r for r in rows if r.as_of <= at]
    return (current[-1] if current else rows[0]).usd_per_gb


def transfer_matrix(locations: Sequence[tuple[str, str]], at: datetime) -> np.ndarray[Any, Any]:
    """USD per GB from location ``a`` to ``b`` (``(cloud, region)`` pairs), shape ``(L + 1, L)``.

    The extra last row is "nowhere" (a job that has not started yet has no checkpoint to move)
    and is all zeros, so callers can index it with ``-1``.
    """
    n = len(locations)
    out = np.zeros((n + 1, n))
    for a, (cloud_a, region_a) in enumerate(locations):
        for b, (cloud_b, region_b) in enumerate(locations):
            if cloud_a != cloud_b:
                out[a, b] = usd_per_gb(cloud_a, "internet", at)
            elif region_a != region_b:
                out[a, b] = usd_per_gb(cloud_a, "inter-region", at)
    return out


def entry_usd(
    transfer: np.ndarray[Any, Any],
    here: np.ndarray[Any, Any],
    dest: np.ndarray[Any, Any],
    checkpoint_gb: np.ndarray[Any, Any],
    dataset_gb: np.ndarray[Any, Any],
    dataset_home: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    """Dollars of egress to start a job at location ``dest`` with its checkpoint at ``here``.

    The one egress rule of spotopt (plan, decisions and the what-if engine's charges): the
    checkpoint moves from ``here`` (-1: no checkpoint yet, nothing to move) and the dataset
    moves from its home ``dataset_home`` (-1: no dataset) unless ``dest`` holds a copy: its
    home, or ``here``, where the job ran with it. All arguments broadcast elementwise.
    """
    ckpt = checkpoint_gb * transfer[here, dest]
    needs = (dataset_home >= 0) & (dest != dataset_home) & (dest != here)
    data = np.where(needs, dataset_gb * transfer[np.maximum(dataset_home, 0), dest], 0.0)
    return np.asarray(ckpt + data)
