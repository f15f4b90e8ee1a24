"""The start-up script a cloud instance runs at boot: Python, spotopt, the agent's environment, the job.

``render_script(spec, market, settings)`` is one bash script for the three clouds; only
the header (how the cloud runs it, where its output goes) and the size limit differ:

- **AWS user data**: cloud-init runs a user-data payload that starts with ``#!`` once, as root,
  at first boot; output in ``/var/log/cloud-init-output.log``. Limit 16 KB before base64
  (EC2 User Guide, "Work with instance user data"; boto3 base64-encodes ``UserData`` itself).
- **GCP** ``startup-script`` metadata: the guest agent runs it as root at every boot; output in
  the serial console and the journal (``google_metadata_script_runner``). Limit 256 KB per
  metadata value.
- **Azure custom data**: a plain ``#!`` shell script, not a ``#cloud-config``. cloud-init runs a
  custom-data payload that starts with ``#!`` exactly as AWS user data (once, as root, first
  boot), so the three clouds run the same tested bash; a ``#cloud-config`` ``runcmd`` would carry
  the same commands quoted a second time inside YAML for nothing. Limit 65535 bytes after
  decoding (``osProfile.customData``).

What the script does, in order: exports the agent environment
(``spotopt.clouds.common.base.agent_environment``, every value ``shlex.quote``-d); creates the
virtualenv ``bootstrap_venv`` with ``bootstrap_python`` if it does not exist; with
``bootstrap_install`` (the default), downloads the daemon's own wheel and dependency lock from
the checkpoint store (``spotopt.clouds.common.artifacts`` put them there; ``spotopt.clouds.common.fetch``,
whose source the script carries, reads them with the instance's identity and checks the sha256
sums written in the script) and installs them with ``pip install --require-hashes --only-binary
:all:``; puts the virtualenv's ``bin`` first on ``PATH``; runs the job's command in its workdir;
and, with ``bootstrap_shutdown``, powers the instance off when the command ends. A download or
hash that does not verify, or a pip failure, ends the script with a non-zero status before the
job's command runs. No credential is ever written into the script: the store is reached with
the instance's own identity (instance profile, service account, managed identity).
"""

from __future__ import annotations

import functools
import importlib.resources
import shlex

from spotopt.checkpoints.location import BACKENDS, scheme_of
from spotopt.clouds.common.artifacts import Shipment, ship
from spotopt.clouds.common.base import LaunchSpec, agent_environment
from spotopt.clouds.registry import CLOUD_SCRIPTS
from spotopt.errors import ConfigError
from spotopt.settings import Settings
from spotopt.types import MarketKey


@functools.cache
def fetch_source() -> str:
    """``spotopt/clouds/common/fetch.py`` without its module docstring: the downloader the script runs."""
    text = importlib.resources.files("spotopt.clouds.common").joinpath("fetch.py").read_text(encoding="utf-8")
    body = text.split('"""', 2)[2]
    return body.strip("\n")


def _check_reachable(spec: LaunchSpec, settings: Settings) -> None:
    """The store is one an instance can reach, and (to install from it) download from."""
    scheme = scheme_of(spec.checkpoint_uri)
    if scheme not in BACKENDS:
        raise ConfigError(
            f"checkpoint URI {spec.checkpoint_uri!r}: scheme {scheme!r} is not one spotopt can reach from "
            f"an instance; use one of {', '.join(s + '://' for s in BACKENDS)}"
        )
    options = spec.storage_options
    if (
        settings.bootstrap_install
        and scheme in ("az", "abfs")
        and not (
            options.get("account_name")
            or options.get("account_host")
            or "AZURE_STORAGE_ACCOUNT_NAME" in spec.env
        )
    ):
        raise ConfigError(
            f"job {spec.job}: {spec.checkpoint_uri} names no storage account; set account_name in the "
            "job's storage options (the start-up script downloads spotopt from it)"
        )


def store_identity(cloud: str, settings: Settings) -> str | None:
    """The identity an instance of ``cloud`` reads the store with, where it has a choice of
    them (``CloudScript.identity_setting``); None: its only one. An AWS or GCP instance never
    carries an Azure identity's name."""
    how = CLOUD_SCRIPTS.get(cloud)
    setting = how.identity_setting if how is not None else None
    value = getattr(settings, setting) if setting else None
    return str(value) if value else None


