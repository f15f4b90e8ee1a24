"""Azure VMs for the daemon's tests: the ``responses`` fake of ``tests.azure_fake``, each VM
backed by a local process running its ``customData`` (``tests.fake_machines``).

``LocalAzure`` is the fake whose every request syncs the machines. The records follow the
processes as ARM reports its VMs: a created VM is ``PowerState/running`` and boots its custom
data (the fake keeps it decoded, write-only as in ARM); a script that ended is a guest that
powered off (``PowerState/stopped``: the provider reads that as the job's exit); a deleted VM
stops its process; ``AzureMachines.reclaim`` is a Spot eviction with eviction policy Delete
(the VM and its disk gone, its NIC left).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.azure_fake import AzureArmFake, Reply
from tests.fake_machines import LocalMachines


class AzureMachines(LocalMachines):
    """The VMs of ``fake`` as local processes; a VM's id is its name."""

    def __init__(self, fake: AzureArmFake, home: Path, grace_s: float = 5.0) -> None:
        super().__init__(home, grace_s)
        self.fake = fake

    @staticmethod
    def _power(record: dict[str, Any]) -> list[dict[str, Any]]:
        statuses: list[dict[str, Any]] = record["properties"].get("instanceView", {}).get("statuses", [])
        return [s for s in statuses if s["code"].startswith("PowerState/")]

    def vms(self) -> Iterator[tuple[str, bool, str]]:
        for (kind, name), record in self.fake.resources.items():
            if kind == "vm":
                up = [s["code"] for s in self._power(record)] == ["PowerState/running"]
                yield name, up, self.fake.custom_data[name]

    def powered_off(self, vm: str) -> None:
        self.fake.power_off(vm)

    def reclaim(self, vm: str) -> None:
        self.fake.evict(vm)


@dataclass
class LocalAzure(AzureArmFake):
    """``AzureArmFake`` whose requests sync ``machines`` (set it before the first request)."""

    machines: AzureMachines | None = field(default=None)

    def _logged(self, handler: Callable[[Any], Reply]) -> Callable[[Any], Reply]:
        inner = super()._logged(handler)

        def reply(request: Any) -> Reply:
            assert self.machines is not None, "LocalAzure.machines is set before the provider runs"
            return self.machines.around(lambda: inner(request))

        return reply
