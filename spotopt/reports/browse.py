"""``spotopt report browse``: the history in Datasette, with every report's SQL as a canned query.

Datasette (the ``browse`` extra) serves a SQLite file as web pages and JSON, with SQL typed in
the browser. Each report's Core statements (``Report.statements``, what ``report sql`` prints)
become canned queries named ``<report>-<statement>``, their parameters filled in from the
``--param`` values a report declares (defaults otherwise); a report with a required parameter
not given is left out and named. Datasette reads SQLite only: a PostgreSQL history is refused
with the way to get the same SQL (``report sql``) for psql.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.dialects import sqlite

from spotopt.errors import InputError
from spotopt.reports.registry import REPORTS


@dataclass(frozen=True)
class CannedQueries:
    """Datasette's ``queries`` block, and the reports left out for a missing required parameter."""

    queries: dict[str, dict[str, str]]
    skipped: dict[str, str]
    """report name -> the parameter it needs."""


def canned_queries(given: Mapping[str, str], now: datetime) -> CannedQueries:
    """Every report's statements compiled for SQLite with ``given`` (name -> text) applied to
    the reports that declare each parameter. A parameter no report declares is an error."""
    declared = {p.name for r in REPORTS.values() for p in r.params}
    unknown = sorted(set(given) - declared)
    if unknown:
        raise InputError(
            f"--param {unknown[0]}: no report takes it; parameters: {', '.join(sorted(declared))}"
        )
    queries: dict[str, dict[str, str]] = {}
    skipped: dict[str, str] = {}
    for report in REPORTS.values():
        names = {p.name for p in report.params}
        missing = [p.name for p in report.params if p.required and p.name not in given]
        if missing:
            skipped[report.name] = missing[0]
            continue
        args = report.parse({k: v for k, v in given.items() if k in names}, now)
        for stmt_name, stmt in report.statements(args).items():
            sql = stmt.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True})
            queries[f"{report.name}-{stmt_name}"] = {
                "title": f"{report.name}: {stmt_name}",
                "description": f"What `spotopt report run {report.name}` reads ({report.summary}).",
                "sql": str(sql),
            }
    return CannedQueries(queries, skipped)


def metadata(database: str, canned: CannedQueries) -> dict[str, Any]:
    """Datasette's metadata document for the database file whose stem is ``database``."""
    return {
        "title": "spotopt history",
        "description": "Read the history with SQL; the canned queries are the reports' own SQL.",
        "databases": {database: {"queries": canned.queries}},
    }
