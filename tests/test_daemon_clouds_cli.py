"""``spotopt daemon run --provider clouds`` as a user runs it: a cloud without settings or
credentials is named with what to configure, its markets are left out, and the daemon still
plans (dry run) and launches (``--once``, AWS against moto's server) with the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from spotopt.db.engine import Database
from spotopt.db.models import DaemonTick, JournalEntry, Placement
from spotopt.history.ingest import run_ingest
from spotopt.mover import jobs as jobstore
from spotopt.types import MarketKey, MarketKind, PriceObservation
from tests.fake_ec2 import FAKE_CREDENTIALS, moto_ec2
from tests.helpers import cli, strict_json
from tests.mover_world import a_day_ago, job_yaml, on_demand, spot
from tests.stores import moto_s3
from tests.test_provider_aws import PROFILE, aws_env, session

__all__ = ["aws_env", "moto_ec2", "moto_s3", "session"]

GCP_V100 = "n1-standard-8+1xnvidia-tesla-v100"
GCP_WARNING = (
    "warning: gcp: gcp_image is not set: set SPOTOPT_GCP_IMAGE to the boot image "
    "(projects/P/global/images/family/F); its markets are left out of this run"
)

AZURE_WARNING = (
    "warning: azure: azure_resource_group is not set: set SPOTOPT_AZURE_RESOURCE_GROUP to the "
    "resource group VMs are created in; its markets are left out of this run"
)


@pytest.fixture
def two_clouds(db: Database, tmp_path: Path) -> Path:
    """A job that may run on AWS or GCP, where GCP's V100 spot is the cheapest."""
    gcp = MarketKey("gcp", "us-central1", "us-central1-a", GCP_V100, MarketKind.SPOT)
    run_ingest(
        db,
        "test",
        "test",
        [
            spot("us-east-1a", 0.9, a_day_ago()),
            on_demand(3.06, a_day_ago()),
            PriceObservation(gcp, a_day_ago(), 0.2),
        ],
    )
    path = job_yaml(tmp_path, clouds="[aws, gcp]", instance_types=f"[p3.2xlarge, {GCP_V100}]")
    jobstore.submit(db, path)
    (tmp_path / "mlp.until").write_text("5", encoding="utf-8")
    return tmp_path


@pytest.fixture
def aws_configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """AWS settings and (fake) credentials; GCP and Azure left unconfigured."""
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("SPOTOPT_AWS_IMAGE_ID", "ami-03cf127a")
    monkeypatch.setenv("SPOTOPT_AWS_INSTANCE_PROFILE", PROFILE)
    monkeypatch.setenv("SPOTOPT_BOOTSTRAP_WORKDIR", str(tmp_path / "instance"))
    monkeypatch.setenv(
        "SPOTOPT_BOOTSTRAP_INSTALL", "false"
    )  # tests/test_instance_install.py runs the install


def rows(db: Database, model: type) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def _decisions(out: str) -> list[tuple[str, str]]:
    return [(d["kind"], d["to"]) for d in strict_json(out)["decisions"]]


def test_a_dry_run_names_the_unconfigured_cloud_and_plans_with_the_others(
    db_url: str, db: Database, two_clouds: Path, aws_configured: None
) -> None:
    # Every market counts without a cloud provider: GCP's cheap spot is the plan.
    code, out, err = cli("--db", db_url, "daemon", "run", "--dry-run", "--format", "json")
    assert code == 0, err
    assert _decisions(out) == [("start", f"gcp/us-central1-a/{GCP_V100}/spot")]

    code, out, err = cli(
        "--db", db_url, "daemon", "run", "--dry-run", "--provider", "clouds", "--format", "json"
    )
    assert code == 0, err
    assert _decisions(out) == [("start", "aws/us-east-1a/p3.2xlarge/spot")]
    # One line per unconfigured cloud (the history also has Azure's list prices).
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [GCP_WARNING, AZURE_WARNING]
    assert (rows(db, Placement), rows(db, JournalEntry)) == (0, 0)


def test_no_usable_cloud_is_a_one_line_error_and_changes_nothing(
    db_url: str, db: Database, two_clouds: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _out, err = cli("--db", db_url, "daemon", "run", "--once", "--provider", "clouds")
    assert code == 2
    assert "aws: aws_image_id is not set: set SPOTOPT_AWS_IMAGE_ID" in err and GCP_WARNING in err
    assert "--provider clouds: no cloud can be used" in err and "Traceback" not in err
    assert (rows(db, DaemonTick), rows(db, Placement)) == (0, 0)
    # One cloud asked for by name is checked the same way.
    code, _out, err = cli("--db", db_url, "daemon", "run", "--dry-run", "--provider", "gcp")
    assert code == 2 and GCP_WARNING in err and "--provider gcp: no cloud can be used" in err


def test_once_launches_on_aws_through_its_endpoint_and_skips_the_unconfigured_cloud(
    db_url: str,
    db: Database,
    two_clouds: Path,
    aws_configured: None,
    session: Any,
    moto_ec2: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real (non-dry) path: the instance is launched in moto (nothing runs it here: the
    scenarios with running instances are ``tests.test_daemon_aws``)."""
    monkeypatch.setenv("SPOTOPT_AWS_ENDPOINT_URL", moto_ec2)
    code, out, err = cli(
        "--db", db_url, "daemon", "run", "--once", "--provider", "clouds", "--format", "json"
    )
    assert code == 0, err
    assert GCP_WARNING in err and len(strict_json(out)["opened_moves"]) == 1
    with db.session() as s:
        (placement,) = s.scalars(select(Placement)).all()
    assert placement.instance_id is not None and placement.instance_id.startswith("aws:i-")
    assert placement.instance_id.endswith("@us-east-1")
    ec2_id = placement.instance_id.removeprefix("aws:").split("@")[0]
    ec2 = session.client("ec2", endpoint_url=moto_ec2)
    (raw,) = [i for r in ec2.describe_instances(InstanceIds=[ec2_id])["Reservations"] for i in r["Instances"]]
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags["spotopt:job"] == "mlp" and raw["Placement"]["AvailabilityZone"] == "us-east-1a"
    ec2.terminate_instances(InstanceIds=[ec2_id])