def install_lines(shipped: Shipment, spec: LaunchSpec, market: MarketKey, settings: Settings) -> list[str]:
    """The script's lines that download, verify and install ``shipped`` into ``$SPOTOPT_VENV``.

    The wheel's line joins the verified lock in ``install.txt`` with the wheel's own hash, so
    pip checks every file it installs; ``--only-binary :all:`` keeps pip from running any
    package's build code (an sdist's build dependencies are not hash-checked)."""
    q = shlex.quote
    wheel, lock = shipped.wheel, shipped.lock
    pip = ["--quiet", "--no-input", "--require-hashes", "--only-binary", ":all:"]
    if settings.bootstrap_index_url:
        pip += ["--index-url", settings.bootstrap_index_url]
    where = [spec.checkpoint_uri, market.region, store_identity(market.cloud, settings) or "-"]
    fetch = [*(q(a) for a in where), q(wheel.key), wheel.sha256, f'"$A/{wheel.file_name}"']
    fetch += [q(lock.key), lock.sha256, '"$A/requirements.txt"']
    requirement = f"{shipped.requirement} @ file://$A/{wheel.file_name} --hash=sha256:{wheel.sha256}"
    return [
        'A="$SPOTOPT_VENV/spotopt-artifacts"',
        'mkdir -p "$A"',
        'A=$(cd "$A" && pwd)',
        f"{q(settings.bootstrap_python)} - {' '.join(fetch)} <<'SPOTOPT_FETCH'",
        fetch_source(),
        "SPOTOPT_FETCH",
        f"printf '%s\\n' '-r requirements.txt' \"{requirement}\" > \"$A/install.txt\"",
        f'"$SPOTOPT_VENV/bin/python" -m pip install {" ".join(q(a) for a in pip)} -r "$A/install.txt"',
    ]


def render_script(spec: LaunchSpec, market: MarketKey, settings: Settings) -> str:
    """The bash start-up script that runs ``spec`` on an instance of ``market`` (see the module
    doc); the market's cloud says how the script is delivered and run, so the two cannot
    disagree."""
    cloud = market.cloud
    if cloud not in CLOUD_SCRIPTS:
        known = ", ".join(CLOUD_SCRIPTS)
        raise ConfigError(f"start-up script: cloud {cloud!r} is unknown; use one of {known}")
    if not spec.command:
        raise ConfigError(f"job {spec.job}: the launch spec has no command to run on the instance")
    _check_reachable(spec, settings)
    how = CLOUD_SCRIPTS[cloud]
    q = shlex.quote
    venv = settings.bootstrap_venv
    workdir = spec.workdir or settings.bootstrap_workdir
    lines = [
        "#!/bin/bash",
        f"# spotopt start-up script ({how.delivered_as}) for job {spec.job}, epoch {spec.epoch},",
        f"# market {market.cloud}/{market.region}/{market.zone or '-'}/{market.instance_type}/{market.kind}.",
        f"# {how.runs}.",
        "# No credentials here: the checkpoint store is reached with the instance's own identity.",
        "set -euo pipefail",
        *(f"export {name}={q(value)}" for name, value in agent_environment(spec, market).items()),
        f"SPOTOPT_VENV={q(venv)}",
        'if [ ! -x "$SPOTOPT_VENV/bin/python" ]; then',
        f'  {q(settings.bootstrap_python)} -m venv "$SPOTOPT_VENV"',
        "fi",
    ]
    if settings.bootstrap_install:
        lines += install_lines(
            ship(settings, spec.checkpoint_uri, spec.storage_options), spec, market, settings
        )
    lines += [
        'export PATH="$SPOTOPT_VENV/bin:$PATH"',
        f"mkdir -p {q(workdir)}",
        f"cd {q(workdir)}",
        "set +e",
        " ".join(q(part) for part in spec.command),
        "status=$?",
        "set -e",
        'echo "spotopt: job exited with status $status"',
    ]
    if settings.bootstrap_shutdown:
        lines.append("shutdown -h now || poweroff")
    lines += ['exit "$status"', ""]
    script = "\n".join(lines)
    size = len(script.encode("utf-8"))
    if size > how.limit_bytes:
        raise ConfigError(
            f"job {spec.job}: the start-up script is {size} bytes, over {how.delivered_as}'s limit of "
            f"{how.limit_bytes}; shorten the command or the job's environment"
        )
    return script
