"""Consistency of the bundled catalog files (``data/*.csv``) and the GPU-name mapping."""

from __future__ import annotations

import csv
from collections import Counter
from datetime import date
from importlib import resources
from pathlib import Path

import pytest

from spotopt.catalog import canonical_gpu, gpu_models, instance_types, list_prices
from spotopt.clouds.registry import MARKET_CLOUDS as CLOUDS


def _raw_rows(filename: str) -> list[dict[str, str]]:
    text = resources.files("spotopt.data").joinpath(filename).read_text(encoding="utf-8")
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


TYPES = {(s.cloud, s.name): s for s in instance_types()}

# Names per family that must be present (the families of the catalog issue).
REQUIRED = {
    "aws": {
        "g2": ["g2.2xlarge", "g2.8xlarge"],
        "p2": ["p2.xlarge", "p2.8xlarge", "p2.16xlarge"],
        "p3": ["p3.2xlarge", "p3.8xlarge", "p3.16xlarge"],
        "p3dn": ["p3dn.24xlarge"],
        "p4d": ["p4d.24xlarge"],
        "p4de": ["p4de.24xlarge"],
        "p5": ["p5.48xlarge"],
        "p5e": ["p5e.48xlarge"],
        "p5en": ["p5en.48xlarge"],
        "p6-b200": ["p6-b200.48xlarge"],
        "g3": ["g3.4xlarge", "g3.8xlarge", "g3.16xlarge"],
        "g3s": ["g3s.xlarge"],
        "g4dn": [
            f"g4dn.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "metal")
        ],
        "g4ad": [f"g4ad.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")],
        "g5": [
            f"g5.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge")
        ]
        + ["g5.48xlarge"],
        "g5g": [f"g5g.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge", "metal")],
        "g6": [
            f"g6.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge")
        ]
        + ["g6.48xlarge"],
        "g6e": [f"g6e.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge")]
        + ["g6e.24xlarge", "g6e.48xlarge"],
        "gr6": ["gr6.4xlarge", "gr6.8xlarge"],
        "g6f": ["g6f.large", "g6f.xlarge", "g6f.2xlarge", "g6f.4xlarge"],
    },
    "gcp": {
        "a2-highgpu": [f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)],
        "a2-megagpu": ["a2-megagpu-16g"],
        "a2-ultragpu": [f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)],
        "a3-highgpu": [f"a3-highgpu-{n}g" for n in (1, 2, 4, 8)],
        "a3": ["a3-megagpu-8g", "a3-edgegpu-8g", "a3-ultragpu-8g"],
        "a4": ["a4-highgpu-8g"],
        "g2": [f"g2-standard-{n}" for n in (4, 8, 12, 16, 24, 32, 48, 96)],
        "n1-k80": [f"n1-standard-{v}+{c}xnvidia-tesla-k80" for c, v in ((1, 4), (2, 8), (4, 16), (8, 32))],
        "n1-p100": [f"n1-standard-{v}+{c}xnvidia-tesla-p100" for c, v in ((1, 8), (2, 16), (4, 32))],
        "n1-v100": [f"n1-standard-{v}+{c}xnvidia-tesla-v100" for c, v in ((1, 8), (2, 16), (4, 32), (8, 64))],
        "n1-t4": [f"n1-standard-{v}+{c}xnvidia-tesla-t4" for c, v in ((1, 4), (2, 8), (4, 16))],
        "n1-p4": [f"n1-standard-{v}+{c}xnvidia-tesla-p4" for c, v in ((1, 4), (2, 8), (4, 16))],
    },
    "azure": {
        "NC": ["Standard_NC6", "Standard_NC12", "Standard_NC24", "Standard_NC24r"],
        "NCv2": ["Standard_NC6s_v2", "Standard_NC12s_v2", "Standard_NC24s_v2", "Standard_NC24rs_v2"],
        "NCv3": ["Standard_NC6s_v3", "Standard_NC12s_v3", "Standard_NC24s_v3", "Standard_NC24rs_v3"],
        "NCasT4_v3": [f"Standard_NC{n}as_T4_v3" for n in (4, 8, 16, 64)],
        "NC A100 v4": [f"Standard_NC{n}ads_A100_v4" for n in (24, 48, 96)],
        "NC H100 v5": ["Standard_NC40ads_H100_v5", "Standard_NC80adis_H100_v5"],
        "ND": ["Standard_ND6s", "Standard_ND12s", "Standard_ND24s", "Standard_ND24rs"],
        "NDv2": ["Standard_ND40rs_v2"],
        "ND A100 v4": ["Standard_ND96asr_v4"],
        "NDm A100 v4": ["Standard_ND96amsr_A100_v4"],
        "ND H100 v5": ["Standard_ND96isr_H100_v5"],
        "ND H200 v5": ["Standard_ND96isr_H200_v5"],
        "NV": ["Standard_NV6", "Standard_NV12", "Standard_NV24"],
        "NVv3": ["Standard_NV12s_v3", "Standard_NV24s_v3", "Standard_NV48s_v3"],
        "NVv4": [f"Standard_NV{n}as_v4" for n in (4, 8, 16, 32)],
        "NVadsA10_v5": [f"Standard_NV{n}ads_A10_v5" for n in (6, 12, 18, 36, 72)]
        + ["Standard_NV36adms_A10_v5"],
    },
}


