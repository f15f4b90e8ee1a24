"""Machines behind a cloud's ``responses`` fake: each VM the fake holds runs as a local process.

The GCP and Azure fakes (``tests.gcp_fake``, ``tests.azure_fake``) only keep records. A
``LocalMachines`` makes those records behave like machines, the way ``tests.fake_ec2.LocalEc2``
does for moto: the fake calls ``around`` for every request the provider sends, which syncs the
records and the processes before and after the fake answers:

- a VM that is up and has no process yet → ``bash`` runs the start-up script the provider
  rendered (``boot``, in its own process group, ``SPOTOPT_*`` of this test process left out:
  an instance knows only what its script exports);
- its process ended while the VM is up (the job ended; a real guest then powers off) →
  ``powered_off`` marks the VM stopped, in the cloud's own words;
- the VM is down or gone (deleted through the API, or reclaimed) → its process group gets
  SIGTERM (the OS shutdown), then SIGKILL after ``grace_s``.

A preemption is ``interrupt``: the notice (the fake metadata service), the agent's emergency
checkpoint and the end of its processes, then the cloud reclaims the VM (``reclaim``); syncs
wait meanwhile, so the script's end is not taken for a power-off of its own. Every process is
owned by the harness and stopped in ``close()``.
"""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import responses

from spotopt.clouds.common.base import Provider
from spotopt.clouds.common.router import CloudsProvider, split_id
from spotopt.db.engine import Database
from tests.fake_metadata import FakeMetadata
from tests.mover_world import V100_MARKETS, Markets, World, make_world

T = TypeVar("T")


class LocalMachines(abc.ABC):
    """Runs the start-up scripts of a fake's VMs; subclasses say how that cloud's records read."""

    def __init__(self, home: Path, grace_s: float = 5.0) -> None:
        self.home = home
        self.grace_s = grace_s
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.RLock()
        """Syncs (inside the provider's calls, from any thread) and interruptions take turns."""
        home.mkdir(parents=True, exist_ok=True)

    # -- what each cloud's records say -----------------------------------------------------------

    @abc.abstractmethod
    def vms(self) -> Iterator[tuple[str, bool, str]]:
        """(VM id, whether it is up, its start-up script) for every VM the fake holds."""

    @abc.abstractmethod
    def powered_off(self, vm: str) -> None:
        """The guest shut the VM down after its script ended: record it as the cloud would."""

    @abc.abstractmethod
    def reclaim(self, vm: str) -> None:
        """The market takes the VM back (its preemption record, the VM deleted)."""

    # -- the harness ---------------------------------------------------------------------------

    def around(self, answer: Callable[[], T]) -> T:
        """The fake's answer to one request, with machines and records synced on either side."""
        with self._lock:
            self._sync()
            reply = answer()
            self._sync()
            return reply

    def sync(self) -> None:
        with self._lock:
            self._sync()

    def _sync(self) -> None:
        seen = set()
        for vm, up, script in list(self.vms()):
            seen.add(vm)
            proc = self.procs.get(vm)
            if up and proc is None:
                self._start(vm, script)
            elif up and proc is not None and proc.poll() is not None:
                self.powered_off(vm)
            elif not up and proc is not None:
                stop_group(proc, self.grace_s)
        for vm, proc in self.procs.items():
            if vm not in seen:  # deleted: the VM and its processes are gone
                stop_group(proc, self.grace_s)

    def _start(self, vm: str, script: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
        self.procs[vm] = boot(script, self.home / f"{vm}.sh", self.home / f"{vm}.log", env, self.home)

    def preempt(self, vm: str) -> None:
        """The market takes the VM back at once, its processes killed."""
        with self._lock:
            if vm in self.procs:
                stop_group(self.procs[vm], 0)
            self.reclaim(vm)

    def interrupt(self, vm: str, notify: Callable[[], None], timeout_s: float = 120.0) -> None:
        """A preemption: ``notify`` serves the notice, the agent checkpoints and its processes
        end, then the cloud reclaims the VM."""
        with self._lock:
            notify()
            proc = self.procs[vm]
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None:
                assert time.monotonic() < deadline, self.log(vm)
                time.sleep(0.05)
            stop_group(proc, 0)
            self.reclaim(vm)

    def log(self, vm: str) -> str:
        path = self.home / f"{vm}.log"
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def close(self) -> None:
        for proc in self.procs.values():
            stop_group(proc, 0)


@contextmanager
def machine_world(
    db: Database,
    tmp: Path,
    markets: Markets,
    provider: Provider,
    fake: Any,
    machines: LocalMachines,
    metadata: FakeMetadata,
    vm_of: Callable[[str], str] = lambda own_id: own_id,
) -> Iterator[World]:
    """The daemon's world on ``markets``' cloud: ``provider`` (that cloud's real provider, its
    HTTP answered by ``fake`` while the world lives) behind the ``clouds`` router, as
    ``spotopt daemon run --provider clouds`` runs it. ``vm_of`` maps the provider's instance
    id to the machine's VM id. The world's ``preempt`` is the cloud's notice through
    ``metadata``, then the reclaim."""
    cloud = markets.cloud
    router = CloudsProvider(regions={cloud: [V100_MARKETS[cloud][0]]}, build=lambda c, s, r: provider)
    # These VMs are processes on this machine, not the market's V100s: their steps/s are no
    # throughput of that GPU (see tests.test_daemon_aws).
    router.runs_on_market = False

    def preempt(instance_id: str) -> None:
        parts = split_id(instance_id)
        assert parts is not None and parts[0] == cloud, instance_id
        machines.interrupt(vm_of(parts[1]), lambda: metadata.notify(cloud))
        metadata.clear()  # the next VM has no notice pending

    env = {f"SPOTOPT_{cloud.upper()}_METADATA_URL": metadata.url}
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        fake.install(rsps)
        made = make_world(db, tmp, provider=router, preempt=preempt, agent_env=env, markets=markets)
        try:
            yield made
            assert machines.procs, "the scenario booted VMs"
            assert all(i.instance_id.startswith(f"{cloud}:") for i in router.list_instances())
        finally:
            made.stop_all()
            machines.close()


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
