"""Compute Engine for the daemon's tests: the ``responses`` fake of ``tests.gcp_fake``, each
VM backed by a local process running its ``startup-script`` metadata (``tests.fake_machines``).

``LocalGce`` is the fake whose every request syncs the machines. The records follow the
processes as Compute Engine reports its VMs: a VM is booted once its insert operation is
``DONE`` (``RUNNING``); a script that ended is a guest that shut down (``TERMINATED``, no
operation: the provider reads that as the job's exit); a delete (``STOPPING``, then gone)
stops the process; ``GceMachines.reclaim`` is a Spot preemption with
``instance_termination_action=DELETE`` (a ``compute.instances.preempted`` operation, the VM gone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fake_machines import LocalMachines
from tests.gcp_fake import GcpComputeFake, Reply


class GceMachines(LocalMachines):
    """The VMs of ``fake`` as local processes; a VM's id is its name (unique in the project)."""

    def __init__(self, fake: GcpComputeFake, home: Path, grace_s: float = 5.0) -> None:
        super().__init__(home, grace_s)
        self.fake = fake

    def _zone(self, vm: str) -> str:
        return next(zone for zone, name in self.fake.instances if name == vm)

    def vms(self) -> Iterator[tuple[str, bool, str]]:
        for (_, name), record in self.fake.instances.items():
            meta = {i["key"]: i["value"] for i in record["metadata"]["items"]}
            yield name, record["status"] == "RUNNING", meta["startup-script"]

    def powered_off(self, vm: str) -> None:
        self.fake.power_off(self._zone(vm), vm)

    def reclaim(self, vm: str) -> None:
        self.fake.preempt(self._zone(vm), vm)


@dataclass
class LocalGce(GcpComputeFake):
    """``GcpComputeFake`` whose requests sync ``machines`` (set it before the first request)."""

    machines: GceMachines | None = field(default=None)

    def _route(self, url: Any, handler: Callable[..., Reply]) -> Callable[[Any], Reply]:
        inner = super()._route(url, handler)

        def reply(request: Any) -> Reply:
            assert self.machines is not None, "LocalGce.machines is set before the provider runs"
            return self.machines.around(lambda: inner(request))

        return reply