def _required_params() -> list[tuple[str, str, list[str]]]:
    return [(cloud, fam, names) for cloud, fams in REQUIRED.items() for fam, names in fams.items()]


@pytest.mark.parametrize(("cloud", "family", "names"), _required_params())
def test_required_families_present(cloud: str, family: str, names: list[str]) -> None:
    missing = [n for n in names if (cloud, n) not in TYPES]
    assert not missing, f"{cloud} {family}: missing {missing}"


def test_columns_fixed() -> None:
    text = resources.files("spotopt.data").joinpath("instance_types.csv").read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if not line.startswith("#")).split(",")
    assert header[:8] == [
        "cloud",
        "name",
        "gpu_model",
        "gpu_count",
        "gpu_memory_gib",
        "vcpus",
        "memory_gib",
        "retired",
    ]
    gpus = _raw_rows("gpus.csv")
    assert list(gpus[0])[:6] == ["gpu_model", "vendor", "memory_gib", "architecture", "released", "aliases"]
    prices = _raw_rows("list_prices.csv")
    assert list(prices[0])[:6] == ["cloud", "region", "instance_type", "usd_per_hour", "as_of", "source_url"]


def test_no_duplicate_instance_types() -> None:
    counts = Counter((r["cloud"], r["name"]) for r in _raw_rows("instance_types.csv"))
    assert [k for k, n in counts.items() if n > 1] == []


def test_no_duplicate_gpu_models_or_aliases() -> None:
    names = [r["gpu_model"] for r in _raw_rows("gpus.csv")]
    assert len(names) == len(set(names))
    seen: dict[str, str] = {}
    for model in gpu_models().values():
        for alias in (model.name, *model.aliases):
            key = "".join(ch for ch in alias.lower() if ch.isalnum())
            assert seen.setdefault(key, model.name) == model.name, f"alias {alias!r} of two models"


def test_no_ambiguous_bare_family_alias() -> None:
    """A family name shared by several models (V100, A100, H100) must not alias only one of them."""
    families = Counter(m.name.split("-")[0].lower() for m in gpu_models().values())
    shared = {f for f, n in families.items() if n > 1}
    for model in gpu_models().values():
        for alias in model.aliases:
            assert alias.lower() not in shared, f"{alias!r} is ambiguous but aliases {model.name}"


def test_gpu_models_sane() -> None:
    for model in gpu_models().values():
        assert model.vendor in ("NVIDIA", "AMD"), model
        assert 0 < model.memory_gib <= 512, model
        assert 2010 <= model.released <= 2026, model
        assert model.architecture, model


