"""Azure's billing rule for one instance interval (what ``spotopt.mover.billing`` applies).

**Azure** (Virtual Machines): per *full* minute, partial minutes are not billed. Azure's FAQ
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

AZURE_UNIT_S = 60.0
"""Azure bills whole minutes; the seconds past the last full minute are free."""


def billed_seconds(ran_s: float, interrupted_by_cloud: bool) -> float:
    """The seconds Azure bills for a VM that ran ``ran_s`` seconds (no eviction refund)."""
    return math.floor(ran_s / AZURE_UNIT_S) * AZURE_UNIT_S
