"""A small history where one GPU's speed is estimated from another's: an L4 and an H100 on
AWS priced at ``T0`` (on demand $0.8/h and $12/h; with ``spot``, also $0.3/h and $4/h) and three
reference workloads measured on both, imported through the console script. The plan, what-if
and decision tests of estimates (issue 37) build on it and add their own job."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from spotopt.history.ingest import run_ingest
from spotopt.history.setup import open_history
from spotopt.types import InstanceTypeSpec, MarketKey, MarketKind, PriceObservation
from tests.helpers import console

T0 = datetime(2025, 3, 1, tzinfo=UTC)
REFERENCES = """workload,gpu_model,gpu_count,steps_per_s
ref-a,L4,1,1.0
ref-a,H100-80GB,1,6.0
ref-b,L4,1,2.0
ref-b,H100-80GB,1,8.0
ref-c,L4,1,1.5
ref-c,H100-80GB,1,10.5
"""
PRICES = {
    ("test.l4x1", MarketKind.ON_DEMAND): 0.8,
    ("test.h100x1", MarketKind.ON_DEMAND): 12.0,
    ("test.l4x1", MarketKind.SPOT): 0.3,
    ("test.h100x1", MarketKind.SPOT): 4.0,
}


def market(instance_type: str, kind: MarketKind) -> MarketKey:
    return MarketKey(
        "aws", "us-east-1", "us-east-1a" if kind is MarketKind.SPOT else None, instance_type, kind
    )


def seed(db_url: str, tmp_path: Path, spot: bool = False) -> None:
    """The two instance types, their prices at ``T0`` and the references, in ``db_url``."""
    records: list[InstanceTypeSpec | PriceObservation] = [
        InstanceTypeSpec("aws", "test.l4x1", "L4", 1),
        InstanceTypeSpec("aws", "test.h100x1", "H100-80GB", 1),
    ]
    records += [
        PriceObservation(market(instance_type, kind), T0, usd)
        for (instance_type, kind), usd in PRICES.items()
        if spot or kind is MarketKind.ON_DEMAND
    ]
    db = open_history(db_url)
    try:
        run_ingest(db, "test", "seed", records)
    finally:
        db.dispose()
    (tmp_path / "refs.csv").write_text(REFERENCES)
    done = console(db_url, "throughput", "import", tmp_path / "refs.csv")
    assert done.returncode == 0, done.stderr
