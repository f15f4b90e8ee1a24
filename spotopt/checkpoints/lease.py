"""Fencing: one epoch per job holds the lease, and only its checkpoints (and those it inherited) count.

Every placement of a job gets an epoch, an integer the daemon increments per placement and hands
to the agent as ``SPOTOPT_EPOCH``. ``lease.json`` in the job's directory holds the current one.
An agent whose epoch is older than the lease is *superseded*: it must stop and write nothing.

Checking the lease before writing is not enough on its own: an old writer may check, stall (a
network partition), and write its manifest after the lease moved on. So the lease also decides
what may be resumed from. When the daemon grants epoch E+1 it records in ``inherited`` the
verified checkpoints that were trusted under epoch E at that moment; from then on a checkpoint
is *trusted* only if its epoch is the lease's or it is listed in ``inherited``. A manifest an old
epoch writes after the grant is in neither, so no one ever resumes from it, and GC deletes it.

Without a lease file (a script run outside spotopt, or before the daemon's first grant) every
verified checkpoint is trusted and nothing is fenced.

The daemon is the only writer of ``lease.json`` (one daemon per store); agents only read it. The
grant itself (``grant_lease``) lives in ``store.py``: it records the checkpoints trusted at that moment.

A lease also names the database whose daemon granted it (``spotopt.db.identity``): epochs count
per database, so a second database's job under the same name and store (the same job file
submitted to two histories) would be granted the same epoch 1 and train beside the first.
A grant from another database is refused (``LeaseHeldError``) until a person frees the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from spotopt.checkpoints.location import Location
from spotopt.errors import ConfigError, SupersededError

LEASE_FILE = "lease.json"


class LeaseHeldError(ConfigError):
    """The job's lease in this store is another database's: its daemon runs the job there."""


@dataclass(frozen=True, slots=True)
class Lease:
    job: str
    epoch: int
    granted_at: datetime
    inherited: frozenset[str]
    """Names of checkpoints of older epochs that this epoch may resume from."""
    database: str | None = None
    """The id of the database whose daemon granted it (None: granted without one, by
    ``spotopt agent run`` or before leases named their database)."""

    def trusts(self, name: str, epoch: int) -> bool:
        return epoch == self.epoch or name in self.inherited


def read_lease(loc: Location, job: str) -> Lease | None:
    """The job's current lease, or None when no epoch was ever granted."""
    data = loc.read_json(loc.path(job, LEASE_FILE))
    if data is None:
        return None
    return Lease(
        job=job,
        epoch=int(data["epoch"]),
        granted_at=datetime.fromisoformat(data["granted_at"]),
        inherited=frozenset(data.get("inherited", [])),
        database=data.get("database"),
    )


def check_epoch(loc: Location, job: str, epoch: int, database: str | None = None) -> Lease | None:
    """Raise ``SupersededError`` unless ``epoch`` may write; return the lease (None: unfenced).

    ``database``: the id of the database whose daemon launched the writer (``SPOTOPT_DATABASE_ID``;
    None: unknown). Epochs count per database, so two daemons granting within milliseconds both
    grant epoch 1 and the last write of ``lease.json`` wins: the lease's epoch alone would let
    both trainers write. The lease must also be the writer's own database's."""
    lease = read_lease(loc, job)
    if lease is not None and lease.epoch != epoch:
        newer = (
            "a newer placement" if lease.epoch > epoch else "no placement yet (the daemon never granted it)"
        )
        raise SupersededError(
            f"job {job}: epoch {epoch} is not the lease holder (lease epoch {lease.epoch}, {newer}); "
            "this copy stops without writing a checkpoint"
        )
    if lease is not None and None not in (database, lease.database) and lease.database != database:
        assert database is not None and lease.database is not None
        raise SupersededError(
            f"job {job}: the lease is held by another spotopt database (id {lease.database[:12]}, not "
            f"{database[:12]}); this copy stops without writing a checkpoint"
        )
    return lease
