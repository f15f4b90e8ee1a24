"""The wheel ships everything (migrations, data) and works from any directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_contents_and_use_from_another_directory(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("spotopt_gpu-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "spotopt/py.typed",
        "spotopt/migrations/env.py",
        "spotopt/migrations/script.py.mako",
        "spotopt/migrations/versions/0001_schema_v1.py",
        "spotopt/data/instance_types.csv",
        "spotopt/data/gpus.csv",
        "spotopt/data/list_prices.csv",
        "spotopt/collectors/__init__.py",
        "spotopt/policies/__init__.py",
        "spotopt/clouds/common/fetch.py",  # the start-up script's downloader
        "spotopt/data/locks/instance-file.txt",  # what instances install, per store back-end
        "spotopt/data/locks/instance-s3.txt",
        "spotopt/data/locks/instance-gcs.txt",
        "spotopt/data/locks/instance-azure-storage.txt",
    ):
        assert required in names, required
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    db = f"sqlite:///{tmp_path / 'w.sqlite'}"
    args = ["--db", db, "prices", "cheapest", "--gpu", "H100", "--market", "on-demand", "--format", "json"]
    out = subprocess.run(
        [sys.executable, "-m", "spotopt", *args],
        cwd=elsewhere,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    rows = json.loads(out.stdout)
    assert rows and all(r["gpu"].startswith("H100") for r in rows)
    where = subprocess.run(
        [sys.executable, "-c", "import spotopt.migrations, spotopt.data; print(spotopt.migrations.__file__)"],
        cwd=elsewhere,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert where.startswith(str(site))
