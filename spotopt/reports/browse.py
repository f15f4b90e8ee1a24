"""``spotopt report browse``: the history in Datasette, with every report's SQL as a canned query.

Datasette (the ``browse`` extra) serves a SQLite file as web pages and JSON, with SQL typed in
the browser. Each report's Core statements (``Report.statements``, what ``report sql`` prints)
become canned queries named ``<report>-<statement>``, their parameters filled in from the
``--param`` values a report declares (defaults otherwise); a report with a required parameter
not given is left out and named. Datasette reads SQLite only: a PostgreSQL history is refused
with the way to get the same SQL (``report sql``) for psql.

Datasette runs in this process (``serve``), behind ``spotopt.webguard``: it serves loopback only
and has no login, so it answers only requests addressed to this machine (a page renamed to
127.0.0.1 is refused), and no page may be framed. SQL typed in the browser is bounded: in time
(``SQL_TIME_LIMIT_MS``), in rows (``MAX_RETURNED_ROWS``), in the size of any one value SQLite
makes (``MAX_VALUE_BYTES``: ``zeroblob(1e9)`` is refused, not allocated), in SQLite's own memory
(``SQLITE_HEAP_BYTES``), and, where the system enforces it, in the process's data memory
(``PROCESS_DATA_BYTES``: many rows of large values end in an error, not in the machine's swap).
"""

from __future__ import annotations

import resource
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from sqlalchemy.dialects import sqlite

from spotopt.errors import InputError
from spotopt.reports.registry import REPORTS
from spotopt.webguard import DATASETTE_CSP, GuardASGI, loopback_hosts

SQL_TIME_LIMIT_MS = 10_000
"""A query running longer is stopped (Datasette's ``sql_time_limit_ms``)."""
MAX_RETURNED_ROWS = 1_000
"""At most this many rows per page or query result (Datasette's ``max_returned_rows``)."""
MAX_VALUE_BYTES = 1_000_000
"""No string or blob longer (``SQLITE_LIMIT_LENGTH``; SQLite's default is 1e9). A stored value
longer could not be read either: the history's longest texts (notes, reasons) are far shorter."""
SQLITE_HEAP_BYTES = 256 << 20
"""SQLite's memory in all (``PRAGMA hard_heap_limit``): a bigger sort spills to temporary files."""
PROCESS_DATA_BYTES = 1 << 30
"""The process's data memory (``RLIMIT_DATA``, enforced on Linux): what Datasette holds of the
rows it returns counts here, beyond SQLite's own."""
PLUGIN = "spotopt_limits"


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


def _limit(conn: sqlite3.Connection) -> None:
    """Datasette's ``prepare_connection`` hook: every connection it opens gets the limits."""
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    conn.execute(f"PRAGMA hard_heap_limit = {SQLITE_HEAP_BYTES}")


def serve(path: Path, canned: CannedQueries, host: str, port: int) -> None:
    """Serve the SQLite history at ``path`` in Datasette on loopback ``host:port`` until stopped
    (SIGTERM or Ctrl-C), with ``canned``'s queries and the limits above."""
    import uvicorn
    from datasette import hookimpl
    from datasette.app import Datasette
    from datasette.plugins import pm

    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard == resource.RLIM_INFINITY or hard > PROCESS_DATA_BYTES:
        resource.setrlimit(resource.RLIMIT_DATA, (PROCESS_DATA_BYTES, hard))
    if pm.get_plugin(PLUGIN) is None:  # a plugin is a module (Datasette lists it by __name__)
        plugin = ModuleType(PLUGIN, _limit.__doc__)
        plugin.prepare_connection = hookimpl(_limit)  # type: ignore[attr-defined]
        pm.register(plugin, name=PLUGIN)
    datasette = Datasette(
        [str(path)],
        metadata=metadata(path.stem, canned),
        settings={"sql_time_limit_ms": SQL_TIME_LIMIT_MS, "max_returned_rows": MAX_RETURNED_ROWS},
    )
    app = GuardASGI(datasette.app(), loopback_hosts(host), DATASETTE_CSP)
    uvicorn.run(app, host=host, port=port, log_level="warning")
