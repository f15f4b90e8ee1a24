"""``spotopt collect`` end to end against the offline fakes of all three clouds, on both databases."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import responses
from moto import mock_aws
from sqlalchemy import func, select
from typer.testing import CliRunner

from spotopt.cli.app import app
from spotopt.cloud_calls import redact
from spotopt.clouds.registry import CLOUDS, COLLECTORS
from spotopt.db.engine import Database
from spotopt.db.models import PricePoint, Run
from spotopt.errors import InputError
from spotopt.history.setup import open_history
from tests.collect_fakes import (
    ADVISOR_URL,
    AwsError,
    AwsFake,
    add_azure_defaults,
    add_gcp_defaults,
    aws_env,
    azure_clients,
    fixture,
    gcp_clients,
    no_wait_retry,
    script_aws_defaults,
)

runner = CliRunner()


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsFake]:
    """Every cloud faked offline; ``spotopt collect`` builds its clients from these."""
    aws_env(monkeypatch)
    with mock_aws(), responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        aws = AwsFake()
        script_aws_defaults(aws)
        rsps.get(ADVISOR_URL, json=fixture("aws", "spot_advisor.json"))
        add_gcp_defaults(rsps)
        add_azure_defaults(rsps)
        makers: dict[str, Any] = {"aws": aws.clients, "gcp": gcp_clients, "azure": azure_clients}
        monkeypatch.setattr("spotopt.cli.collect.FACTORY", lambda cloud: makers[cloud]())
        monkeypatch.setattr("spotopt.cli.collect.RETRY", no_wait_retry())
        yield aws


def invoke(db_url: str, *args: str) -> Any:
    return runner.invoke(app, ["--db", db_url, *args])


def counts(db_url: str) -> tuple[int, int]:
    db = open_history(db_url)
    try:
        with db.session() as s:
            return s.scalar(select(func.count()).select_from(PricePoint)) or 0, s.scalar(
                select(func.count()).select_from(Run)
            ) or 0
    finally:
        db.dispose()


def test_collect_all_end_to_end_then_prices_show(db_url: str, fakes: AwsFake) -> None:
    result = invoke(db_url, "collect", "all", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {(r["cloud"], r["collector"], r["scope"], r["status"]) for r in rows} == {
        ("aws", "aws-catalog", "us-east-1", "ok"),
        ("aws", "aws-spot-prices", "us-east-1", "ok"),
        ("aws", "aws-on-demand", "us-east-1", "ok"),
        ("aws", "aws-placement-scores", "us-east-1", "ok"),
        ("aws", "aws-spot-advisor", "global", "ok"),
        ("azure", "azure-catalog", "global", "ok"),
        ("azure", "azure-prices", "eastus", "ok"),
        ("azure", "azure-eviction-rates", "global", "ok"),
        ("azure", "azure-spot-history", "global", "ok"),
        ("gcp", "gcp-catalog", "global", "ok"),
        ("gcp", "gcp-prices", "global", "ok"),
    }
    assert sum(r["inserted"] for r in rows) > 0

    # Collected points are shown like imported ones.
    shown = invoke(db_url, "prices", "show", "--cloud", "gcp", "--market", "spot", "--format", "json")
    assert shown.exit_code == 0, shown.output
    gcp = json.loads(shown.stdout)
    assert {(q["instance_type"], q["region"], q["source"]) for q in gcp} == {
        ("g2-standard-8", "us-central1", "gcp-prices"),
        ("n1-standard-8+1xnvidia-tesla-v100", "us-central1", "gcp-prices"),
    }
    g2 = next(q for q in gcp if q["instance_type"] == "g2-standard-8")
    assert g2["gpu"] == "L4" and g2["usd_per_hour"] == pytest.approx(0.34104)
    aws = json.loads(
        invoke(
            db_url, "prices", "show", "--instance-type", "g5.xlarge", "--market", "spot", "-f", "json"
        ).stdout
    )
    assert [(q["zone"], q["usd_per_hour"]) for q in aws][-1] == ("us-east-1a", 0.4123)
    csv_out = invoke(db_url, "prices", "show", "--cloud", "azure", "--market", "spot", "-f", "csv").stdout
    assert ",eastus,,Standard_NC4as_T4_v3,spot,T4,1,0.1578,0.1578,azure-prices" in csv_out

    # A second run over the same (overlapping) windows inserts no price twice.
    points_before, _ = counts(db_url)
    again = invoke(db_url, "collect", "all", "--format", "json")
    assert again.exit_code == 0, again.output
    second = {r["collector"]: r for r in json.loads(again.stdout)}
    assert second["aws-spot-prices"]["duplicate"] == 4 and second["aws-spot-prices"]["inserted"] == 0
    assert counts(db_url)[0] == points_before


def test_a_failing_scope_exits_3_after_committing_the_others(db_url: str, fakes: AwsFake) -> None:
    fakes.answer("ec2", "DescribeSpotPriceHistory", lambda p: AwsError("ServiceUnavailable", 503))
    result = invoke(db_url, "collect", "aws", "--region", "us-east-1", "--format", "csv")
    assert result.exit_code == 3
    assert "aws,aws-spot-prices,us-east-1,failed" in result.stdout
    assert "aws,aws-on-demand,us-east-1,ok" in result.stdout
    assert "1 of 5 scopes failed" in result.stderr


def test_dry_run_writes_nothing(db_url: str, fakes: AwsFake) -> None:
    before = counts(db_url)
    result = invoke(db_url, "collect", "gcp", "--dry-run", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["status"] for r in rows} == {"dry-run"} and sum(r["records"] for r in rows) > 0
    assert counts(db_url) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["collect", "awz"], "cloud 'awz' is not one of aws, gcp, azure or all"),
        (["collect", "aws", "--gpu", "Z900"], "--gpu 'Z900' matches no GPU model"),
        (["collect", "aws", "--region", "us east"], "--region 'us east' is not a region name"),
        (["collect", "aws", "--since", "yesterday"], "--since: 'yesterday' is not a time"),
    ],
)
def test_bad_input_names_the_field_and_changes_nothing(db_url: str, args: list[str], message: str) -> None:
    before = counts(db_url)
    result = invoke(db_url, *args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())
    assert counts(db_url) == before


def test_without_any_credentials_each_cloud_says_what_to_configure(
    db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    aws_env(monkeypatch)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key)
    for key in (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_CLOUD_PROJECT",
        "AZURE_SUBSCRIPTION_ID",
        "SPOTOPT_GCP_API_KEY",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    # google-auth reads NO_GCE_CHECK at import time; without it, it pings the metadata server
    # (refused here) with sleeps in between.
    monkeypatch.setattr("google.auth.compute_engine._metadata._NO_GCE_CHECK", True)
    monkeypatch.setattr("spotopt.cli.collect.RETRY", no_wait_retry())
    with responses.RequestsMock() as rsps:
        rsps.get(ADVISOR_URL, json=fixture("aws", "spot_advisor.json"))
        result = invoke(db_url, "collect", "all", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = {r["collector"]: r for r in json.loads(result.stdout)}
    assert rows["aws-spot-advisor"]["status"] == "ok"
    assert rows["aws-spot-prices"]["note"].startswith("configure AWS credentials")
    assert rows["gcp-catalog"]["note"].startswith("configure Application Default Credentials")
    assert rows["azure-catalog"]["note"].startswith("configure Azure credentials")
    assert {r["status"] for name, r in rows.items() if name != "aws-spot-advisor"} == {"skipped"}


def test_a_named_cloud_that_collected_nothing_exits_3(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    monkeypatch.setattr("spotopt.cli.collect.RETRY", no_wait_retry())
    result = invoke(db_url, "collect", "azure", "--format", "csv")
    assert result.exit_code == 3, result.output
    assert "(azure was asked for by name and collected nothing)" in result.stdout
    assert "4 of 4 scopes failed" in result.stderr


SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY",
    "AZURE_CLIENT_SECRET": "azure-client-secret-8Q~xYz123",
    "SPOTOPT_GCP_API_KEY": "AIzaSyFAKE-gcp-api-key-0123456789",
}


def test_secrets_in_api_errors_are_neither_stored_nor_printed_nor_logged(
    db_url: str, fakes: AwsFake, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    echoed = (
        "request rejected: " + ", ".join(SECRETS.values()) + f" (url ?key={SECRETS['SPOTOPT_GCP_API_KEY']})"
    )

    def raises(*args: Any, **kwargs: Any) -> Any:
        raise ValueError(echoed)

    # Each path a message takes: an AWS error reply, SDK exceptions of GCP and Azure calls, and
    # an exception outside any API call.
    fakes.answer("ec2", "DescribeSpotPriceHistory", lambda p: AwsError("InvalidParameterValue", 400, echoed))
    monkeypatch.setattr("spotopt.clouds.gcp.adaptor.GcpClients.skus_page", raises)
    monkeypatch.setattr("spotopt.clouds.azure.adaptor.AzureClients.retail_page", raises)
    monkeypatch.setattr("spotopt.clouds.aws.collectors.on_demand_price", raises)
    caplog.set_level(logging.DEBUG)
    result = invoke(db_url, "collect", "all", "--region", "us-east-1", "--format", "json")

    assert result.exit_code == 3, result.output
    failed = {r["collector"] for r in json.loads(result.stdout) if r["status"] == "failed"}
    assert failed == {"aws-spot-prices", "aws-on-demand", "gcp-prices", "azure-prices"}
    db = open_history(db_url)
    try:
        with db.session() as s:
            errors = [e for e in s.scalars(select(Run.error).where(Run.status == "failed")) if e]
    finally:
        db.dispose()
    assert len(errors) == len(failed) and all("request rejected" in e for e in errors)
    texts = {"runs.error": "\n".join(errors), "stdout": result.stdout, "stderr": result.stderr}
    texts["logs"] = caplog.text
    for name, value in SECRETS.items():
        for where, text in texts.items():
            assert value not in text, f"{name} appears in {where}"


def test_credentials_in_urls_are_redacted() -> None:
    text = "GET https://x/skus?pageToken=a&key=AIzaNotInTheEnv&sig=abc%2Fdef failed"
    assert redact(text) == "GET https://x/skus?pageToken=a&key=[redacted]&sig=[redacted] failed"


def test_unknown_collector_name_gets_did_you_mean() -> None:
    with pytest.raises(InputError, match="did you mean 'aws-spot-prices'"):
        COLLECTORS.lookup("aws-spot-price")
    assert COLLECTORS.lookup("gcp-prices").cloud == "gcp"


_SDKS = ("boto3", "botocore", "azure", "moto", "google.cloud", "google.auth")


def _loaded_after(imports: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules starting with one of ``prefixes`` that a fresh interpreter has loaded after
    running ``imports`` (a fresh process: this one has long imported everything)."""
    found = f"sorted(m for m in sys.modules if m.startswith({prefixes!r}))"
    code = f"import json, sys\n{imports}\nprint(json.dumps({found}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_importing_spotopt_and_its_cli_imports_no_cloud_sdk() -> None:
    imports = (
        "import spotopt, spotopt.cli.app, spotopt.history.collect\n"
        "from spotopt.clouds.registry import COLLECTORS\n"
    )
    assert _loaded_after(imports + "list(COLLECTORS)", _SDKS) == []


