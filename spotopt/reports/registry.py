"""Every report by its kebab-case name (also its CLI name)."""

from __future__ import annotations

from spotopt.errors import InputError
from spotopt.reports import (
    cheapest,
    coverage,
    interruptions,
    price_board,
    regional_spread,
    spot_discount,
    volatility,
)
from spotopt.reports.base import Report, did_you_mean

REPORTS: dict[str, Report] = {
    r.name: r
    for r in (
        cheapest.REPORT,
        volatility.REPORT,
        spot_discount.REPORT,
        regional_spread.REPORT,
        price_board.REPORT,
        interruptions.REPORT,
        coverage.REPORT,
    )
}


def get(name: str) -> Report:
    """The report called ``name``; an unknown name gets the valid ones and a "did you mean"."""
    try:
        return REPORTS[name]
    except KeyError:
        raise InputError(
            f"no report {name!r}{did_you_mean(name, REPORTS)}; reports: {', '.join(REPORTS)}"
        ) from None
