"""The collector interface; each cloud's collectors live in its folder (``spotopt/clouds/<cloud>/``).

A collector reads one cloud API for one *scope* (a region, or ``global`` for sources that
publish one document for every region) and yields typed records; it never touches the
database. ``spotopt.history.collect`` runs each (collector, scope) as its own transaction with its own
watermark, so a region that fails loses nothing elsewhere.

Cloud clients come from a factory given to the constructor (``spotopt.clouds.common.sdk``): the single
seam tests replace with offline fakes. Errors leave a collector in one of three shapes:
``MissingCredentials`` (nothing configured: skip and say what to configure),
``NotPermitted`` (credentials lack a permission: skip and say which), or ``CollectorError``
(the call failed for good, after retrying known transient codes only; credentials the cloud
rejects are such a failure, "credentials rejected", not a skip). That retry rule and error
classification live in ``spotopt.cloud_calls``, shared with the adaptors and providers.

The collectors register by name in ``spotopt.clouds.registry.COLLECTORS``, loaded from the modules
each cloud's entry names: this module sits below the clouds (it imports only the base modules), so
the registry that knows the clouds cannot live here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, ClassVar, TypeVar

from spotopt.catalog import gpu_matches
from spotopt.cloud_calls import Retry
from spotopt.errors import CollectorError, InputError
from spotopt.types import InstanceTypeSpec, Record, Rejection

T = TypeVar("T")

GLOBAL_SCOPE = "global"


@dataclass(frozen=True)
class Context:
    """What one run asks of every collector.

    ``regions`` empty means every region the cloud offers; ``gpus`` empty means every GPU;
    ``catalog`` holds the instance types the history already knows for this cloud (bundled
    catalog plus earlier collector runs), keyed by name.
    """

    now: datetime
    regions: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    catalog: Mapping[str, InstanceTypeSpec] = field(default_factory=dict)
    retry: Retry = field(default_factory=Retry)

    def wants_region(self, region: str) -> bool:
        return not self.regions or region in self.regions

    def wants_gpu(self, gpu_model: str | None) -> bool:
        """True without ``--gpu``; with it, only types whose canonical GPU matches one of them."""
        return not self.gpus or any(gpu_matches(g, gpu_model) for g in self.gpus)


class Collector(ABC):
    """Reads one API of one cloud for one scope and yields records.

    Subclasses set ``name`` (kebab-case; also the ``source`` of what they write and the
    watermark key), ``cloud``, ``collects`` (what, for notes and the README) and ``needs``
    (what to configure, for "configure X to collect Y"). ``only_changes`` asks the
    orchestrator to store a price only when it differs from this collector's last stored price
    of the market (for snapshot APIs that report the current price each time).
    """

    name: ClassVar[str]
    cloud: ClassVar[str]
    collects: ClassVar[str]
    needs: ClassVar[str]
    only_changes: ClassVar[bool] = False
    global_scope: ClassVar[bool] = False
    keyed_watermarks: ClassVar[bool] = False
    """The collector also keeps a watermark per key within its scope (stored as scope
    ``<scope>/<key>``): for APIs queried per item, where a run may cover only some items."""

    def __init__(self, clients: Any, scope: str, ctx: Context) -> None:
        self.clients = clients
        self.scope = scope
        self.ctx = ctx
        self.until: datetime | None = ctx.now
        """The new watermark once ``collect`` has run to the end: data up to here is stored
        (None: the run did not cover the whole scope, so the scope's watermark stays)."""
        self.since_by_key: dict[str, datetime] = {}
        """With ``keyed_watermarks``: the stored watermark of each key (empty under ``--since``)."""
        self.until_by_key: dict[str, datetime] = {}
        """With ``keyed_watermarks``: key → new watermark, set once ``collect`` has run to the end."""
        self.zone_ids: dict[tuple[str, str], str] = {}
        """(region, zone name) → zone ID learnt while collecting (AWS AZ IDs)."""
        self.notes: list[str] = []

    @property
    def region(self) -> str | None:
        return None if self.scope == GLOBAL_SCOPE else self.scope

    @classmethod
    def scopes(cls, clients: Any, ctx: Context) -> list[str]:
        """The scopes one run covers: ``global``, or the requested regions by default."""
        if cls.global_scope:
            return [GLOBAL_SCOPE]
        if ctx.regions:
            return list(ctx.regions)
        return cls.default_regions(clients, ctx)

    @classmethod
    def default_regions(cls, clients: Any, ctx: Context) -> list[str]:
        """Every region the cloud offers to the caller; a collector that cannot list them needs --region."""
        raise InputError(f"{cls.name} cannot list its regions: pass --region R")

    @abstractmethod
    def collect(self, since: datetime | None) -> Iterator[Record]:
        """Yield the records of this scope observed since ``since`` (None: as far back as useful).

        Idempotent: records carry their source's own times where it has them, so collecting an
        overlapping window again yields records the history already holds (ignored on insert).
        """

    def call(self, api: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``: one API request under the retry rule, errors naming this
        collector's cloud and region and ``api``."""
        return self.ctx.retry.run(partial(fn, *args, **kwargs), self.cloud, api, self.region)

    def parsed(self, parse: Callable[..., T], *args: Any) -> T | Rejection:
        """``parse(*args)``: a malformed item becomes a counted rejection, not a failed scope."""
        try:
            return parse(*args)
        except InputError as exc:
            return Rejection(str(exc)[:300], "malformed item")

    def next_token(self, api: str, seen: set[str], token: str | None) -> str | None:
        """``token`` if it leads to a page not read yet; a server that hands back a token it gave
        before would make the collector loop forever, so that is an error naming the call."""
        if not token:
            return None
        if token in seen:
            raise CollectorError(self.cloud, api, "pagination repeated a page token", self.region)
        seen.add(token)
        return token

    def memo(self, key: tuple[str, ...], compute: Callable[[], T]) -> T:
        """``compute()`` once per client factory: the collectors of one run share listings
        (a region's GPU types, a cloud's SKU list) instead of fetching them again."""
        store: dict[tuple[str, ...], Any] = self.clients.__dict__.setdefault("_spotopt_memo", {})
        if key not in store:
            store[key] = compute()
        result: T = store[key]
        return result


def hour(at: datetime) -> datetime:
    """``at`` rounded down to the hour: the time stamp of snapshot data without its own time,
    so collecting twice within an hour stores one observation."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
