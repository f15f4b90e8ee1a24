"""The one price type from the decision to the ledger, and the conversions every stage shares.

A price is US dollars per hour in a ``float`` (the unit in the name: ``usd_per_hour``). The
history holds one *instance's* price (``PricePoint``, ``Quote``, the what-if timeline); a job
may take only a share of an instance (``gpu`` billing: ``k`` jobs on one), so what the decision
core weighs, a move records, a placement is launched at and the ledger bills is one *job
slot's* price: the instance's over the jobs on it (``per_slot``). A ``SlotPrice`` carries that
figure with its share from the daemon's decision through the move and the placement to the
ledger and the budget checks, so no stage re-derives one from the other by a rule of its own
(``instances * price`` is not always ``price / jobs`` in floating point). What an interval costs
at a price is ``usd_for``; the seconds it bills are the cloud's rule
(``spotopt.mover.billing``). docs/architecture.md maps every form a price takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # the module imports nothing at run time: the database models use it
    import numpy as np

Amount = TypeVar("Amount", float, "np.ndarray[Any, Any]")
"""A scalar or an array of figures: the decision core and the what-if engine price whole arrays
of options at once (one NumPy division over millions of options, not a loop over objects),
with the same rule a single price gets."""

SECONDS_PER_HOUR = 3600.0

QUOTE_DECIMALS = 6
"""Decimals of a price spotopt computes from parts (GCP's SKU rates times the machine's cores,
memory and GPUs; the synthetic example market): a quote as the clouds print theirs, so a sum's
float noise never makes two equal prices differ and a stored point is re-read as written."""


def per_slot(instance_usd_per_hour: Amount, jobs_per_instance: Amount) -> Amount:
    """A job slot's price: the instance's over the jobs billed on it (1 with ``instance``
    billing; ``floor(G / d)`` with ``gpu`` billing, ``spotopt.decide.options.BILLING``).
    NaN (the market unavailable) stays NaN."""
    return instance_usd_per_hour / jobs_per_instance


def instances_per_slot(jobs_per_instance: Amount) -> Amount:
    """The share of an instance one job slot takes (instance-hours per job-hour)."""
    return 1.0 / jobs_per_instance


def usd_for(usd_per_hour: float, seconds: float) -> float:
    """What ``seconds`` cost at ``usd_per_hour``: the ledger's rows, the launch's budget check
    and ``spotopt.mover.billing.interval_cost_usd`` all bill billed seconds by it."""
    return usd_per_hour * seconds / SECONDS_PER_HOUR


def quoted(usd_per_hour: float) -> float:
    """A computed price rounded as a quote (``QUOTE_DECIMALS``)."""
    return round(usd_per_hour, QUOTE_DECIMALS)


def jobs_from_share(instances: float | None) -> int:
    """The jobs billed on one instance, from the share of it a slot takes as a move and a
    placement record it (``instances``: ``1 / jobs``; None or 0: a whole instance)."""
    return round(1.0 / instances) if instances else 1


@dataclass(frozen=True, slots=True)
class SlotPrice:
    """What one job slot costs per hour, and how many jobs share its instance.

    The form a price has from the daemon's decision to the ledger: the target of a move
    (``JobMove.price``), the launch price of a placement (``Placement.price``), the price the
    budget checks and the fleet's spend-rate cap read, and the slot the ledger bills at its
    market's price in effect (``spotopt.mover.ledger.slot_mean``: ``per_slot`` of that price
    with ``jobs_per_instance``, the launch price where the history has none).

    The decision core and the what-if engine keep their prices as arrays (``Options.usd_per_hour``,
    ``Timeline.price``; NaN: unavailable), not as objects: they price millions of options per
    round with one NumPy operation, by the same ``per_slot``; a ``SlotPrice`` is made from the
    array once an option is chosen.
    """

    usd_per_hour: float
    jobs_per_instance: int = 1

    @classmethod
    def recorded(cls, usd_per_hour: float | None, instances: float | None) -> SlotPrice:
        """A move's or a placement's two price columns: the slot's ``usd_per_hour`` (None: no
        price was recorded, 0) and the ``instances`` it takes (None: a whole one)."""
        return cls(usd_per_hour or 0.0, jobs_from_share(instances))

    @property
    def instances(self) -> float:
        """The share of an instance the slot takes, as the records store it."""
        return instances_per_slot(self.jobs_per_instance)

    @property
    def instance_usd_per_hour(self) -> float:
        """What the whole instance costs per hour (a leftover instance bills all of it)."""
        return per_instance(self.usd_per_hour, self.jobs_per_instance)


def per_instance(slot_usd_per_hour: float, jobs_per_instance: int) -> float:
    """A per-slot figure (a price, the job's spend-rate cap) over the whole instance."""
    return slot_usd_per_hour * jobs_per_instance
