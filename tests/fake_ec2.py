"""EC2 for tests: moto's server over real HTTP, each "instance" backed by a local process.

``moto_ec2`` is the session's ThreadedMotoServer on 127.0.0.1 (``tests.stores``; the provider
reaches it through ``aws_endpoint_url``, as a daemon would reach AWS). moto only keeps records:
``LocalEc2`` makes them behave like machines. Hooked on a boto3 session's events (so it runs
inside the calls the provider makes), it starts ``bash`` on the user data of every instance moto launched, and
reads the processes back the way EC2 reports its instances:

- the script ended (the job ended; a real instance's start-up script then powers off with
  ``InstanceInitiatedShutdownBehavior=terminate``) → the moto instance becomes ``terminated``
  with ``StateReason`` ``Client.InstanceInitiatedShutdown``;
- the instance was terminated through the API → its process group gets SIGTERM (what the OS
  shutdown sends), then SIGKILL after ``grace_s``;
- ``preempt(ec2_id)`` → ``terminated`` with ``Server.SpotInstanceTermination``, process killed.

moto runs in this process, so the harness reads and changes its EC2 backend directly; there is
no API to make an instance end "by itself". Every process is owned by the harness and stopped in
``close()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

ACCOUNT = "123456789012"
"""moto's default account, used for any access key it does not know."""
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def moto_ec2(moto_s3: str) -> str:
    """Endpoint URL of moto's server: the session's server of ``tests.stores`` serves every
    service, EC2 and IAM included (its backends live in this process)."""
    return moto_s3


def reset_ec2() -> None:
    """Forget every EC2 record (only EC2: S3 buckets of the same in-process moto stay)."""
    from moto.ec2.models import ec2_backends

    ec2_backends[ACCOUNT].reset()


class LocalEc2:
    """Runs the user data of moto's instances as local processes (see the module docstring)."""

    def __init__(self, home: Path, grace_s: float = 10.0) -> None:
        self.home = home
        self.grace_s = grace_s
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        home.mkdir(parents=True, exist_ok=True)

    def attach(self, session: Any) -> None:
        """Sync before every EC2 read and after every launch or termination made through ``session``."""
        session.events.register("before-call.ec2.DescribeInstances", self._hook)
        session.events.register("after-call.ec2.RunInstances", self._hook)
        session.events.register("after-call.ec2.TerminateInstances", self._hook)

    def _hook(self, **_: Any) -> None:
        self.sync()

    @staticmethod
    def _instances() -> list[Any]:
        from moto.ec2.models import ec2_backends

        backends = ec2_backends[ACCOUNT]
        return [i for region in list(backends.keys()) for i in backends[region].all_instances()]

    def sync(self) -> None:
        from moto.ec2.models.instances import StateReason

        for inst in self._instances():
            live = inst._state.name in ("pending", "running")
            proc = self.procs.get(inst.id)
            if live and proc is None and inst.user_data is not None:
                self._start(inst.id, inst.user_data.decode())
            elif live and proc is not None and proc.poll() is not None:
                inst.ec2_backend.terminate_instances([inst.id])
                inst.state_reason = StateReason(
                    "Client.InstanceInitiatedShutdown: Instance initiated shutdown",
                    "Client.InstanceInitiatedShutdown",
                )
            elif not live and proc is not None and proc.poll() is None:
                stop_group(proc, self.grace_s)

    def preempt(self, ec2_id: str) -> None:
        """The spot market takes the instance back: terminated by the cloud, its process killed."""
        from moto.ec2.models.instances import StateReason

        inst = next(i for i in self._instances() if i.id == ec2_id)
        inst.ec2_backend.terminate_instances([ec2_id])
        inst.state_reason = StateReason(
            "Server.SpotInstanceTermination: Spot instance termination", "Server.SpotInstanceTermination"
        )
        if ec2_id in self.procs:
            stop_group(self.procs[ec2_id], 0)

    def log(self, ec2_id: str) -> str:
        path = self.home / f"{ec2_id}.log"
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def _start(self, ec2_id: str, script: str) -> None:
        self.procs[ec2_id] = boot(script, self.home / f"{ec2_id}.sh", self.home / f"{ec2_id}.log")

    def wait_started(self, ec2_id: str, timeout_s: float = 30.0) -> subprocess.Popen[bytes]:
        deadline = time.monotonic() + timeout_s
        while ec2_id not in self.procs:
            assert time.monotonic() < deadline, f"{ec2_id} never started"
            self.sync()
            time.sleep(0.02)
        return self.procs[ec2_id]

    def close(self) -> None:
        for proc in self.procs.values():
            stop_group(proc, 0)


def boot(
    script: str, path: Path, log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Write ``script`` to ``path`` and run it with bash in a new session (its own process group,
    as an instance's processes are its own), output appended to ``log``."""
    path.write_text(script, encoding="utf-8")
    with log.open("ab") as out:
        return subprocess.Popen(
            ["bash", str(path)],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL it after ``grace_s``; return once the
    whole group is gone (the job outlives bash, which dies first, while it checkpoints)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
        if _group_gone(proc):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait_s
        while not _group_gone(proc) and time.monotonic() < deadline:
            time.sleep(0.02)


def _group_gone(proc: subprocess.Popen[bytes]) -> bool:
    """No process of the group ``proc`` leads is left (its leader reaped first, so the group id
    cannot have been reused while we look)."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return True
    return False
