"""What an instance installs is the daemon's own wheel and lock, checked by sha256: the real start-up
script, run with bash, against a ``file://`` store and S3 served by moto (the downloader signs with
the instance role's keys from the fake IMDS; moto does not check signatures, so the signature is
checked against botocore's own signer below). The GCS and Azure Blob downloads run against fakes
of their token and object requests (``FakeObjects``).

The full install (``test_the_instance_runs_exactly_the_daemons_version``) needs the lock's wheels
offline: ``.ci/run`` downloads them (``pip download --require-hashes``) into a wheelhouse named by
``TEST_WHEELHOUSE``; without it the test skips, except in CI, where it fails.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
import urllib.parse
import zipfile
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from spotopt import DISTRIBUTION
from spotopt.checkpoints import Location
from spotopt.clouds.common import artifacts, fetch
from spotopt.clouds.common.artifacts import check_daemon_matches, check_lock, check_wheel, normalize, ship
from spotopt.clouds.common.base import LaunchSpec
from spotopt.clouds.common.bootstrap import render_script
from spotopt.clouds.common.fetch import sigv4_headers
from spotopt.errors import ConfigError
from spotopt.settings import Settings
from spotopt.types import MarketKey, MarketKind
from tests.fake_machines import boot, stop_group
from tests.fake_metadata import AZURE_TOKEN, GCP_TOKEN, ROLE_CREDENTIALS, FakeMetadata, metadata
from tests.stores import moto_s3, s3_store

__all__ = ["metadata", "moto_s3"]  # fixtures, imported for pytest

MARKET = MarketKey("aws", "us-east-1", "us-east-1a", "g5.xlarge", MarketKind.SPOT)
GCP_MARKET = MarketKey("gcp", "us-central1", "us-central1-a", "g2-standard-4", MarketKind.SPOT)
TIMEOUT_S = 300.0
VERSION = importlib.metadata.version(DISTRIBUTION)
RAN = "job-ran"


def _small_lock(tmp_path: Path) -> Path:
    """A lock in the required form, pinning one package at the version the daemon has (enough for
    the tests that stop before pip; the full install uses the shipped lock)."""
    lock = tmp_path / "small.lock"
    lock.write_text(f"pyyaml=={importlib.metadata.version('pyyaml')} \\\n    --hash=sha256:{'0' * 64}\n")
    return lock


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    if not python.exists():  # an "image" whose venv exists: the script does not create one
        python.symlink_to(sys.executable)
    values: dict[str, Any] = {
        "bootstrap_venv": str(venv),
        "bootstrap_lock": str(_small_lock(tmp_path)),
        "bootstrap_workdir": str(tmp_path / "work"),
        "bootstrap_shutdown": False,
    }
    return Settings(**(values | overrides))


def _run(script: str, home: Path) -> tuple[int, str]:
    """Run ``script`` as an instance would: bash, its own process group, no pip configuration of
    this machine (only what the script says), no SPOTOPT_* of the test process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTOPT_", "PIP_"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    console = home / "console.log"
    proc = boot(script, home / "startup.sh", console, env, home)
    try:
        status = proc.wait(timeout=TIMEOUT_S)
    finally:
        stop_group(proc, 0)
    return status, console.read_text(encoding="utf-8")


def _job(store: str, options: dict[str, Any] | None = None, **env: str) -> LaunchSpec:
    marker = ("python", "-c", f"open({RAN!r}, 'w').write('ran')")
    return LaunchSpec("install-job", 1, marker, store, storage_options=options or {}, env=env)


def _tamper(loc: Location, key: str) -> None:
    path = loc.path(*key.split("/"))
    loc.write_bytes(path, loc.fs.cat_file(path) + b"\n# one more line\n")


@pytest.mark.parametrize("what", ["wheel", "lock"])
def test_a_tampered_artifact_in_a_file_store_is_refused_before_the_job_runs(
    what: str, tmp_path: Path
) -> None:
    store = f"file://{tmp_path / 'store'}"
    settings = _settings(tmp_path)
    spec = _job(store)
    script = render_script(spec, GCP_MARKET, settings)
    shipped = ship(settings, store, {})
    assert f"--hash=sha256:{shipped.wheel.sha256}" in script and shipped.lock.sha256 in script
    assert "--require-hashes" in script and "--only-binary :all:" in script
    _tamper(Location(store), getattr(shipped, what).key)

    status, console = _run(script, tmp_path)
    assert status != 0, console
    assert f"{getattr(shipped, what).key}: sha256 " in console and "refusing to install it" in console
    if what == "lock":
        assert f"{shipped.wheel.key}: sha256 verified" in console  # the wheel itself was fine
    assert not (tmp_path / "work" / RAN).exists(), "the job ran after a refused artifact"
    assert "spotopt: job exited" not in console


