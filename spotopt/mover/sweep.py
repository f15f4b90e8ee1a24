"""What bills with no live placement: the leak sweep the daemon runs every round and
``spotopt daemon sweep`` runs on demand.

An instance is *ours* when it carries this database's id (``base.DATABASE_TAG``, the id of
``spotopt.db.identity``); an instance launched before that tag existed is ours when its
idempotency key is a placement of this database. It is *owned* when a live placement
(``launching``/``running``) has its key and either has no instance recorded yet (the launch is
under way, or was cut short by a crash and will be re-done with the same key) or records this
very instance. Anything of ours that is not owned and still bills (``InstanceStatus.billing``:
live, or an ended VM, disk or NIC the cloud keeps) is a *leftover*: launched just before a
crash whose move then failed, a duplicate of a launch, an ended placement's VM that the guest
powered off, an evicted VM's NIC. A profile's instance (``spotopt throughput profile``, tagged
``profile.PROFILE_TAG`` and with this database's id) has no placement: its command owns it while
it may still run, and it is a leftover once older than ``profile.LEFTOVER_AFTER_S`` (the
command was killed before it could end it).

This module only finds them (read-only); ``Executor.sweep`` ends them under the leader's lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotopt.clouds.common.base import DATABASE_TAG, Billing, Instance, Provider
from spotopt.db.engine import Database
from spotopt.db.identity import stored_database_id
from spotopt.db.models import Placement
from spotopt.db.queries import MarketFilter, prices_at
from spotopt.mover.profile import LEFTOVER_AFTER_S, PROFILE_TAG

LIVE_PLACEMENT = ("launching", "running")


@dataclass(frozen=True, slots=True)
class Leftover:
    """One instance of ours that bills with no live placement owning it."""

    cloud: str
    instance_id: str
    job: str
    key: str
    market: str
    state: str
    billing: Billing
    why: str
    usd_per_hour: float | None
    """What it costs per hour while left: the instance's price for ``COMPUTE`` (its placement's
    launch price, else the market's price in the history now); 0 for a NIC or disk alone
    (``STORAGE``: not priced here, small next to a GPU's hour); None when the price is unknown."""
    ended: bool = False
    """Terminated by the sweep (False in a dry run, or when the terminate failed: ``error``)."""
    error: str = ""

    def as_row(self) -> dict[str, object]:
        return {
            "cloud": self.cloud,
            "instance": self.instance_id,
            "job": self.job,
            "state": self.state,
            "bills": str(self.billing),
            "usd_per_hour": self.usd_per_hour,
            "why": self.why,
            "action": "terminated" if self.ended else (f"failed: {self.error}" if self.error else "none"),
        }


def find_leftovers(db: Database, provider: Provider, now: datetime) -> list[Leftover]:
    """Every leftover of this database on ``provider`` (one ``list_instances``, then one
    ``status`` per instance of ours that no live placement owns)."""
    with db.session() as session:
        mine = stored_database_id(session)  # None: no instance carries this database's id
        placements = {p.key: p for p in session.scalars(select(Placement))}
        session.expunge_all()
    found = []
    for instance in provider.list_instances():
        placement = placements.get(instance.idempotency_key)
        tagged = instance.tags.get(DATABASE_TAG)
        if not (tagged == mine if tagged is not None else placement is not None):
            continue  # another database's, or launched outside the daemon
        why = _unowned(instance, placement, now)
        if not why:
            continue
        status = provider.status(instance.instance_id)
        if status.billing is Billing.NONE:
            continue
        found.append(
            Leftover(
                cloud=instance.market.split("/", 1)[0] or provider.name,
                instance_id=instance.instance_id,
                job=instance.job,
                key=instance.idempotency_key,
                market=instance.market,
                state=str(status.state),
                billing=status.billing,
                why=why,
                usd_per_hour=_hourly(db, instance, placement, status.billing, now),
            )
        )
    return found


def _unowned(instance: Instance, placement: Placement | None, now: datetime) -> str:
    """Why no live placement (or, for a profile's instance, its command) owns ``instance`` (''
    when one does)."""
    if PROFILE_TAG in instance.tags and placement is None:
        if now - instance.launched_at <= timedelta(seconds=LEFTOVER_AFTER_S):
            return ""  # a profile may be measuring it now
        launched = f"{instance.launched_at:%Y-%m-%d %H:%M} UTC"
        return (
            f"a profile run of {instance.tags[PROFILE_TAG]!r} launched {launched}, past the longest one runs"
        )
    if placement is None:
        return "no placement has its key"
    if placement.state not in LIVE_PLACEMENT:
        return f"its placement {placement.state} ({placement.end_reason or 'no reason'})"
    if placement.instance_id is not None and placement.instance_id != instance.instance_id:
        return f"a second instance for the key of placement {placement.id} ({placement.instance_id})"
    return ""


def _hourly(
    db: Database, instance: Instance, placement: Placement | None, billing: Billing, now: datetime
) -> float | None:
    if billing is Billing.STORAGE:
        return 0.0
    if placement is not None:
        return placement.price.instance_usd_per_hour
    with db.session() as session:
        return _market_price(session, instance.market, now)


def _market_price(session: Session, label: str, now: datetime) -> float | None:
    """The price now of the market ``base.market_label`` wrote as ``label`` (None if unknown)."""
    parts = label.split("/")
    if len(parts) != 5:
        return None
    cloud, region, zone, itype, kind = parts
    flt = MarketFilter(clouds=[cloud], regions=[region], instance_types=[itype], kinds=[kind])
    quotes = [q for q in prices_at(session, now, flt) if (q.zone or "-") == zone]
    return quotes[0].usd_per_hour if quotes else None
