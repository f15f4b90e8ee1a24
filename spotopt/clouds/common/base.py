"""The provider interface: launch, status, terminate, list — what the daemon needs from a cloud.

Contract (every provider; ``tests/provider_contract.py`` checks it and each provider runs it):

- ``launch(spec, market, idempotency_key)`` starts one placement of a job. The same key twice
  returns the same instance and starts nothing new (AWS maps the key to ``ClientToken``, GCP to
  ``request_id``, Azure to the VM name, ``local`` to its state file). Capacity shortfalls raise
  ``CapacityUnavailableError``, other failures ``ProviderError``.
- ``status(instance_id)`` never raises for an id the provider does not know: it is ``GONE``.
  Its ``billing`` says what of the instance still costs money: a live instance bills at its
  market's price, and an ended one may still hold resources the cloud bills (a VM the guest
  powered off, its disk, a NIC): see ``Billing``.
- ``terminate(instance_id)`` is idempotent: terminating a gone or already terminated instance
  succeeds and returns its status. It deletes everything of the instance that still bills,
  whatever state it is in (an ended placement's VM too).
- ``list_instances(job=None, tags=None)`` lists instances this provider launched (for
  reconciliation with the daemon's journal after a restart), filtered by job and by tags, in
  every state in which they may still bill. ``Instance.tags`` are the launch spec's tags,
  exactly (``DATABASE_TAG`` among them for the daemon's placements).

Checkpoints are not the provider's business: the provider only passes the agent its
environment (``agent_environment``); the daemon and the agent talk through the store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_DOWN, Decimal
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from spotopt.types import MarketKey

DATABASE_TAG = "spotopt:db"
"""The tag holding the id of the database whose daemon launched an instance
(``spotopt.db.identity``): the leak sweep ends only its own database's instances."""


class Billing(StrEnum):
    """What of an instance still costs money."""

    NONE = "none"
    """Nothing: it is deleted, or ended in a state the cloud does not bill."""
    COMPUTE = "compute"
    """The instance itself, at its market's hourly price: live, or still allocated (an Azure VM
    the guest powered off is billed until deallocated or deleted)."""
    STORAGE = "storage"
    """Only what it left: the disk of a stopped VM, a NIC (and its subnet IP)."""


class InstanceState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    EXITED = "exited"
    """The job's process ended by itself (``exit_code`` says how, when the provider can see it)."""
    TERMINATED = "terminated"
    """Ended because we asked (``terminate``)."""
    PREEMPTED = "preempted"
    """Taken back by the market (a spot interruption; ``preempt`` for the local provider)."""
    GONE = "gone"
    """The provider has no record of this id."""

    @property
    def is_live(self) -> bool:
        return self in (InstanceState.PENDING, InstanceState.RUNNING)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """One placement of a job: what to run and the agent settings it runs with."""

    job: str
    epoch: int
    """The lease epoch the daemon granted this placement (``spotopt.checkpoints.grant_lease``)."""
    command: tuple[str, ...]
    checkpoint_uri: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    checkpoint_every_s: float | None = None
    """Fixed checkpoint period; None lets the agent use Young/Daly with ``preemptions_per_hour``."""
    preemptions_per_hour: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for the job; wins over the agent variables (tests point pollers here)."""
    workdir: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    max_usd_per_instance_hour: float | None = None
    """The most one instance may cost per hour (the job's ``max_usd_per_hour`` over its
    placement's instances per slot); None: no cap. A provider whose spot market takes a price
    cap passes it there, so the cloud stops the instance before the bill passes it (AWS
    ``MaxPrice``, Azure ``billingProfile.maxPrice``); one that cannot ignores it and says so."""


@dataclass(frozen=True, slots=True)
class Instance:
    """What the provider launched; ``instance_id`` is the provider's own id (``i-…``, ``local-…``)."""

    instance_id: str
    provider: str
    job: str
    epoch: int
    market: str
    """``market_label(market)``: cloud/region/zone/instance type/kind."""
    idempotency_key: str
    launched_at: datetime
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    instance: Instance | None
    """None when the state is ``GONE``, unless part of it still bills (``leftover``: a NIC
    whose VM is gone), which ``terminate`` then deletes."""
    instance_id: str
    state: InstanceState
    exit_code: int | None = None
    detail: str = ""
    leftover: Billing = Billing.NONE
    """What still bills while the instance is not live (a provider sets it for an ended instance
    whose VM, disk or NIC the cloud keeps); ignored while it is live."""

    @property
    def billing(self) -> Billing:
        """What of the instance costs money now: ``COMPUTE`` while it is live, else ``leftover``."""
        return Billing.COMPUTE if self.state.is_live else self.leftover


@runtime_checkable
class Provider(Protocol):
    name: str
    runs_on_market: bool
    """True when an instance really is the market's machine (its GPU): only then are the job's
    measured steps/s a throughput of that GPU worth storing (``local`` runs on this machine)."""

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance: ...

    def status(self, instance_id: str) -> InstanceStatus: ...

    def terminate(self, instance_id: str) -> InstanceStatus: ...

    def list_instances(
        self, job: str | None = None, tags: Mapping[str, str] | None = None
    ) -> list[Instance]: ...


def market_label(market: MarketKey) -> str:
    return "/".join([market.cloud, market.region, market.zone or "-", market.instance_type, str(market.kind)])


def agent_environment(spec: LaunchSpec, market: MarketKey) -> dict[str, str]:
    """The ``SPOTOPT_*`` variables a provider sets for the job's agent (``spec.env`` wins)."""
    env = {
        "SPOTOPT_JOB": spec.job,
        "SPOTOPT_EPOCH": str(spec.epoch),
        "SPOTOPT_CHECKPOINT_URI": spec.checkpoint_uri,
        "SPOTOPT_CLOUD": market.cloud,
    }
    if spec.storage_options:
        env["SPOTOPT_STORAGE_OPTIONS"] = json.dumps(dict(spec.storage_options))
    if spec.checkpoint_every_s is not None:
        env["SPOTOPT_CHECKPOINT_EVERY"] = f"{spec.checkpoint_every_s:.6f}s"
    if spec.preemptions_per_hour is not None:
        env["SPOTOPT_PREEMPTIONS_PER_HOUR"] = repr(spec.preemptions_per_hour)
    return {**env, **spec.env}


PRICE_CAP_STEP = Decimal("0.00001")
"""A cap's precision: five decimals, as in Azure's documented ``maxPrice`` example (``0.01538``,
azure-mgmt-compute ``BillingProfile``; Azure's Spot VM guide is recalled, not re-checked, to
allow no more); EC2's ``MaxPrice`` string takes as many. Rounding down loses < $0.00001/h."""


def price_cap(spec: LaunchSpec) -> Decimal | None:
    """``spec.max_usd_per_instance_hour`` as the cloud gets it: rounded down to ``PRICE_CAP_STEP``,
    so the cap the cloud enforces is never above the job's; None without a cap."""
    if spec.max_usd_per_instance_hour is None:
        return None
    return Decimal(repr(spec.max_usd_per_instance_hour)).quantize(PRICE_CAP_STEP, rounding=ROUND_DOWN)


def matches(instance: Instance, job: str | None, tags: Mapping[str, str] | None) -> bool:
    """The ``list_instances`` filter every provider applies."""
    if job is not None and instance.job != job:
        return False
    return all(instance.tags.get(k) == v for k, v in (tags or {}).items())


def sorted_instances(instances: Sequence[Instance]) -> list[Instance]:
    return sorted(instances, key=lambda i: (i.launched_at, i.instance_id))
