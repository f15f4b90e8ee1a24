"""GCP's billing rule for one instance interval (what ``spotopt.mover.billing`` applies).

**GCP** (Compute Engine): per second, 1 minute minimum. "Machines are charged in units of
instance-hours on a per-second basis, with a minimum time of one minute." (Google Cloud Platform
for Developers, Packt, section "Pricing on GCE": https://packtpub.com/en-mt/product/google-cloud-
platform-for-developers-9781788837675/chapter/google-compute-engine-7/section/pricing-on-gce-
ch07lvl1sec55). Google's pricing page (https://cloud.google.com/compute/vm-instance-pricing)
was not in the reference corpus we could read; re-check it there. No refund rule for preempted
Spot VMs is applied: none was confirmed.
"""

from __future__ import annotations

GCP_MINIMUM_S = 60.0
"""GCP bills at least one minute for every VM start."""


def billed_seconds(ran_s: float, interrupted_by_cloud: bool) -> float:
    """The seconds GCP bills for a VM that ran ``ran_s`` seconds (no refund rule for preemption)."""
    return max(ran_s, GCP_MINIMUM_S)
