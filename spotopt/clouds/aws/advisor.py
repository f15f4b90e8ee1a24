"""AWS Spot Instance Advisor: interruption-frequency buckets per region and GPU instance type.

The advisor publishes one public JSON document (no credentials) for every region:
``ranges`` holds the buckets (``{"index": 1, "label": "5-10%", ...}``) and
``spot_advisor[region]["Linux"][type]["r"]`` the bucket index of a type. The document carries no
date, so its HTTP ``Last-Modified`` time is the snapshot time: fetching the same snapshot twice
stores it once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from spotopt.clouds.registry import register_collector
from spotopt.collectors.base import Collector, hour
from spotopt.types import InterruptionObservation, Record, Rejection

ADVISOR_URL = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"
_PERCENT = re.compile(r"\d+(?:\.\d+)?")


def bucket_upper_bound(label: str) -> float | None:
    """Upper bound in %/month of a bucket label: ``<5%`` → 5, ``5-10%`` → 10, ``>20%`` → 100."""
    numbers = [float(n) for n in _PERCENT.findall(label)]
    if not numbers:
        return None
    return 100.0 if label.strip().startswith(">") else max(numbers)


def snapshot_time(headers: Mapping[str, str], fallback: datetime) -> datetime:
    """The document's ``Last-Modified`` time in UTC, else ``fallback`` rounded to the hour.

    ``parsedate_to_datetime`` returns a naive datetime for the zone ``-0000`` (RFC 2822's "UTC,
    origin unknown"); HTTP dates are UTC, so a naive result is UTC.
    """
    for key, value in headers.items():
        if key.lower() == "last-modified":
            try:
                parsed = parsedate_to_datetime(value)
            except (TypeError, ValueError):
                break
            return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    return hour(fallback)


@register_collector
class AwsSpotAdvisor(Collector):
    """Interruption buckets of GPU types known to the catalog, for the requested regions."""

    name = "aws-spot-advisor"
    cloud = "aws"
    collects = "interruption frequency (Spot Instance Advisor)"
    needs = "nothing (public document)"
    global_scope = True

    def collect(self, since: datetime | None) -> Iterator[Record]:
        document, headers = self.call("GET spot-advisor-data.json", self.clients.http.get, ADVISOR_URL)
        at = snapshot_time(headers, self.ctx.now)
        try:
            labels = {int(r["index"]): str(r["label"]) for r in document["ranges"]}
            regions: dict[str, Any] = document["spot_advisor"]
        except (KeyError, TypeError, ValueError) as exc:
            yield Rejection(f"spot-advisor-data.json: {type(exc).__name__} {exc}", "malformed document")
            return
        gpu_types = {
            n for n, s in self.ctx.catalog.items() if s.gpu_count and self.ctx.wants_gpu(s.gpu_model)
        }
        for region, systems in sorted(regions.items()):
            if not self.ctx.wants_region(region):
                continue
            linux = systems.get("Linux", {}) if isinstance(systems, dict) else {}
            for name, stats in sorted(linux.items()):
                if name not in gpu_types:
                    continue
                index = stats.get("r") if isinstance(stats, dict) else None
                label = labels.get(index) if isinstance(index, int) else None
                value = bucket_upper_bound(label) if label else None
                if label is None or value is None:
                    yield Rejection(
                        f"spot-advisor-data.json: {region}.Linux.{name}: {stats!r}"[:300], "malformed item"
                    )
                    continue
                yield InterruptionObservation("aws", region, None, name, at, "advisor-bucket", value, label)