def test_instance_types_reference_known_gpus_and_are_sane() -> None:
    models = gpu_models()
    for (cloud, name), spec in TYPES.items():
        assert cloud in CLOUDS, name
        assert spec.gpu_model in models, f"{cloud}:{name} has unknown GPU {spec.gpu_model}"
        assert spec.gpu_count is not None and 0 < spec.gpu_count <= 16, name
        assert spec.vcpus is None or spec.vcpus > 0, name
        assert spec.memory_gib is None or spec.memory_gib > 0, name
        assert spec.gpu_memory_gib is not None
        # Per-instance GPU memory is what the cloud documents (AWS lists A10G/L4 as 22 GiB, L40S as
        # 44 GiB), so allow the GB-vs-GiB gap against the nominal per-GPU memory.
        nominal = models[spec.gpu_model].memory_gib * spec.gpu_count
        assert 0.9 * nominal <= spec.gpu_memory_gib <= 1.02 * nominal, (name, spec.gpu_memory_gib, nominal)


def test_instance_type_extra_columns() -> None:
    for row in _raw_rows("instance_types.csv"):
        assert row["retired"] in ("true", "false"), row
        assert row["family"], row
        assert 2013 <= int(row["launched"]) <= 2026, row


def test_fractional_gpus() -> None:
    assert TYPES[("azure", "Standard_NV4as_v4")].gpu_count == pytest.approx(0.125)
    assert TYPES[("azure", "Standard_NV6ads_A10_v5")].gpu_count == pytest.approx(1 / 6, abs=1e-5)
    assert TYPES[("azure", "Standard_NV12ads_A10_v5")].gpu_count == pytest.approx(1 / 3, abs=1e-5)
    assert TYPES[("aws", "g6f.large")].gpu_count == pytest.approx(0.125)


@pytest.mark.parametrize(
    ("cloud", "name", "retired"),
    [
        ("aws", "g2.2xlarge", True),
        ("aws", "p2.xlarge", True),
        ("aws", "p3.2xlarge", False),
        ("aws", "p5.48xlarge", False),
        ("gcp", "n1-standard-4+1xnvidia-tesla-k80", True),
        ("gcp", "a3-highgpu-8g", False),
        ("azure", "Standard_NC6", True),
        ("azure", "Standard_NC6s_v3", True),
        ("azure", "Standard_ND6s", True),
        ("azure", "Standard_NV6", True),
        ("azure", "Standard_NV4as_v4", True),  # NVv4 retired 2026-09-30
        ("azure", "Standard_NC24ads_A100_v4", False),
    ],
)
def test_retired_flags(cloud: str, name: str, retired: bool) -> None:
    assert TYPES[(cloud, name)].retired is retired


@pytest.mark.parametrize(
    ("cloud", "name", "gpu", "count", "vcpus", "memory"),
    [
        ("aws", "p3.16xlarge", "V100-16GB", 8, 64, 488),
        ("aws", "p3dn.24xlarge", "V100-32GB", 8, 96, 768),
        ("aws", "p4d.24xlarge", "A100-40GB", 8, 96, 1152),
        ("aws", "p4de.24xlarge", "A100-80GB", 8, 96, 1152),
        ("aws", "g4dn.12xlarge", "T4", 4, 48, 192),
        ("aws", "g4dn.metal", "T4", 8, 96, 384),
        ("aws", "g4ad.xlarge", "V520", 1, 4, 16),
        ("aws", "g5g.xlarge", "T4G", 1, 4, 8),
        ("aws", "p5e.48xlarge", "H200", 8, 192, 2048),
        ("gcp", "a2-highgpu-8g", "A100-40GB", 8, 96, 680),
        ("gcp", "a2-ultragpu-8g", "A100-80GB", 8, 96, 1360),
        ("gcp", "a3-highgpu-8g", "H100-80GB", 8, 208, 1872),
        ("gcp", "a3-ultragpu-8g", "H200", 8, 224, 2952),
        ("gcp", "a4-highgpu-8g", "B200", 8, 224, 3968),
        ("gcp", "g2-standard-4", "L4", 1, 4, 16),
        ("gcp", "n1-standard-8+1xnvidia-tesla-v100", "V100-16GB", 1, 8, 30),
        ("azure", "Standard_NC24s_v3", "V100-16GB", 4, 24, 448),
        ("azure", "Standard_ND40rs_v2", "V100-32GB", 8, 40, 672),
        ("azure", "Standard_ND96asr_v4", "A100-40GB", 8, 96, 900),
        ("azure", "Standard_ND96amsr_A100_v4", "A100-80GB", 8, 96, 1900),
        ("azure", "Standard_NC40ads_H100_v5", "H100-94GB", 1, 40, 320),
        ("azure", "Standard_ND96isr_H100_v5", "H100-80GB", 8, 96, 1900),
    ],
)
def test_spot_checks(cloud: str, name: str, gpu: str, count: float, vcpus: int, memory: float) -> None:
    spec = TYPES[(cloud, name)]
    assert (spec.gpu_model, spec.gpu_count, spec.vcpus, spec.memory_gib) == (gpu, count, vcpus, memory)


