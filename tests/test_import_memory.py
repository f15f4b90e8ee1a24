"""Importers stream: a dump far larger than the memory an import may use goes through in batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ITEM = (
    '{{"AvailabilityZone": "us-east-1{zone}", "InstanceType": "p3.2xlarge", '
    '"ProductDescription": "Linux/UNIX", "SpotPrice": "{price:.4f}", "Timestamp": "{ts}"}}'
)
PEAK = (
    "import resource, sys\n"
    "from spotopt.cli.app import app\n"
    "try:\n"
    "    app(sys.argv[1:])\n"
    "except SystemExit as exit:\n"
    "    assert not exit.code, exit.code\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"  # KiB on Linux
)


def _dump(path: Path, n: int) -> None:
    with path.open("w") as out:
        out.write('{"SpotPriceHistory": [\n')
        for i in range(n):
            minutes = i % 60
            hours = (i // 60) % 24
            day = 1 + (i // 1440) % 28
            month = 1 + (i // 40320) % 12
            ts = f"2023-{month:02d}-{day:02d}T{hours:02d}:{minutes:02d}:00+00:00"
            sep = ",\n" if i else ""
            out.write(sep + ITEM.format(zone="abcdef"[i % 6], price=0.5 + (i % 997) / 1000, ts=ts))
        out.write('\n], "NextToken": ""}\n')


def _peak_kib(path: Path, db: Path) -> int:
    args = ["--db", f"sqlite:///{db}", "import", "aws-spot-history", str(path), "--format", "json"]
    out = subprocess.run([sys.executable, "-c", PEAK, *args], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def test_a_large_dump_does_not_need_its_size_in_memory(tmp_path: Path) -> None:
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    _dump(small, 100)
    _dump(big, 300_000)
    size_mib = big.stat().st_size / 2**20
    baseline = _peak_kib(small, tmp_path / "a.sqlite")
    peak = _peak_kib(big, tmp_path / "b.sqlite")
    growth_mib = (peak - baseline) / 1024
    # Loading the document whole takes ~4x its size in Python objects (json.load: +201 MiB here).
    # Streaming needs the 20k-row batches plus SQLite's page cache, which holds what the one
    # import transaction wrote (about the file's size here, capped at 256 MiB by the engine).
    assert size_mib > 40
    assert growth_mib < 2 * size_mib, (growth_mib, size_mib)
    summary = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "spotopt",
                "--db",
                f"sqlite:///{tmp_path / 'b.sqlite'}",
                "prices",
                "show",
                "--instance-type",
                "p3.2xlarge",
                "--market",
                "spot",
                "--limit",
                "1",
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert summary and summary[0]["observed_at"].startswith("2023-01-01")
