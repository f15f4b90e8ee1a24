"""Every report by its kebab-case name (also its CLI name)."""

from __future__ import annotations

from spotopt.registry import Registry
from spotopt.reports import (
    availability,
    cheapest,
    coverage,
    interruptions,
    price_board,
    regional_spread,
    spot_discount,
    volatility,
)
from spotopt.reports.base import Report

REPORTS: Registry[Report] = Registry("report", "reports")
for _report in (
    cheapest.REPORT,
    volatility.REPORT,
    spot_discount.REPORT,
    regional_spread.REPORT,
    price_board.REPORT,
    interruptions.REPORT,
    coverage.REPORT,
    availability.REPORT,
):
    REPORTS.add(_report.name, _report)
