"""``min-cost-slo``: the fewest dollars that finish every job by its deadline.

The same exact LP as ``min-cost`` with each job's wall-clock hours bounded by its deadline
(Gavel's SLO constraint ``throughput(m, X) >= num_steps_m / SLO_m``, written in job-hours so it
stays linear together with the exact cost). When no allocation meets every deadline, the
error names each job that cannot make it and by how many hours.
"""

from __future__ import annotations

from spotopt.policies.base import Allocation, PolicyInput, register
from spotopt.policies.min_cost import solve_min_cost

NAME = "min-cost-slo"


@register(NAME)
def min_cost_slo(inp: PolicyInput) -> Allocation:
    return solve_min_cost(inp, NAME, inp.wall_limit())
