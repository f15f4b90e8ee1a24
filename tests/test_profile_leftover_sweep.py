"""Issue 36: a ``spotopt throughput profile`` killed with SIGKILL (no ``finally`` runs) leaves its
instance running; the leak sweep (``spotopt daemon sweep``) ends it once it is older than the
longest a profile runs (``profile.LEFTOVER_AFTER_S``), never while its command may still be
measuring it, never in a dry run, and never from another database. Run as users run it: the
console scripts, the local provider."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from spotopt.clouds.common.base import InstanceState
from spotopt.clouds.local.provider import LocalProvider, group_members
from spotopt.mover.profile import LEFTOVER_AFTER_S, PROFILE_TAG
from tests.helpers import strict_json

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples"
SPOTOPT = Path(sys.executable).with_name("spotopt")
STARTUP_S = 120.0


def _env(db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    return env | {"SPOTOPT_DB_URL": f"sqlite:///{db}"}


def _spotopt(tmp_path: Path, db: Path, *args: str) -> str:
    done = subprocess.run(
        [str(SPOTOPT), *args], cwd=tmp_path, env=_env(db), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _records(state: Path) -> list[Path]:
    return sorted(state.glob("instances/*/record.json"))


def test_the_sweep_ends_a_killed_profiles_instance_once_it_outlived_any_profile(tmp_path: Path) -> None:
    (tmp_path / "train_numpy.py").write_text((EXAMPLES / "train_numpy.py").read_text())
    spec = yaml.safe_load((EXAMPLES / "job.yaml").read_text())
    spec["jobs"][0]["run"] = f"{sys.executable} train_numpy.py --steps 100000000 --step-delay 0.01"
    del spec["jobs"][0]["throughput"]["L4"]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    db, state = tmp_path / "h.sqlite", tmp_path / "state"
    _spotopt(tmp_path, db, "import", "csv", str(EXAMPLES / "prices.csv"))

    command = subprocess.Popen(
        [str(SPOTOPT), "throughput", "profile", "job.yaml", "--gpu", "L4", "--steps", "100000000",
         "--state-dir", str(state)],
        cwd=tmp_path, env=_env(db), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    provider = LocalProvider(state)
    try:
        deadline = time.monotonic() + STARTUP_S
        while not (
            (found := provider.list_instances())
            and provider.status(found[0].instance_id).state is InstanceState.RUNNING
        ):
            assert command.poll() is None and time.monotonic() < deadline, "the profile never launched"
            time.sleep(0.2)
    finally:
        command.send_signal(signal.SIGKILL)  # no finally of the command's runs
        command.wait(60)
    (instance,) = provider.list_instances()
    assert instance.tags[PROFILE_TAG] == "example"
    pid = int(json.loads(_records(state)[0].read_text())["pid"])

    def sweep(*more: str, on: Path = db) -> list[dict[str, object]]:
        out = _spotopt(tmp_path, on, "daemon", "sweep", "--provider", "local", "--state-dir", str(state),
                       "--format", "json", *more)  # fmt: skip
        return list(strict_json(out)["leftovers"])

    try:
        # Young: its command may still be measuring it (the sweep cannot tell a killed one).
        assert sweep() == []
        assert provider.status(instance.instance_id).state is InstanceState.RUNNING

        # Older than any profile runs: the record says it launched that long ago.
        (path,) = _records(state)
        record = json.loads(path.read_text())
        launched = datetime.now(UTC) - timedelta(seconds=LEFTOVER_AFTER_S + 60)
        path.write_text(json.dumps(record | {"launched_at": launched.isoformat()}))

        _spotopt(tmp_path, tmp_path / "other.sqlite", "import", "csv", str(EXAMPLES / "prices.csv"))
        assert sweep(on=tmp_path / "other.sqlite") == []  # another database's sweep: not its instance
        (listed,) = sweep("--dry-run")
        assert (listed["instance"], listed["job"], listed["action"]) == (
            instance.instance_id,
            instance.job,
            "none",
        )
        assert str(listed["why"]).startswith("a profile run of 'example' launched ")
        assert provider.status(instance.instance_id).state is InstanceState.RUNNING  # a dry run ends nothing

        (ended,) = sweep()
        assert (ended["instance"], ended["action"]) == (instance.instance_id, "terminated")
        assert provider.status(instance.instance_id).state is InstanceState.TERMINATED
        assert group_members(pid) == []  # the trainer and its children are gone
        assert sweep() == []
    finally:
        provider.terminate(instance.instance_id, grace_s=0)