def test_gcp_n1_convention() -> None:
    """``<machine-type>+<count>x<accelerator-type>``: the accelerator maps to the row's GPU model."""
    n1 = [s for (c, n), s in TYPES.items() if c == "gcp" and n.startswith("n1-")]
    assert n1
    for spec in n1:
        machine, _, attached = spec.name.partition("+")
        count, _, accelerator = attached.partition("x")
        assert machine.startswith("n1-standard-"), spec.name
        assert spec.vcpus == int(machine.rsplit("-", 1)[1])
        assert float(count) == spec.gpu_count
        assert canonical_gpu(accelerator) == spec.gpu_model, spec.name


@pytest.mark.parametrize(
    ("raw", "memory", "expected"),
    [
        # AWS GpuInfo names, with the per-GPU memory AWS reports
        ("K80", 12, "K80"),
        ("M60", 8, "M60"),
        ("V100", 16, "V100-16GB"),
        ("V100", 32, "V100-32GB"),
        ("T4", 16, "T4"),
        ("T4g", 16, "T4G"),
        ("A10G", 22, "A10G"),
        ("A100", 40, "A100-40GB"),
        ("A100", 80, "A100-80GB"),
        ("H100", 80, "H100-80GB"),
        ("H200", 141, "H200"),
        ("L4", 22, "L4"),
        ("L40S", 44, "L40S"),
        ("B200", 179, "B200"),
        ("Radeon Pro V520", 8, "V520"),
        ("K520", 4, "K520"),
        # GCP accelerator types
        ("nvidia-tesla-k80", None, "K80"),
        ("nvidia-tesla-p100", None, "P100"),
        ("nvidia-tesla-v100", None, "V100-16GB"),
        ("nvidia-tesla-t4", None, "T4"),
        ("nvidia-tesla-p4", None, "P4"),
        ("nvidia-tesla-a100", None, "A100-40GB"),
        ("nvidia-a100-80gb", None, "A100-80GB"),
        ("nvidia-l4", None, "L4"),
        ("nvidia-h100-80gb", None, "H100-80GB"),
        ("nvidia-h100-mega-80gb", None, "H100-80GB"),
        ("nvidia-h200-141gb", None, "H200"),
        ("nvidia-b200", None, "B200"),
        ("nvidia-rtx-pro-6000", None, "RTX-PRO-6000"),
        # Azure documentation / nvidia-smi names
        ("NVIDIA Tesla K80", None, "K80"),
        ("NVIDIA Tesla P40", None, "P40"),
        ("NVIDIA Tesla M60", None, "M60"),
        ("AMD Radeon Instinct MI25", None, "MI25"),
        ("AMD Instinct MI300X", None, "MI300X"),
        ("NVIDIA A10", None, "A10"),
        ("NVIDIA H100 NVL", None, "H100-94GB"),
        ("Tesla V100-SXM2-16GB", None, "V100-16GB"),
        ("Tesla V100-SXM2-32GB", None, "V100-32GB"),
        ("NVIDIA A100-SXM4-40GB", None, "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", None, "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", None, "H100-80GB"),
        ("Tesla P100-PCIE-16GB", None, "P100"),
        ("NVIDIA T4 GPU", None, "T4"),
        # canonical names map to themselves
        ("V100-32GB", None, "V100-32GB"),
        ("a100-80gb", None, "A100-80GB"),
    ],
)
def test_canonical_gpu(raw: str, memory: float | None, expected: str) -> None:
    assert canonical_gpu(raw, memory) == expected


