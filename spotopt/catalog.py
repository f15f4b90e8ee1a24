"""The bundled GPU catalog (``spotopt/data/*.csv``): a pure lookup, no database.

Files (provenance and dates in ``data/README.md``):
- ``gpus.csv``: canonical GPU models, the raw names clouds use for them (``aliases``) and their
  datasheet peaks (16-bit and FP32 TFLOPS, memory bandwidth), the throughput model's prior.
- ``instance_types.csv``: every GPU instance type of AWS, GCP and Azure, retired ones included,
  with the link between its GPUs and its network bandwidth to other instances.
- ``list_prices.csv``: dated on-demand Linux list prices, loaded as price points of source
  ``catalog`` so that a fresh database can already answer "what does an H100 cost on demand".

Its sync into the SQL history is ``spotopt.history.catalog_sync``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import resources

from spotopt.errors import InputError
from spotopt.types import InstanceTypeSpec, MarketKey, MarketKind, PriceObservation

GCP_ATTACHED_GPUS = re.compile(r"(?P<machine>[a-z0-9-]+)\+(?P<count>\d+)x(?P<accel>[a-z0-9-]+)")
"""``n1-standard-8+1xnvidia-tesla-v100``: the catalog's name for a GCP N1 machine with attached GPUs
(the GCP collector prices such shapes, the GCP provider attaches the GPUs when it launches one)."""
CATALOG_SOURCE = "catalog"
"""The ``source`` of the list prices the catalog sync loads (reports leave them out of spot views)."""


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    vendor: str
    memory_gib: float
    architecture: str
    released: int
    aliases: tuple[str, ...]
    fp16_tflops: float
    """Peak dense 16-bit matrix TFLOPS (Tensor Cores where present; the FP32 figure where 16-bit
    arithmetic is no faster, as on Kepler, Maxwell, P4 and P40, where training runs in FP32)."""
    fp32_tflops: float
    memory_bandwidth_gbs: float
    source_url: str


@dataclass(frozen=True, slots=True)
class Interconnect:
    """How the GPUs of one instance type talk to each other and to other instances.

    ``gpu_link_gbs`` is per GPU, both directions together, as vendors quote NVLink (600 GB/s on
    an A100) and PCIe (32 GB/s for gen3 x16); ``network_gbps`` is the instance's documented
    network bandwidth in Gbit/s (EFA or InfiniBand included), None where only a class is given."""

    gpu_link: str  # nvlink | nvswitch | infinity-fabric | pcie
    gpu_link_gbs: float
    network_gbps: float | None


def _rows(filename: str) -> Iterator[dict[str, str]]:
    text = resources.files("spotopt.data").joinpath(filename).read_text(encoding="utf-8")
    yield from csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))


@cache
def gpu_models() -> dict[str, GpuModel]:
    models = {}
    for row in _rows("gpus.csv"):
        aliases = tuple(a.strip() for a in row["aliases"].split(";") if a.strip())
        models[row["gpu_model"]] = GpuModel(
            name=row["gpu_model"],
            vendor=row["vendor"],
            memory_gib=float(row["memory_gib"]),
            architecture=row["architecture"],
            released=int(row["released"]),
            aliases=aliases,
            fp16_tflops=float(row["fp16_tflops"]),
            fp32_tflops=float(row["fp32_tflops"]),
            memory_bandwidth_gbs=float(row["memory_bandwidth_gbs"]),
            source_url=row["source_url"],
        )
    return models


@cache
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for model in gpu_models().values():
        for alias in (model.name, *model.aliases):
            index[_norm(alias)] = model.name
    return index


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


_BRAND_PREFIXES = ("nvidia", "tesla", "amd", "radeon", "instinct", "pro")


def canonical_gpu(raw_name: str, memory_gib: float | None = None) -> str | None:
    """Map a cloud's GPU name (``Tesla V100-SXM2-16GB``, ``nvidia-tesla-v100``, ``V100``) to ours.

    A bare family name (``V100``, ``A100``) is resolved with ``memory_gib`` per GPU when given
    (clouds report e.g. ``A100`` with 40 or 80 GiB); None when nothing matches.
    """
    key = _norm(raw_name)
    if not key:
        return None
    stripped = True
    while stripped:  # "AMD Radeon Instinct MI25", "NVIDIA Tesla T4", "Radeon Pro V520"
        stripped = False
        for prefix in _BRAND_PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key = key.removeprefix(prefix)
                stripped = True
    if key.endswith("gpu") and len(key) > 3:  # "NVIDIA T4 GPU"
        key = key.removesuffix("gpu")
    index = _alias_index()
    hit = index.get(key) or index.get(_norm(raw_name))
    if hit is not None:
        return hit
    candidates = [m for m in gpu_models().values() if _norm(m.name.split("-")[0]) == key]
    if len(candidates) == 1:
        return candidates[0].name
    if candidates and memory_gib is not None:
        return min(candidates, key=lambda m: abs(m.memory_gib - memory_gib)).name
    return None


def gpu_matches(query: str, gpu_model: str | None) -> bool:
    """``--gpu V100`` matches V100-16GB and V100-32GB; ``--gpu V100-32GB`` only that one."""
    if gpu_model is None:
        return False
    q, g = query.lower(), gpu_model.lower()
    return g == q or g.startswith(q + "-")


def check_gpu_query(query: str) -> str:
    """Validate a ``--gpu`` value and return it in canonical case (``v100`` → ``V100``)."""
    for name in sorted(gpu_models()):
        if gpu_matches(query, name):
            return name if len(name) == len(query) else name[: len(query)]
    valid = ", ".join(sorted(gpu_models()))
    raise InputError(f"--gpu {query!r} matches no GPU model; valid: {valid} (or a family such as V100)")


def _opt_float(value: str) -> float | None:
    return float(value) if value.strip() else None


def instance_types() -> list[InstanceTypeSpec]:
    specs = []
    for row in _rows("instance_types.csv"):
        specs.append(
            InstanceTypeSpec(
                cloud=row["cloud"],
                name=row["name"],
                gpu_model=row["gpu_model"] or None,
                gpu_count=_opt_float(row["gpu_count"]),
                gpu_memory_gib=_opt_float(row["gpu_memory_gib"]),
                vcpus=int(row["vcpus"]) if row["vcpus"].strip() else None,
                memory_gib=_opt_float(row["memory_gib"]),
                retired=row["retired"].strip().lower() in ("1", "true", "yes"),
            )
        )
    return specs


@cache
def interconnects() -> dict[tuple[str, str], Interconnect]:
    """(cloud, instance type) → its GPU link and network bandwidth."""
    return {
        (row["cloud"], row["name"]): Interconnect(
            gpu_link=row["gpu_link"],
            gpu_link_gbs=float(row["gpu_link_gbs"]),
            network_gbps=_opt_float(row["network_gbps"]),
        )
        for row in _rows("instance_types.csv")
    }


def list_prices() -> list[PriceObservation]:
    prices = []
    for row in _rows("list_prices.csv"):
        as_of = datetime.fromisoformat(row["as_of"]).replace(tzinfo=UTC)
        market = MarketKey(
            cloud=row["cloud"],
            region=row["region"],
            zone=None,
            instance_type=row["instance_type"],
            kind=MarketKind.ON_DEMAND,
        )
        prices.append(PriceObservation(market, as_of, float(row["usd_per_hour"])))
    return prices