def test_a_tampered_wheel_in_s3_is_refused_and_the_download_used_the_instance_role(
    tmp_path: Path, moto_s3: str, metadata: FakeMetadata
) -> None:
    store = s3_store(moto_s3)
    settings = _settings(tmp_path)
    spec = _job(store.url, store.storage_options, SPOTOPT_AWS_METADATA_URL=metadata.url)
    script = render_script(spec, MARKET, settings)
    assert "testing" not in script.split("SPOTOPT_STORAGE_OPTIONS", 1)[0]  # nothing but the job's env
    shipped = ship(settings, store.url, store.storage_options)
    _tamper(store.location(), shipped.wheel.key)

    status, console = _run(script, tmp_path)
    assert status != 0 and "refusing to install it" in console, console
    assert "PUT /latest/api/token" in metadata.requests
    assert "GET /latest/meta-data/iam/security-credentials/spotopt-agent" in metadata.requests
    assert not (tmp_path / "work" / RAN).exists()


def test_the_s3_signature_is_botocores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The downloader's SigV4 headers equal botocore's ``S3SigV4Auth`` for the same request
    (a key that needs encoding, a session token, the same clock)."""
    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = (
        "https://bucket.s3.eu-west-1.amazonaws.com/stores/_spotopt/artifacts/ab/spotopt_gpu-0.1.0%2Bx-py3.whl"
    )
    now = datetime(2026, 11, 25, 3, 4, 5, tzinfo=UTC)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: now)
    ours = sigv4_headers(url, "eu-west-1", ROLE_CREDENTIALS, now)
    creds = ROLE_CREDENTIALS
    theirs = AWSRequest(method="GET", url=url, headers={"x-amz-content-sha256": ours["x-amz-content-sha256"]})
    signer = botocore.auth.S3SigV4Auth(
        Credentials(creds["AccessKeyId"], creds["SecretAccessKey"], creds["Token"]), "s3", "eu-west-1"
    )
    signer.add_auth(theirs)
    assert ours["Authorization"] == theirs.headers["Authorization"]
    assert ours["x-amz-date"] == theirs.headers["X-Amz-Date"]
    assert ours["x-amz-security-token"] == theirs.headers["X-Amz-Security-Token"]


def test_the_shipped_artifacts_are_content_addressed_and_uploaded_once(tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'store'}"
    settings = _settings(tmp_path)
    first = ship(settings, store, {})
    data = (tmp_path / "store" / first.wheel.key).read_bytes()
    assert first.wheel.key == f"_spotopt/artifacts/{hashlib.sha256(data).hexdigest()}/{first.wheel.file_name}"
    assert first.wheel.file_name.startswith(f"spotopt_gpu-{VERSION}-") and first.requirement == DISTRIBUTION
    names = set(zipfile.ZipFile(tmp_path / "store" / first.wheel.key).namelist())
    assert {"spotopt/clouds/common/fetch.py", "spotopt/data/locks/instance-s3.txt"} <= names
    assert ship(settings, store, {}) == first
    assert artifacts.store_extra("s3://b/p") == "s3" and artifacts.store_extra(store) is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"bootstrap_pip_spec": "spotopt"},
            r"^bootstrap_pip_spec: 'spotopt' would install whatever an index",
        ),
        ({"bootstrap_wheel": "spotopt==0.1.0"}, r"^bootstrap_wheel: 'spotopt==0.1.0' is a requirement, not"),
        ({"bootstrap_wheel": "spotopt-gpu"}, r"^bootstrap_wheel: 'spotopt-gpu' is a requirement"),
    ],
)
def test_a_bare_requirement_is_refused_in_one_line(
    overrides: dict[str, str], message: str, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, **overrides)
    with pytest.raises(ConfigError, match=message) as caught:
        render_script(_job(f"file://{tmp_path}"), MARKET, settings)
    assert "\n" not in str(caught.value)
    from spotopt.clouds.common.router import build_cloud

    with pytest.raises(ConfigError, match=message):
        build_cloud("aws", settings, [])


def test_a_wheel_of_another_name_or_version_is_refused(tmp_path: Path) -> None:
    for name in ("spotopt-0.1.0-py3-none-any.whl", "spotopt_gpu-9.9.9-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"PK")
        with pytest.raises(ConfigError, match=r"^bootstrap_wheel: .* but the daemon runs spotopt-gpu"):
            check_wheel(tmp_path / name, VERSION)
    with pytest.raises(ConfigError, match="is not a wheel file"):
        check_wheel(tmp_path / "missing.whl", VERSION)


@pytest.mark.parametrize(
    "line",
    [
        "numpy",
        "numpy>=2",
        "numpy==2.1.0",
        "numpy==2.1.0 --hash=md5:0123",
        "-e .",
        "--index-url https://example.org/simple",
        "https://example.org/numpy-2.1.0-py3-none-any.whl",
        f"spotopt-gpu==0.1.0 --hash=sha256:{'a' * 64}",
    ],
)
def test_a_lock_that_is_not_hash_pinned_throughout_is_refused(line: str) -> None:
    good = f"pyyaml==6.0.2 \\\n    --hash=sha256:{'b' * 64}\n    # via spotopt-gpu\n"
    assert check_lock(good, "lock") == {"pyyaml": {"6.0.2"}}
    with pytest.raises(ConfigError, match=r"^lock: "):
        check_lock(good + line + "\n", "lock")


def test_a_lock_of_other_versions_than_the_daemons_is_refused() -> None:
    mine = importlib.metadata.version("pyyaml")
    check_daemon_matches({"pyyaml": {mine}, "not-installed-here": {"1.0"}}, "lock")
    with pytest.raises(
        ConfigError, match=r"^lock: instances would run other versions than the daemon: pyyaml"
    ):
        check_daemon_matches({"pyyaml": {"0.0.1"}}, "lock")


def test_the_daemon_checks_the_install_settings_before_its_first_round(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    artifacts.check_install(settings)  # the small lock pins the daemon's own pyyaml
    other = tmp_path / "other.lock"
    other.write_text(f"pyyaml==0.0.1 --hash=sha256:{'0' * 64}\n")
    with pytest.raises(ConfigError, match=r"^bootstrap_lock .*: instances would run other versions"):
        artifacts.check_install(settings.model_copy(update={"bootstrap_lock": str(other)}))
    with pytest.raises(ConfigError, match="is not a wheel file"):
        artifacts.check_install(settings.model_copy(update={"bootstrap_wheel": str(tmp_path / "x.whl")}))


def test_the_shipped_locks_are_hash_pinned_and_name_every_runtime_requirement() -> None:
    """Each shipped lock passes ``check_lock`` and pins every requirement of the distribution
    (and of the store's extra); pip's ``--require-hashes`` would refuse a lock missing one."""
    dist = importlib.metadata.distribution(DISTRIBUTION)
    for extra in (None, "s3", "gcs", "azure-storage"):
        _, text = artifacts.instance_lock(
            None, {None: "file:///x", "s3": "s3://b", "gcs": "gs://b", "azure-storage": "az://c"}[extra]
        )
        pins = check_lock(text.decode(), str(extra))
        for requirement in dist.requires or []:
            name, _, marker = requirement.partition(";")
            wanted_extra = marker.split("extra ==")[-1].strip(" \"'") if "extra ==" in marker else None
            if wanted_extra in (None, extra):
                assert (
                    normalize(name.split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip()) in pins
                ), (
                    extra,
                    requirement,
                )


def _wheelhouse_index(tmp_path: Path) -> str:
    """A PEP 503 index (``simple/<project>/<files>``) of the CI wheelhouse, as a ``file://`` URL."""
    house = os.environ.get("TEST_WHEELHOUSE")
    if not house:
        if os.environ.get("CI") == "true":
            pytest.fail("TEST_WHEELHOUSE is not set: .ci/run downloads the lock's wheels for this test")
        pytest.skip("TEST_WHEELHOUSE is not set (.ci/run sets it)")
    simple = tmp_path / "simple"
    projects: dict[str, list[Path]] = {}
    for wheel in Path(house).glob("*.whl"):
        projects.setdefault(normalize(wheel.name.split("-")[0]), []).append(wheel)
    for name, wheels in projects.items():
        (simple / name).mkdir(parents=True)
        links = "".join(f'<a href="{w.as_uri()}">{w.name}</a>\n' for w in wheels)
        (simple / name / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return simple.as_uri()


def test_the_instance_runs_exactly_the_daemons_version(
    tmp_path: Path, moto_s3: str, metadata: FakeMetadata
) -> None:
    """The whole path on the instance: a fresh venv, the daemon's wheel and the shipped s3 lock
    downloaded from moto with the role's keys, verified, installed by pip with ``--require-hashes``
    from an offline index of the lock's wheels; then the instance's ``spotopt --version`` is the
    daemon's, its spotopt is the installed wheel (not this checkout), and the same wheel packed
    again there from the installed files (``artifacts._repack``) has the same contents."""
    index = _wheelhouse_index(tmp_path)
    store = s3_store(moto_s3)
    settings = Settings(
        bootstrap_venv=str(tmp_path / "venv"),
        bootstrap_workdir=str(tmp_path / "work"),
        bootstrap_shutdown=False,
        bootstrap_index_url=index,
    )
    check = (
        "import json, spotopt, spotopt.clouds.common.artifacts as a, importlib.metadata as m; "
        "name, data = a.own_wheel(None); open('repacked.whl', 'wb').write(data); "
        "print(json.dumps({'file': spotopt.__file__, 'name': name}))"
    )
    command = ("bash", "-c", f"spotopt --version > version.txt && python -c {json.dumps(check)} > where.json")
    spec = LaunchSpec(
        "install-job",
        1,
        command,
        store.url,
        storage_options=store.storage_options,
        env={"SPOTOPT_AWS_METADATA_URL": metadata.url},
    )
    script = render_script(spec, MARKET, settings)
    shipped = ship(settings, store.url, store.storage_options)

    status, console = _run(script, tmp_path)
    assert status == 0, console[-3000:]
    work = tmp_path / "work"
    assert (work / "version.txt").read_text().strip() == f"{DISTRIBUTION} {VERSION}"
    where = json.loads((work / "where.json").read_text())
    assert where["file"].startswith(str(tmp_path / "venv")), where
    original = zipfile.ZipFile(store.location().fs.open(store.location().path(*shipped.wheel.key.split("/"))))
    again = zipfile.ZipFile(work / "repacked.whl")
    record = f"spotopt_gpu-{VERSION}.dist-info/RECORD"
    assert where["name"] == shipped.wheel.file_name
    assert {n: again.read(n) for n in again.namelist() if n != record} == {
        n: original.read(n) for n in original.namelist() if n != record
    }


class FakeObjects:
    """GCS's JSON API media download and Azure Blob's ``Get Blob`` on 127.0.0.1, each answering
    only a request with the bearer token the fake metadata service hands out."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.seen.append((self.path, dict(self.headers)))
                auth = self.headers.get("Authorization", "")
                parts = urllib.parse.urlsplit(self.path)
                if parts.path.startswith("/storage/v1/b/"):  # /storage/v1/b/BUCKET/o/OBJECT?alt=media
                    bucket, _, name = parts.path.removeprefix("/storage/v1/b/").partition("/o/")
                    key = f"gs://{bucket}/{urllib.parse.unquote(name)}"
                    allowed = auth == f"Bearer {GCP_TOKEN}" and parts.query == "alt=media"
                else:  # /CONTAINER/BLOB
                    key = f"az:/{urllib.parse.unquote(parts.path)}"
                    allowed = (
                        auth == f"Bearer {AZURE_TOKEN}"
                        and self.headers.get("x-ms-version", "") >= "2017-11-09"
                    )
                body = owner.objects.get(key) if allowed else None
                self.send_response(200 if body is not None else (404 if allowed else 401))
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def objects() -> Iterator[FakeObjects]:
    fake = FakeObjects()
    yield fake
    fake.close()


FETCH = Path(fetch.__file__)


@pytest.mark.parametrize("cloud", ["gcp", "azure"])
def test_the_downloader_reads_gcs_and_blob_storage_with_the_instance_identity(
    cloud: str, tmp_path: Path, metadata: FakeMetadata, objects: FakeObjects
) -> None:
    """``fetch.py`` as the script runs it (the image's python, no spotopt), against the fakes:
    a token from the metadata service, the object with it, the sha256 checked either way."""
    data = b"wheel bytes"
    key = "_spotopt/artifacts/ab/spotopt_gpu-0.1.0-py3-none-any.whl"
    if cloud == "gcp":
        store, options = "gs://bucket/stores", {"endpoint_url": f"http://{objects.host}"}
        objects.objects[f"gs://bucket/stores/{key}"] = data
    else:
        store, options = "az://container/stores", {"account_host": objects.host}
        objects.objects[f"az://container/stores/{key}"] = data
    identity = (
        "/subscriptions/s/resourceGroups/g/providers/Microsoft.ManagedIdentity/userAssignedIdentities/a"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    env |= {
        f"SPOTOPT_{cloud.upper()}_METADATA_URL": metadata.url,
        "SPOTOPT_STORAGE_OPTIONS": json.dumps(options),
    }

    def fetch_to(dest: Path, sha: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-I", str(FETCH), store, "r", identity, key, sha, str(dest)]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    good = fetch_to(tmp_path / "good.whl", hashlib.sha256(data).hexdigest())
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "good.whl").read_bytes() == data
    if cloud == "azure":
        assert metadata.azure_identity == identity
    bad = fetch_to(tmp_path / "bad.whl", "0" * 64)
    assert bad.returncode != 0 and "refusing to install it" in bad.stderr
    assert not (tmp_path / "bad.whl").exists()
    objects.objects.clear()
    missing = fetch_to(tmp_path / "missing.whl", "0" * 64)
    assert missing.returncode != 0 and "HTTP 404" in missing.stderr
