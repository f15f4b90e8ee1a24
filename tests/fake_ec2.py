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

moto answers as if EC2 were strongly consistent and ignores ``ClientToken``; ``DocumentedEc2``
adds, on the same session events, what the EC2 documentation says the real API does.
"""

from __future__ import annotations

import copy
import random
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
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


SERVER_ERRORS = frozenset(
    {"InsufficientInstanceCapacity", "InsufficientHostCapacity", "InternalError", "Unavailable"}
)
"""EC2 error codes the API reference lists among its *server* errors: sent with HTTP 500."""


def ec2_error(operation: str, code: str, message: str = "") -> Any:
    """The ``ClientError`` botocore raises for EC2's ``code``, with the HTTP status EC2 sends it
    with (500 for ``SERVER_ERRORS``, else 400)."""
    from botocore.exceptions import ClientError

    status = 500 if code in SERVER_ERRORS else 400
    body = {
        "Error": {"Code": code, "Message": message or f"documented {code}"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(body, operation)  # type: ignore[arg-type]


def _wire_ids(params: dict[str, Any]) -> list[str]:
    """The ``InstanceId.N`` values of an EC2 query-API request body."""
    return [v for k, v in params.get("body", {}).items() if k.startswith("InstanceId.")]


@dataclass
class DocumentedEc2:
    """EC2 as its documentation describes it, over moto (attach to the provider's boto3 session):

    - *Eventual consistency* (EC2 Developer Guide, "Eventual consistency in the Amazon EC2 API"):
      an instance ``RunInstances`` just started is, with probability ``unseen_p``, not yet
      visible: the first ``DescribeInstances`` naming its id answers
      ``InvalidInstanceID.NotFound`` ("this doesn't mean the instance doesn't exist"), a
      filtered one leaves it out, and so does a ``TerminateInstances`` of it (a NotFound that
      "doesn't mean the instance was or will be terminated": the instance stays up).
    - *Idempotency* ("Ensuring idempotency in Amazon EC2 API requests"): a ``RunInstances``
      repeating a ``ClientToken`` returns the first call's result and launches nothing.
    - *Server errors* (EC2 API Reference, "Error codes"): ``fail_next`` codes answer the next
      ``RunInstances`` calls, ``InsufficientInstanceCapacity`` with HTTP 500 like the other
      server errors; ``lose_next`` launches and then answers 500 ``InternalError`` (the launch
      happened, its answer was lost), which the same token must recover.

    ``rng`` decides visibility (seeded: tests never depend on luck).
    """

    unseen_p: float = 1.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    fail_next: list[str] = field(default_factory=list)
    lose_next: int = 0
    unseen: set[str] = field(default_factory=set)
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)
    launched: int = 0
    """Instances moto really launched (token replays and refusals launch none)."""

    def attach(self, session: Any) -> None:
        events = session.events
        events.register("before-call.ec2.RunInstances", self._before_run)
        events.register("after-call.ec2.RunInstances", self._after_run)
        events.register("before-call.ec2.DescribeInstances", self._before_describe)
        events.register("after-call.ec2.DescribeInstances", self._after_describe)
        events.register("before-call.ec2.TerminateInstances", self._before_terminate)

    def _before_run(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        token = context["client_token"] = params["body"].get("ClientToken")
        if token in self.replies:  # the same result again, nothing launched
            context["replayed"] = True
            return AWSResponse("https://ec2.amazonaws.com/", 200, {}, None), copy.deepcopy(
                self.replies[token]
            )
        if self.fail_next:
            raise ec2_error("RunInstances", self.fail_next.pop(0))
        return None

    def _after_run(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        """(botocore's ``after-call`` carries no request: the token comes through ``context``;
        it also follows a replayed answer, which launched nothing.)"""
        if context.get("replayed"):
            return
        token = context.get("client_token")
        self.launched += len(parsed.get("Instances", []))
        if token:
            self.replies[token] = copy.deepcopy(parsed)
        for instance in parsed.get("Instances", []):
            if self.rng.random() < self.unseen_p:
                self.unseen.add(instance["InstanceId"])
        if self.lose_next:
            self.lose_next -= 1
            raise ec2_error("RunInstances", "InternalError", "the launch happened; its answer was lost")

    def _not_yet_seen(self, operation: str, params: dict[str, Any]) -> None:
        """NotFound for a request naming an instance not yet visible, which then becomes visible."""
        hidden = [i for i in _wire_ids(params) if i in self.unseen]
        if hidden:
            self.unseen.difference_update(hidden)
            message = f"The instance ID '{hidden[0]}' does not exist"
            raise ec2_error(operation, "InvalidInstanceID.NotFound", message)

    def _before_describe(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["by_id"] = bool(_wire_ids(params))
        self._not_yet_seen("DescribeInstances", params)

    def _after_describe(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if context.get("by_id"):
            return
        for reservation in parsed.get("Reservations", []):
            shown = reservation["Instances"]
            hidden = {i["InstanceId"] for i in shown} & self.unseen
            self.unseen -= hidden
            reservation["Instances"] = [i for i in shown if i["InstanceId"] not in hidden]
        parsed["Reservations"] = [r for r in parsed.get("Reservations", []) if r["Instances"]]

    def _before_terminate(self, params: dict[str, Any], **_: Any) -> None:
        self._not_yet_seen("TerminateInstances", params)
