"""The agent's configuration: environment variables only, so a script runs unchanged anywhere.

A provider sets these for the job (``spotopt.clouds.common.base.agent_environment``). With none set
the agent is *standalone*: checkpoints go to ``./spotopt-checkpoints`` under the current
directory, SIGTERM still saves and stops, and nothing else runs (no heartbeats, no control
polling, no cloud notice poller, no lease).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotopt.errors import ConfigError, InputError
from spotopt.times import parse_duration

DEFAULT_STORE_DIR = "spotopt-checkpoints"
DEFAULT_CHECKPOINT_S = 10.0
"""Assumed checkpoint write time before the first one was measured (Young/Daly's ``C``)."""
DEFAULT_PREEMPTIONS_PER_HOUR = 1 / 24
"""Without a market rate, assume GCP's documented "at least once per 24 h" (spotopt.history.market)."""
CLOUD_CHOICES = ("aws", "gcp", "azure", "local", "none")

ENV_VARS: dict[str, str] = {
    "SPOTOPT_JOB": "job name: the store directory and every record (default: the script's file name)",
    "SPOTOPT_EPOCH": "this placement's epoch; the store's lease fences older ones (default 0, unfenced)",
    "SPOTOPT_DATABASE_ID": "the id of the database whose daemon launched the job: a lease another "
    "database granted fences it too (default: unknown, the epoch alone)",
    "SPOTOPT_CHECKPOINT_URI": "the store: file://DIR, s3://BUCKET/PREFIX, gs://…, az://… "
    "(default ./spotopt-checkpoints)",
    "SPOTOPT_STORAGE_OPTIONS": 'JSON keyword arguments for the fsspec back-end, e.g. {"endpoint_url": "http://…"}',
    "SPOTOPT_CHECKPOINT_EVERY": "fixed checkpoint period such as 30s or 10m (default: Young/Daly)",
    "SPOTOPT_PREEMPTIONS_PER_HOUR": "the market's preemption rate for Young/Daly (default 1/24)",
    "SPOTOPT_CHECKPOINT_S": "expected seconds to write a checkpoint until one was measured (default 10)",
    "SPOTOPT_KEEP_CHECKPOINTS": "verified checkpoints to keep (default 3)",
    "SPOTOPT_CLOUD": "aws, gcp, azure, local or none: the preemption-notice poller (default: detected)",
    "SPOTOPT_POLL_EVERY": "how often notices, control requests and the lease are polled (default 5s)",
    "SPOTOPT_HEARTBEAT_EVERY": "how often a heartbeat is written (default 30s)",
    "SPOTOPT_AWS_METADATA_URL": "AWS instance metadata base URL (default http://169.254.169.254)",
    "SPOTOPT_GCP_METADATA_URL": "GCP metadata server base URL (default http://metadata.google.internal)",
    "SPOTOPT_AZURE_METADATA_URL": "Azure instance metadata base URL (default http://169.254.169.254)",
    "SPOTOPT_NOTICE_FILE": "local provider: the file whose appearance is a preemption notice",
    "SPOTOPT_SCRATCH_DIR": "local directory for checkpoint staging and restores (default: a temp dir)",
    "SPOTOPT_CLOCK_FILE": "replay: the simulated clock file the agent reads its time from (default: real)",
}

JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""A job name is a directory name in every store: no slashes, no leading dot."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    job: str
    epoch: int
    checkpoint_uri: str
    managed: bool
    """True when a provider launched the job (``SPOTOPT_JOB`` set): heartbeats, control, lease, notices."""
    storage_options: dict[str, Any] = field(default_factory=dict)
    checkpoint_every_s: float | None = None
    preemptions_per_hour: float = DEFAULT_PREEMPTIONS_PER_HOUR
    checkpoint_s: float = DEFAULT_CHECKPOINT_S
    keep: int = 3
    cloud: str | None = None
    """``aws``/``gcp``/``azure``/``local``, ``none`` to poll nothing, None to detect the cloud."""
    poll_s: float = 5.0
    heartbeat_s: float = 30.0
    metadata_urls: dict[str, str] = field(default_factory=dict)
    notice_file: str | None = None
    scratch_dir: str | None = None
    clock_file: str | None = None
    """``spotopt.simclock``'s file: time is simulated (a replayed market), not the real clock."""
    database: str | None = None
    """``SPOTOPT_DATABASE_ID``: the launching daemon's database (``spotopt.db.identity``)."""

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> AgentConfig:
        """Read ``SPOTOPT_*``; a bad value is a ``ConfigError`` naming the variable and the fix."""
        job = env.get("SPOTOPT_JOB") or _script_job_name()
        if not JOB_NAME.match(job):
            raise ConfigError(
                f"SPOTOPT_JOB: {job!r} is not a job name; use letters, digits, '.', '_' and '-' (≤ 128)"
            )
        cloud = env.get("SPOTOPT_CLOUD") or None
        if cloud is not None and cloud not in CLOUD_CHOICES:
            raise ConfigError(f"SPOTOPT_CLOUD: {cloud!r} is not one of {', '.join(CLOUD_CHOICES)}")
        every = env.get("SPOTOPT_CHECKPOINT_EVERY")
        return cls(
            job=job,
            epoch=int(_number(env, "SPOTOPT_EPOCH", 0, integer=True)),
            checkpoint_uri=env.get("SPOTOPT_CHECKPOINT_URI") or str(Path.cwd() / DEFAULT_STORE_DIR),
            managed="SPOTOPT_JOB" in env,
            storage_options=_json_object(env, "SPOTOPT_STORAGE_OPTIONS"),
            checkpoint_every_s=_duration(every, "SPOTOPT_CHECKPOINT_EVERY") if every else None,
            preemptions_per_hour=_number(env, "SPOTOPT_PREEMPTIONS_PER_HOUR", DEFAULT_PREEMPTIONS_PER_HOUR),
            checkpoint_s=_number(env, "SPOTOPT_CHECKPOINT_S", DEFAULT_CHECKPOINT_S),
            keep=max(1, int(_number(env, "SPOTOPT_KEEP_CHECKPOINTS", 3, integer=True))),
            cloud=cloud,
            poll_s=_duration(env.get("SPOTOPT_POLL_EVERY", "5s"), "SPOTOPT_POLL_EVERY"),
            heartbeat_s=_duration(env.get("SPOTOPT_HEARTBEAT_EVERY", "30s"), "SPOTOPT_HEARTBEAT_EVERY"),
            metadata_urls={
                c: env[f"SPOTOPT_{c.upper()}_METADATA_URL"]
                for c in ("aws", "gcp", "azure")
                if env.get(f"SPOTOPT_{c.upper()}_METADATA_URL")
            },
            notice_file=env.get("SPOTOPT_NOTICE_FILE") or None,
            scratch_dir=env.get("SPOTOPT_SCRATCH_DIR") or None,
            clock_file=env.get("SPOTOPT_CLOCK_FILE") or None,
            database=env.get("SPOTOPT_DATABASE_ID") or None,
        )


def _script_job_name() -> str:
    stem = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip("-._")
    return name or "job"


def _duration(text: str, name: str) -> float:
    try:
        return parse_duration(text, name).total_seconds()
    except InputError as exc:
        raise ConfigError(str(exc)) from exc


def _number(env: Mapping[str, str], name: str, default: float, integer: bool = False) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{name}: {raw!r} is not {kind}") from None
    if value < 0 or not math.isfinite(value):
        raise ConfigError(f"{name}: {raw!r} must be a finite number >= 0")
    return value


def _json_object(env: Mapping[str, str], name: str) -> dict[str, Any]:
    raw = env.get(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(
            f'{name}: not JSON ({exc}); write an object such as {{"endpoint_url": "…"}}'
        ) from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: must be a JSON object, got {type(value).__name__}")
    return value
