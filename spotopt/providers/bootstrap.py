"""The start-up script a cloud instance runs at boot: Python, spotopt, the agent's environment, the job.

``render_script(cloud, spec, market, settings)`` is one bash script for the three clouds; only
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
(``spotopt.providers.base.agent_environment``, every value ``shlex.quote``-d); creates the
virtualenv ``bootstrap_venv`` with ``bootstrap_python`` if it does not exist; pip-installs
``bootstrap_pip_spec`` with the extra the checkpoint store needs (``s3``, ``gcs`` or
``azure-storage``; none for ``file://``), unless that setting is empty (an image that already
has spotopt, and the offline tests); puts the virtualenv's ``bin`` first on ``PATH``; runs the
job's command in its workdir; and, with ``bootstrap_shutdown``, powers the instance off when the
command ends. No credential is ever written into the script: the store is reached with the
instance's own identity (instance profile, service account, managed identity), which the
store's SDK finds by itself.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from spotopt.checkpoints.location import BACKENDS, scheme_of
from spotopt.errors import ConfigError
from spotopt.providers.base import LaunchSpec, agent_environment
from spotopt.settings import Settings
from spotopt.types import MarketKey


@dataclass(frozen=True, slots=True)
class CloudScript:
    """What differs per cloud: how the script is delivered and run, and its size limit."""

    delivered_as: str
    runs: str
    limit_bytes: int


CLOUD_SCRIPTS: dict[str, CloudScript] = {
    "aws": CloudScript(
        "EC2 user data",
        "cloud-init runs it once, as root, at first boot; output: /var/log/cloud-init-output.log",
        16 * 1024,
    ),
    "gcp": CloudScript(
        "GCE startup-script metadata",
        "the guest agent runs it as root at every boot; output: serial console and journal",
        256 * 1024,
    ),
    "azure": CloudScript(
        "Azure custom data",
        "a #! script, so cloud-init runs it once, as root, at first boot; "
        "output: /var/log/cloud-init-output.log",
        65535,
    ),
}

_REQUIREMENT = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?:\[(?P<extras>[^\]]*)\])?(?P<rest>.*)$"
)
"""PEP 508's name, optional ``[extras]``, and the rest (version specifiers, ``@ URL``, markers)."""
_REQUIREMENT_REST = re.compile(r"^\s*($|[=<>!~;@(])")
"""What may follow a requirement's name; anything else (``/``, ``:``) is not a requirement."""
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
ARCHIVES = (".whl", ".tar.gz", ".zip")
"""A bare file name ending so is a relative path, which means nothing on the instance."""


def pip_requirement(pip_spec: str, checkpoint_uri: str) -> str:
    """``pip_spec`` with the checkpoint store's extra added (``spotopt`` → ``spotopt[s3]``).

    A requirement (``spotopt``, ``spotopt==0.3``, ``spotopt @ https://…``) gets the extra after
    its name; an absolute path (on the instance) or a URL to a source tree or wheel becomes
    ``spotopt[extra] @ URL`` so pip reads the extra either way; a relative path is refused (it
    would be resolved on the daemon's machine, not the instance). A ``file://`` store needs no extra.
    """
    scheme = scheme_of(checkpoint_uri)
    if scheme not in BACKENDS:
        raise ConfigError(
            f"checkpoint URI {checkpoint_uri!r}: scheme {scheme!r} is not one spotopt can reach from "
            f"an instance; use one of {', '.join(s + '://' for s in BACKENDS)}"
        )
    backend = BACKENDS[scheme]
    extra = backend[1] if backend else None
    if _URL.match(pip_spec) or pip_spec.startswith("/"):
        url = pip_spec if _URL.match(pip_spec) else Path(pip_spec).as_uri()
        return f"spotopt[{extra}] @ {url}" if extra else f"spotopt @ {url}"
    match = _REQUIREMENT.match(pip_spec)
    bare_file = match is not None and not match.group("rest") and pip_spec.endswith(ARCHIVES)
    if match is None or not _REQUIREMENT_REST.match(match.group("rest")) or bare_file:
        raise ConfigError(
            f"bootstrap_pip_spec: {pip_spec!r} is neither a requirement (spotopt, spotopt==0.3) nor an "
            "absolute path or URL on the instance; fix SPOTOPT_BOOTSTRAP_PIP_SPEC"
        )
    extras = [e.strip() for e in (match.group("extras") or "").split(",") if e.strip()]
    if extra and extra not in extras:
        extras.append(extra)
    listed = f"[{','.join(extras)}]" if extras else ""
    return f"{match.group('name')}{listed}{match.group('rest')}"


def render_script(cloud: str, spec: LaunchSpec, market: MarketKey, settings: Settings) -> str:
    """The bash start-up script that runs ``spec`` on an instance of ``cloud`` (see the module doc)."""
    if cloud not in CLOUD_SCRIPTS:
        known = ", ".join(CLOUD_SCRIPTS)
        raise ConfigError(f"start-up script: cloud {cloud!r} is unknown; use one of {known}")
    if not spec.command:
        raise ConfigError(f"job {spec.job}: the launch spec has no command to run on the instance")
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
    if settings.bootstrap_pip_spec.strip():
        requirement = pip_requirement(settings.bootstrap_pip_spec.strip(), spec.checkpoint_uri)
        lines.append(f'"$SPOTOPT_VENV/bin/python" -m pip install --quiet {q(requirement)}')
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
