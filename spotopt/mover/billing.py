"""What each cloud bills for one instance interval: the mover's ledger (``jobs cost``) uses these.

The planner and the what-if engine price time continuously ($/h x hours). A real bill rounds each
instance's running time by the cloud's own rule, so a ledger that shows "what we paid" must apply
that rule per interval. The rules, with the official statement each one rests on:

- **AWS** (Linux on-demand and spot): per second, 60 s minimum. "Amazon EC2 usage of Linux based
  instances that are launched in On-Demand, Reserved and Spot form will be billed on one second
  increments, with a minimum of 60 seconds."
  (https://aws.amazon.com/about-aws/whats-new/2017/10/announcing-amazon-ec2-per-second-billing/)
  A Spot Instance that *Amazon EC2* interrupts in its first hour is not charged; after the first
  hour it is "Charged for the seconds used" (table "Instance usage", row "If the Amazon EC2
  interrupts the Spot Instance", Windows and Linux excluding SUSE: "Interrupted in the first hour:
  No charge"). An instance we stop or terminate ourselves is charged for the seconds used.
  (https://docs.amazonaws.cn/en_us/AWSEC2/latest/UserGuide/billing-for-interrupted-spot-instances.html,
  the page we read; the same page lives under docs.aws.amazon.com/AWSEC2/latest/UserGuide/)
- **GCP** (Compute Engine): per second, 1 minute minimum. "Machines are charged in units of
  instance-hours on a per-second basis, with a minimum time of one minute." (Google Cloud Platform
  for Developers, Packt, section "Pricing on GCE": https://packtpub.com/en-mt/product/google-cloud-
  platform-for-developers-9781788837675/chapter/google-compute-engine-7/section/pricing-on-gce-
  ch07lvl1sec55). Google's pricing page (https://cloud.google.com/compute/vm-instance-pricing)
  was not in the reference corpus we could read; re-check it there. No refund rule for preempted
  Spot VMs is applied: none was confirmed.
- **Azure** (Virtual Machines): per *full* minute, partial minutes are not billed. Azure's FAQ
  entry "If my virtual machine ran for 6 minutes and 45 seconds, how much will I be billed?"
  answers, in the Norwegian edition we read: "Vi tar betalt per de fulle minuttene den virtuelle
  maskinen din kjører, så du faktureres ikke for noen ekstra sekunder. I dette eksempelet blir du
  fakturert for 6 minutter." (we charge for the full minutes your VM runs, so no extra seconds
  are billed; here, 6 minutes).
  (https://azure.microsoft.com/nb-no/resources/knowledge-center/if-my-virtual-machine-ran-for-6-minutes-and-45/)
  No eviction refund for Azure Spot VMs is applied: none was found.
"""

from __future__ import annotations

import math
from datetime import datetime

from spotopt.errors import InputError
from spotopt.types import CLOUDS

AWS_MINIMUM_S = 60.0
"""AWS bills at least 60 s for every Linux instance start."""
AWS_SPOT_FREE_IF_INTERRUPTED_WITHIN_S = 3600.0
"""A Spot Instance that AWS interrupts within its first hour costs nothing."""
GCP_MINIMUM_S = 60.0
"""GCP bills at least one minute for every VM start."""
AZURE_UNIT_S = 60.0
"""Azure bills whole minutes; the seconds past the last full minute are free."""


def billed_seconds(
    cloud: str, started_at: datetime, ended_at: datetime, *, interrupted_by_cloud: bool = False
) -> float:
    """The seconds ``cloud`` bills for one instance that ran from ``started_at`` to ``ended_at``.

    ``interrupted_by_cloud``: the cloud reclaimed the (spot) instance, rather than we stopping it;
    only AWS has a rule for it (no charge within the first hour).
    """
    ran_s = _ran_seconds(started_at, ended_at)
    if cloud == "aws":
        if interrupted_by_cloud and ran_s < AWS_SPOT_FREE_IF_INTERRUPTED_WITHIN_S:
            return 0.0
        return max(ran_s, AWS_MINIMUM_S)
    if cloud == "gcp":
        return max(ran_s, GCP_MINIMUM_S)
    if cloud == "azure":
        return math.floor(ran_s / AZURE_UNIT_S) * AZURE_UNIT_S
    raise InputError(f"cloud: {cloud!r} has no billing rule; use one of {', '.join(CLOUDS)}")


def interval_cost_usd(
    cloud: str,
    usd_per_hour: float,
    started_at: datetime,
    ended_at: datetime,
    *,
    interrupted_by_cloud: bool = False,
) -> float:
    """What one instance interval costs at ``usd_per_hour`` under ``cloud``'s billing rule."""
    if not math.isfinite(usd_per_hour) or usd_per_hour < 0:
        raise InputError(f"usd_per_hour: {usd_per_hour!r} is not a price; give a finite value >= 0")
    seconds = billed_seconds(cloud, started_at, ended_at, interrupted_by_cloud=interrupted_by_cloud)
    return usd_per_hour * seconds / 3600.0


def _ran_seconds(started_at: datetime, ended_at: datetime) -> float:
    if started_at.tzinfo is None or ended_at.tzinfo is None:
        raise InputError("started_at/ended_at: times must carry a time zone (UTC); a naive time is ambiguous")
    ran_s = (ended_at - started_at).total_seconds()
    if ran_s < 0:
        raise InputError(
            f"ended_at: {ended_at.isoformat()} is before started_at {started_at.isoformat()}; "
            "an interval must end after it starts"
        )
    return ran_s
