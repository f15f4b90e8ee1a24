"""AWS's billing rule for one instance interval (what ``spotopt.mover.billing`` applies).

**AWS** (Linux on-demand and spot): per second, 60 s minimum. "Amazon EC2 usage of Linux based
instances that are launched in On-Demand, Reserved and Spot form will be billed on one second
increments, with a minimum of 60 seconds."
(https://aws.amazon.com/about-aws/whats-new/2017/10/announcing-amazon-ec2-per-second-billing/)
A Spot Instance that *Amazon EC2* interrupts in its first hour is not charged; after the first
hour it is "Charged for the seconds used" (table "Instance usage", row "If the Amazon EC2
interrupts the Spot Instance", Windows and Linux excluding SUSE: "Interrupted in the first hour:
No charge"). An instance we stop or terminate ourselves is charged for the seconds used.
(https://docs.amazonaws.cn/en_us/AWSEC2/latest/UserGuide/billing-for-interrupted-spot-instances.html,
the page we read; the same page lives under docs.aws.amazon.com/AWSEC2/latest/UserGuide/)
"""

from __future__ import annotations

AWS_MINIMUM_S = 60.0
"""AWS bills at least 60 s for every Linux instance start."""
AWS_SPOT_FREE_IF_INTERRUPTED_WITHIN_S = 3600.0
"""A Spot Instance that AWS interrupts within its first hour costs nothing."""


def billed_seconds(ran_s: float, interrupted_by_cloud: bool) -> float:
    """The seconds AWS bills for an instance that ran ``ran_s`` seconds."""
    if interrupted_by_cloud and ran_s < AWS_SPOT_FREE_IF_INTERRUPTED_WITHIN_S:
        return 0.0
    return max(ran_s, AWS_MINIMUM_S)