def test_adaptors_and_the_retry_rule_do_not_depend_on_the_collectors() -> None:
    """Adaptors, collectors and providers share ``cloud_calls``; it sits below all of them, so
    importing an adaptor (as a provider will) loads no collector and no SDK."""
    imports = (
        "import spotopt.cloud_calls, spotopt.clouds.aws.adaptor, spotopt.clouds.gcp.adaptor, "
        "spotopt.clouds.azure.adaptor"
    )
    collectors = tuple(module for cloud in CLOUDS.values() for module in cloud.collectors)
    assert _loaded_after(imports, ("spotopt.collectors", *collectors, *_SDKS)) == []
    # the probe does see imports
    assert _loaded_after("import spotopt.history.collect", ("spotopt.collectors",))


def test_the_collect_guide_documents_every_collector() -> None:
    guide = (Path(__file__).parent.parent / "docs" / "guides" / "collect.md").read_text()
    missing = [name for name in COLLECTORS if f"`{name}`" not in guide]
    assert missing == []


@pytest.mark.parametrize(("hidden", "cloud"), [("boto3", "aws"), ("google.cloud.compute_v1", "gcp")])
def test_a_cloud_without_its_sdk_is_skipped_with_the_pip_install(
    sqlite_db: Database, fakes: AwsFake, monkeypatch: pytest.MonkeyPatch, hidden: str, cloud: str
) -> None:
    """``pip install spotopt`` without the extras: that cloud is skipped naming the extra to
    install, the other clouds are still collected; asked for by name, the command exits 3.
    (SQLite only: nothing here depends on the database.)"""
    from spotopt.clouds.common.sdk import client_factory

    db_url = sqlite_db.engine.url.render_as_string()

    monkeypatch.setitem(sys.modules, hidden, None)  # as if not installed: importing it fails
    fake = {"aws": fakes.clients, "gcp": gcp_clients, "azure": azure_clients}
    monkeypatch.setattr(
        "spotopt.cli.collect.FACTORY", lambda c: client_factory(c) if c == cloud else fake[c]()
    )
    result = invoke(db_url, "collect", "all", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    mine = [r for r in rows if r["cloud"] == cloud]
    assert mine and {r["status"] for r in mine} == {"skipped"}
    assert all(f'pip install "spotopt-gpu[{cloud}]"' in r["note"] for r in mine)
    assert {r["status"] for r in rows if r["cloud"] != cloud} == {"ok"}
    for extra in ([], ["--dry-run"]):
        result = invoke(db_url, "collect", cloud, *extra, "--format", "json")
        assert result.exit_code == 3, result.output
        notes = [r["note"] for r in json.loads(result.stdout)]
        assert notes and all(f'pip install "spotopt-gpu[{cloud}]"' in n for n in notes)
