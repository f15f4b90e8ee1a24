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

The syncing itself is ``tests.fake_machines.LocalMachines``, shared with the GCP and Azure fakes.

moto runs in this process, so the harness reads and changes its EC2 backend directly; there is
no API to make an instance end "by itself". Every process is owned by the harness and stopped in
``close()``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fake_machines import LocalMachines

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


class LocalEc2(LocalMachines):
    """Runs the user data of moto's instances as local processes (see the module docstring)."""

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

    def vms(self) -> Iterator[tuple[str, bool, str]]:
        for inst in self._instances():
            if inst.user_data is not None:
                yield inst.id, inst._state.name in ("pending", "running"), inst.user_data.decode()

    def powered_off(self, vm: str) -> None:
        """``InstanceInitiatedShutdownBehavior=terminate``: the guest's power-off terminates it."""
        self._terminate(vm, "Client.InstanceInitiatedShutdown", "Instance initiated shutdown")

    def reclaim(self, vm: str) -> None:
        self._terminate(vm, "Server.SpotInstanceTermination", "Spot instance termination")

    def _terminate(self, ec2_id: str, code: str, message: str) -> None:
        from moto.ec2.models.instances import StateReason

        inst = next(i for i in self._instances() if i.id == ec2_id)
        inst.ec2_backend.terminate_instances([ec2_id])
        inst.state_reason = StateReason(f"{code}: {message}", code)

    def wait_started(self, ec2_id: str, timeout_s: float = 30.0) -> subprocess.Popen[bytes]:
        deadline = time.monotonic() + timeout_s
        while ec2_id not in self.procs:
            assert time.monotonic() < deadline, f"{ec2_id} never started"
            self.sync()
            time.sleep(0.02)
        return self.procs[ec2_id]
