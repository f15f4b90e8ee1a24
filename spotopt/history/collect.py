"""Run the live collectors into the history: one transaction and one watermark per (collector, scope).

For every cloud asked for, its collectors run in registry order (catalogs first, so price
collectors see the types they add). Each (collector, scope) is recorded in ``runs`` before it
starts and after it ends; its records are fetched completely, then written in one transaction
together with its new watermark (and the AWS zone IDs it learnt). A scope that fails therefore
leaves its watermark where its last committed data ends and costs no other scope anything.
Collectors queried per item (AWS spot prices, per instance type) also keep a watermark per item
within the scope, so a run that covers only some items leaves the others' watermarks alone.

A cloud without credentials is reported as "configure X to collect Y" (without its SDK:
``pip install "spotopt-gpu[X]"``) and the other clouds are still collected. A cloud asked for
by name (a request for fewer than all clouds) is different: if every one of its scopes was
skipped, they count as failed, so the run does not end quietly.
Credentials are never read here: the adaptors hand them to the SDKs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from spotopt.cloud_calls import MissingCredentials, NotPermitted, Retry, redact
from spotopt.clouds.registry import MARKET_CLOUDS, for_cloud
from spotopt.collectors.base import Collector, Context
from spotopt.db.engine import Database
from spotopt.db.models import InstanceType, Market, PricePoint, Watermark
from spotopt.errors import CollectorError
from spotopt.history.ingest import Ingestor, IngestStats, finish_run, start_run
from spotopt.types import InstanceTypeSpec, PriceObservation, Record, Rejection

ClientFactory = Callable[[str], Any]


@dataclass
class ScopeResult:
    """What one (collector, scope) did. ``status``: ok | failed | skipped | dry-run."""

    cloud: str
    collector: str
    scope: str
    status: str
    records: int = 0
    inserted: int = 0
    duplicate: int = 0
    unchanged: int = 0
    rejected: int = 0
    seconds: float = 0.0
    note: str = ""
    unknown: list[str] = field(default_factory=list)
    run_id: int | None = None
    no_credentials: bool = False
    stats: IngestStats = field(default_factory=IngestStats)
    """What ``runs`` records for this scope, exactly as for an import: counts, conflicts and the
    rejection reasons with examples (rejections are counted even when the write fails)."""

    def as_row(self) -> dict[str, Any]:
        return {
            "cloud": self.cloud,
            "collector": self.collector,
            "scope": self.scope,
            "status": self.status,
            "records": self.records,
            "inserted": self.inserted,
            "duplicate": self.duplicate,
            "unchanged": self.unchanged,
            "rejected": self.rejected,
            "seconds": round(self.seconds, 2),
            "note": self.note,
        }


class Reporter(Protocol):
    """Progress hooks (the CLI draws bars with them); every method may do nothing."""

    def planned(self, cloud: str, scopes: int) -> None: ...

    def started(self, cloud: str, collector: str, scope: str) -> None: ...

    def finished(self, result: ScopeResult) -> None: ...


class _Silent:
    def planned(self, cloud: str, scopes: int) -> None:
        pass

    def started(self, cloud: str, collector: str, scope: str) -> None:
        pass

    def finished(self, result: ScopeResult) -> None:
        pass


@dataclass(frozen=True)
class CollectRequest:
    """``regions``/``gpus`` empty mean all; ``since`` overrides the stored watermarks."""

    clouds: tuple[str, ...] = MARKET_CLOUDS
    regions: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    since: datetime | None = None
    dry_run: bool = False


def known_types(session: Session, cloud: str) -> dict[str, InstanceTypeSpec]:
    """The instance types the history knows for ``cloud``, as specs keyed by name."""
    rows = session.scalars(select(InstanceType).where(InstanceType.cloud == cloud))
    return {
        r.name: InstanceTypeSpec(
            cloud=r.cloud,
            name=r.name,
            gpu_model=r.gpu_model,
            gpu_count=r.gpu_count,
            gpu_memory_gib=r.gpu_memory_gib,
            vcpus=r.vcpus,
            memory_gib=r.memory_gib,
            retired=r.retired,
            gpu_name_raw=r.gpu_name_raw,
        )
        for r in rows
    }


def watermark(session: Session, collector: str, scope: str) -> datetime | None:
    row = session.get(Watermark, (collector, scope))
    return row.until if row is not None else None


def keyed_watermarks(session: Session, collector: str, scope: str) -> dict[str, datetime]:
    """key → watermark of the per-key watermarks ``collector`` keeps within ``scope``."""
    prefix = f"{scope}/"
    rows = session.execute(
        select(Watermark.scope, Watermark.until).where(
            Watermark.collector == collector, Watermark.scope.startswith(prefix, autoescape=True)
        )
    )
    return {key[len(prefix) :]: until for key, until in rows}


def run_collect(
    db: Database,
    request: CollectRequest,
    factory: ClientFactory,
    *,
    retry: Retry | None = None,
    now: datetime | None = None,
    reporter: Reporter | None = None,
) -> list[ScopeResult]:
    """Collect every (collector, scope) of the requested clouds; never raises for one scope's failure.

    ``factory(cloud)`` builds a cloud's client factory (``spotopt.clouds.common.sdk.client_factory`` in
    production, offline fakes in tests). Returns one result per scope, in run order.
    """
    reporter = reporter or _Silent()
    now = now or datetime.now(UTC)
    retry = retry or Retry()
    results: list[ScopeResult] = []
    named = set(request.clouds) != set(MARKET_CLOUDS)
    for cloud in request.clouds:
        first = len(results)
        try:
            clients = factory(cloud)
        except MissingCredentials as exc:  # e.g. the cloud's SDK is not installed
            for cls in for_cloud(cloud):
                results.append(_not_run(db, cls, "all", exc, request.dry_run))
                reporter.finished(results[-1])
            if named:
                _fail_skips_of_named_cloud(db, cloud, results[first:])
            continue
        for cls in for_cloud(cloud):
            with db.session() as session:
                catalog = known_types(session, cloud)
            ctx = Context(now=now, regions=request.regions, gpus=request.gpus, catalog=catalog, retry=retry)
            try:
                scopes = cls.scopes(clients, ctx)
            except CollectorError as exc:
                results.append(_not_run(db, cls, "regions", exc, request.dry_run))
                reporter.finished(results[-1])
                continue
            reporter.planned(cloud, len(scopes))
            blocked: ScopeResult | None = None
            for scope in scopes:
                reporter.started(cloud, cls.name, scope)
                if blocked is not None:  # no credentials: the next region has none either
                    result = ScopeResult(cloud, cls.name, scope, "skipped", note=blocked.note)
                else:
                    result = _run_scope(db, cls, clients, scope, ctx, request)
                    if result.no_credentials:
                        blocked = result
                results.append(result)
                reporter.finished(result)
        if named:
            _fail_skips_of_named_cloud(db, cloud, results[first:])
    return results


def _fail_skips_of_named_cloud(db: Database, cloud: str, results: list[ScopeResult]) -> None:
    """A cloud the user named must not end as a quiet skip: when every one of its scopes was
    skipped (no credentials, no permission), they become failures saying so."""
    if not results or any(r.status != "skipped" for r in results):
        return
    for result in results:
        result.status = "failed"
        result.note = f"{result.note} ({cloud} was asked for by name and collected nothing)"
        if result.run_id is not None:
            _finish_run(db, result)


def _skip_note(cls: type[Collector], exc: CollectorError) -> str:
    if isinstance(exc, MissingCredentials):
        return redact(f"{exc.hint} to collect {cls.collects}")
    return redact(f"not permitted: {exc} (grant it to collect {cls.collects})")


def _not_run(
    db: Database, cls: type[Collector], scope: str, exc: CollectorError, dry_run: bool
) -> ScopeResult:
    skipped = isinstance(exc, (MissingCredentials, NotPermitted))
    note = _skip_note(cls, exc) if skipped else redact(str(exc))
    result = ScopeResult(cls.cloud, cls.name, scope, "skipped" if skipped else "failed", note=note)
    if not dry_run:
        result.run_id = start_run(db, cls.name, scope)
        _finish_run(db, result)
    return result


def _finish_run(db: Database, result: ScopeResult) -> None:
    assert result.run_id is not None
    error = result.note if result.status != "ok" and result.note else None
    finish_run(db, result.run_id, result.status, result.stats, error)


def _run_scope(
    db: Database,
    cls: type[Collector],
    clients: Any,
    scope: str,
    ctx: Context,
    request: CollectRequest,
) -> ScopeResult:
    started = time.monotonic()
    result = ScopeResult(cls.cloud, cls.name, scope, "dry-run" if request.dry_run else "running")
    if not request.dry_run:
        result.run_id = start_run(db, cls.name, scope)
    try:
        collector = cls(clients, scope, ctx)
        with db.session() as session:
            if cls.keyed_watermarks:  # the per-key watermarks replace the scope's
                since = request.since
                if since is None:
                    collector.since_by_key = keyed_watermarks(session, cls.name, scope)
            else:
                since = request.since or watermark(session, cls.name, scope)
        records = list(collector.collect(since))
        _describe(result, records, collector)
        if not request.dry_run:
            with db.session() as session:
                _write(session, collector, records, result)
            result.status = "ok"
    except (MissingCredentials, NotPermitted) as exc:
        result.status, result.note = "skipped", _skip_note(cls, exc)
        result.no_credentials = isinstance(exc, MissingCredentials)
    except CollectorError as exc:
        _failed(result, str(exc))
    except Exception as exc:
        _failed(result, f"{type(exc).__name__}: {exc}")
    except BaseException as exc:
        _failed(result, f"interrupted ({type(exc).__name__})")
        if result.run_id is not None:
            result.seconds = time.monotonic() - started
            _finish_run(db, result)
        raise
    result.seconds = time.monotonic() - started
    if result.run_id is not None:
        _finish_run(db, result)
    return result


def _failed(result: ScopeResult, note: str) -> None:
    """Mark ``result`` failed. Its write was one transaction, rolled back, so whatever it had
    counted as inserted, duplicate or unchanged was not stored."""
    result.status, result.note = "failed", redact(note)
    result.inserted = result.duplicate = result.unchanged = 0
    result.stats.inserted = result.stats.duplicate = result.stats.conflicting = 0


def _describe(result: ScopeResult, records: Sequence[Record], collector: Collector) -> None:
    """Counts and the notes a person needs: unknown GPU names, what the collector noticed."""
    for r in records:
        if isinstance(r, Rejection):
            result.stats.reject(r.where, r.reason)
    result.rejected = result.stats.rejected
    result.records = len(records) - result.rejected
    result.unknown = sorted(
        f"{r.name} ({r.gpu_name_raw})"
        for r in records
        if isinstance(r, InstanceTypeSpec) and r.gpu_model is None and r.gpu_name_raw
    )
    notes = list(collector.notes)
    if result.unknown:
        notes.append("unknown GPU names: " + ", ".join(result.unknown))
    if result.stats.rejections:
        notes.append(
            "rejected: " + ", ".join(f"{k} ×{v}" for k, v in sorted(result.stats.rejections.items()))
        )
    result.note = "; ".join(notes)


def _write(session: Session, collector: Collector, records: Iterable[Record], result: ScopeResult) -> None:
    """Ingest one scope, advance its watermark and record zone IDs, all in ``session``'s transaction."""
    ingestor = Ingestor(session, collector.name, result.run_id)
    last = _last_prices(session, collector.name) if collector.only_changes else None
    for record in records:
        if last is not None and isinstance(record, PriceObservation):
            market_id = ingestor.market_id(record.market)
            previous = last.get(market_id)
            if (
                previous is not None
                and previous[0] < record.observed_at
                and previous[1] == record.usd_per_hour
            ):
                result.unchanged += 1
                continue
            if previous is None or record.observed_at > previous[0]:
                last[market_id] = (record.observed_at, record.usd_per_hour)
        ingestor.add(record)
    stats = ingestor.flush()
    # New instance types count as inserted rows: for a catalog collector they are its output.
    stats.inserted += len(stats.new_types)
    result.stats = stats
    result.inserted, result.duplicate = stats.inserted, stats.duplicate
    if stats.conflicting:
        conflicts = f"conflicting with stored observations: {stats.conflicting} (the stored ones are kept)"
        result.note = "; ".join(filter(None, [result.note, conflicts]))
    if stats.unknown_types:
        names = ", ".join(sorted(n for _, n in stats.unknown_types))
        result.note = "; ".join(filter(None, [result.note, f"instance types not in the catalog: {names}"]))
    if collector.until is not None:
        _advance(session, collector.name, collector.scope, collector.until)
    for key, until in sorted(collector.until_by_key.items()):
        _advance(session, collector.name, f"{collector.scope}/{key}", until)
    _set_zone_ids(session, collector.cloud, collector.zone_ids)