@pytest.mark.parametrize("raw", ["V100", "A100", "H100"])
def test_bare_family_without_memory_is_ambiguous(raw: str) -> None:
    assert canonical_gpu(raw) is None


@pytest.mark.parametrize(
    "raw", ["", "Quadro RTX 8000", "nvidia-tesla-x999", "Gaudi HL-205", "Inferentia2", "NVIDIA"]
)
def test_unknown_gpu_names(raw: str) -> None:
    assert canonical_gpu(raw) is None
    assert canonical_gpu(raw, 16) is None


def test_every_cloud_alias_maps_back() -> None:
    for model in gpu_models().values():
        for alias in model.aliases:
            assert canonical_gpu(alias, model.memory_gib) == model.name, alias


def test_list_prices_valid() -> None:
    rows = _raw_rows("list_prices.csv")
    assert rows
    regions = {"aws": "us-east-1", "gcp": "us-central1", "azure": "eastus"}
    for row in rows:
        assert (row["cloud"], row["instance_type"]) in TYPES, row
        assert float(row["usd_per_hour"]) > 0, row
        as_of = date.fromisoformat(row["as_of"])
        assert date(2016, 1, 1) <= as_of <= date(2026, 12, 31), row
        assert row["region"] == regions[row["cloud"]], row
        assert row["source_url"].startswith("https://"), row
    keys = Counter((r["cloud"], r["region"], r["instance_type"], r["as_of"]) for r in rows)
    assert [k for k, n in keys.items() if n > 1] == []
    assert len(list_prices()) == len(rows)


def test_list_prices_cover_each_cloud_and_plausible_per_gpu() -> None:
    prices = list_prices()
    assert {p.market.cloud for p in prices} == set(CLOUDS)
    for p in prices:
        spec = TYPES[(p.market.cloud, p.market.instance_type)]
        per_gpu = p.usd_per_hour / (spec.gpu_count or 1)
        assert 0.1 < per_gpu < 20, (p.market.instance_type, per_gpu)


def test_gcp_n1_prices_are_machine_plus_gpus() -> None:
    rows = {
        r["instance_type"]: float(r["usd_per_hour"])
        for r in _raw_rows("list_prices.csv")
        if r["cloud"] == "gcp"
    }
    # n1-standard-8 ($0.379998) + one V100 ($2.48), us-central1
    assert rows["n1-standard-8+1xnvidia-tesla-v100"] == pytest.approx(2.86, abs=0.001)


def test_every_type_still_offered_has_a_price_or_is_listed_as_missing() -> None:
    """A type without a list price is either retired or named under "Missing prices" in
    data/README.md with what was searched, so a gap is a documented decision, not an oversight."""
    readme = (Path(__file__).resolve().parents[1] / "data" / "README.md").read_text(encoding="utf-8")
    missing = readme.split("### Missing prices", 1)[1].split("\n## ", 1)[0]
    priced = {(p.market.cloud, p.market.instance_type) for p in list_prices()}
    unlisted = [
        key
        for key, spec in TYPES.items()
        if key not in priced and not spec.retired and f"`{key[1]}`" not in missing
    ]
    assert unlisted == []
    listed_but_priced = [name for cloud, name in priced if f"`{name}`" in missing]
    assert listed_but_priced == []


def test_p4de_and_p5en_carry_the_june_2025_price_cut() -> None:
    by_type: dict[str, list[tuple[str, float]]] = {}
    for row in _raw_rows("list_prices.csv"):
        by_type.setdefault(row["instance_type"], []).append((row["as_of"], float(row["usd_per_hour"])))
    assert sorted(by_type["p4de.24xlarge"]) == [("2023-08-01", 40.9657), ("2025-06-05", 27.44705)]
    assert sorted(by_type["p5en.48xlarge"]) == [("2025-06-05", 63.296)]