def _advance(session: Session, collector: str, scope: str, until: datetime) -> None:
    """Move the watermark of (collector, scope) forward to ``until`` (never back)."""
    row = session.get(Watermark, (collector, scope))
    if row is None:
        session.add(Watermark(collector=collector, scope=scope, until=until, updated_at=datetime.now(UTC)))
    else:
        row.until = max(row.until, until)
        row.updated_at = datetime.now(UTC)


def _last_prices(session: Session, source: str) -> dict[int, tuple[datetime, float]]:
    """market id → (time, price) of the latest point ``source`` stored for it."""
    latest = (
        select(PricePoint.market_id, func.max(PricePoint.observed_at).label("at"))
        .where(PricePoint.source == source)
        .group_by(PricePoint.market_id)
        .subquery()
    )
    rows = session.execute(
        select(PricePoint.market_id, PricePoint.observed_at, PricePoint.usd_per_hour)
        .join(
            latest,
            (PricePoint.market_id == latest.c.market_id) & (PricePoint.observed_at == latest.c.at),
        )
        .where(PricePoint.source == source)
    )
    return {m: (at, usd) for m, at, usd in rows}


def _set_zone_ids(session: Session, cloud: str, zone_ids: dict[tuple[str, str], str]) -> None:
    if not zone_ids:
        return
    types = select(InstanceType.id).where(InstanceType.cloud == cloud)
    for (region, zone), zone_id in sorted(zone_ids.items()):
        session.execute(
            update(Market)
            .where(Market.region == region, Market.zone == zone, Market.instance_type_id.in_(types))
            .values(zone_id=zone_id)
        )
