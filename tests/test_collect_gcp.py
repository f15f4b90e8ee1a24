"""GCP collectors against ``responses`` (REST compute client, billing client with transport="rest")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import responses
from responses import matchers
from sqlalchemy import select

from spotopt.clouds.gcp.collectors import gpu_key
from spotopt.db.engine import Database
from spotopt.db.models import InstanceType, Market, PricePoint, Watermark
from spotopt.history.collect import CollectRequest, ScopeResult, run_collect
from tests.collect_fakes import (
    CE,
    NOW,
    SKUS_URL,
    Sleeps,
    add_gcp_defaults,
    fixture,
    gcp_clients,
    no_wait_retry,
)


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def collect(db: Database, sleeps: Sleeps | None = None, **request: Any) -> dict[str, ScopeResult]:
    request.setdefault("regions", ("us-central1",))
    now = request.pop("now", NOW)
    results = run_collect(
        db,
        CollectRequest(clouds=("gcp",), **request),
        lambda cloud: gcp_clients(),
        retry=no_wait_retry(sleeps),
        now=now,
    )
    return {r.collector: r for r in results}


def prices(db: Database) -> list[tuple[str, str, str, float]]:
    with db.session() as s:
        rows = s.execute(
            select(InstanceType.name, Market.kind, PricePoint.observed_at, PricePoint.usd_per_hour)
            .join(Market, Market.instance_type_id == InstanceType.id)
            .join(PricePoint, PricePoint.market_id == Market.id)
            .where(PricePoint.source == "gcp-prices")
            .order_by(InstanceType.name, Market.kind, PricePoint.observed_at)
        )
        return [(n, k, t.isoformat(), p) for n, k, t, p in rows]


def test_catalog_and_prices_summed_from_skus(db: Database, rsps: responses.RequestsMock) -> None:
    add_gcp_defaults(rsps)
    results = collect(db)
    assert {k: r.status for k, r in results.items()} == {"gcp-catalog": "ok", "gcp-prices": "ok"}
    t0, t1 = "2026-11-20T08:00:00+00:00", "2026-11-20T09:30:00+00:00"
    # vCPUs × core SKU + GiB × RAM SKU + GPUs × GPU SKU, per usage type (hand-computed).
    assert prices(db) == [
        ("a2-highgpu-1g", "on-demand", t0, pytest.approx(12 * 0.031611 + 85 * 0.004237 + 2.933908)),
        ("g2-standard-8", "on-demand", t0, pytest.approx(0.852704)),
        ("g2-standard-8", "spot", t0, pytest.approx(0.34104)),
        ("n1-standard-8+1xnvidia-tesla-v100", "on-demand", t0, pytest.approx(2.859998)),
        ("n1-standard-8+1xnvidia-tesla-v100", "spot", t1, pytest.approx(0.82404)),
    ]
    price_note = results["gcp-prices"].note
    # No spot A100 SKU: that market is rejected, not priced without its GPU; a per-month RAM SKU
    # is unusable. x9-gpu-1g has an unknown GPU and no SKUs.
    assert "no gpu SKU for a100" in price_note and "unusable price ×1" in price_note
    assert "no core SKU for X9" in price_note
    catalog = results["gcp-catalog"]
    assert catalog.unknown == ["x9-gpu-1g (nvidia-zz99)"]
    assert "accelerator types with no known GPU model: nvidia-zz99" in catalog.note
    with db.session() as s:
        x9 = s.scalar(select(InstanceType).where(InstanceType.name == "x9-gpu-1g"))
        assert x9 is not None and (x9.gpu_model, x9.gpu_name_raw, x9.vcpus, x9.memory_gib) == (
            None,
            "nvidia-zz99",
            16,
            64.0,
        )
    # Both aggregated lists and the SKU list were followed to their second page.
    tokens = [c.request.params.get("pageToken") for c in rsps.calls]
    assert tokens.count("mt-2") == 1 and tokens.count("sku-2") == 1


def serve_skus(rsps: responses.RequestsMock, first: dict[str, Any], *failures: int) -> list[int]:
    """Serve the SKU list: ``failures`` (HTTP statuses) first, then ``first`` and page 2 by token."""
    statuses: list[int] = []
    queue = list(failures)

    def reply(request: Any) -> tuple[int, dict[str, str], str]:
        if queue:
            status = queue.pop(0)
            statuses.append(status)
            return status, {}, json.dumps({"error": {"code": status, "message": "try later"}})
        statuses.append(200)
        page = fixture("gcp", "skus_page2.json") if request.params.get("pageToken") == "sku-2" else first
        return 200, {}, json.dumps(page)

    rsps.add_callback(responses.GET, SKUS_URL, callback=reply)
    return statuses


def serve_compute(rsps: responses.RequestsMock) -> None:
    rsps.get(
        f"{CE}/aggregated/machineTypes",
        json=fixture("gcp", "machine_types_page2.json"),
        match=[matchers.query_param_matcher({"pageToken": "mt-2"}, strict_match=False)],
    )
    rsps.get(f"{CE}/aggregated/machineTypes", json=fixture("gcp", "machine_types_page1.json"))
    rsps.get(f"{CE}/aggregated/acceleratorTypes", json=fixture("gcp", "accelerator_types.json"))


def test_prices_are_stored_only_when_they_change(db: Database, rsps: responses.RequestsMock) -> None:
    serve_compute(rsps)
    serve_skus(rsps, fixture("gcp", "skus_page1.json"))
    collect(db)
    first = prices(db)
    # Same prices, a later effective time (the catalog reports "latest" within the last 12 h).
    same = fixture("gcp", "skus_page1.json")
    for sku in same["skus"]:
        sku["pricingInfo"][0]["effectiveTime"] = "2026-11-21T08:00:00.000Z"
    rsps.reset()
    serve_compute(rsps)
    serve_skus(rsps, same)
    again = collect(db, now=NOW + timedelta(days=1))["gcp-prices"]
    # a2-highgpu-1g's SKUs (page 2) kept their effective time: the same point, a duplicate.
    assert (again.inserted, again.unchanged, again.duplicate) == (0, 4, 1)
    assert prices(db) == first
    # The L4 spot price drops: only the G2 spot market gets a new point.
    rsps.reset()
    serve_compute(rsps)
    serve_skus(rsps, fixture("gcp", "skus_l4_spot_cut.json"))
    cut = collect(db, now=NOW + timedelta(days=11))["gcp-prices"]
    assert cut.inserted == 1
    assert ("g2-standard-8", "spot", "2026-12-01T08:00:00+00:00", pytest.approx(0.32704)) in prices(db)
    assert len(prices(db)) == len(first) + 1
    with db.session() as s:
        mark = s.get(Watermark, ("gcp-prices", "global"))
        assert mark is not None and mark.until == NOW + timedelta(days=11)


def test_throttling_then_success(db: Database, rsps: responses.RequestsMock) -> None:
    serve_compute(rsps)
    statuses = serve_skus(rsps, fixture("gcp", "skus_page1.json"), 429, 503)
    sleeps = Sleeps()
    results = collect(db, sleeps)
    assert results["gcp-prices"].status == "ok" and len(prices(db)) == 5
    assert statuses == [429, 503, 200, 200] and sleeps == [0.5, 1.0]


def test_5xx_exhausts_retries_and_names_the_call(db: Database, rsps: responses.RequestsMock) -> None:
    rsps.get(f"{CE}/aggregated/machineTypes", status=503, json={"error": {"code": 503, "message": "backend"}})
    rsps.get(f"{CE}/aggregated/acceleratorTypes", json=fixture("gcp", "accelerator_types.json"))
    sleeps = Sleeps()
    results = collect(db, sleeps)
    catalog = results["gcp-catalog"]
    assert catalog.status == "failed"
    assert "gcp: compute.machineTypes.aggregatedList failed: still failing after 3 attempts" in catalog.note
    assert len(sleeps) == 2
    assert results["gcp-prices"].status == "failed"
    assert prices(db) == []


def test_malformed_response_is_a_collector_error(db: Database, rsps: responses.RequestsMock) -> None:
    rsps.get(f"{CE}/aggregated/machineTypes", body="<html>proxy error</html>", content_type="text/html")
    results = collect(db)
    assert results["gcp-catalog"].status == "failed"
    assert "compute.machineTypes.aggregatedList" in results["gcp-catalog"].note


def test_empty_region_collects_nothing(db: Database, rsps: responses.RequestsMock) -> None:
    add_gcp_defaults(rsps)
    results = collect(db, regions=("asia-south2",))
    assert {k: (r.status, r.records) for k, r in results.items()} == {
        "gcp-catalog": ("ok", 0),
        "gcp-prices": ("ok", 0),
    }


def test_gpu_filter(db: Database, rsps: responses.RequestsMock) -> None:
    add_gcp_defaults(rsps)
    collect(db, gpus=("L4",))
    assert {p[0] for p in prices(db)} == {"g2-standard-8"}


def test_gpu_key_matches_both_spellings() -> None:
    assert gpu_key("nvidia-h100-mega-80gb") == gpu_key("H100 80GB Mega")
    assert gpu_key("nvidia-tesla-v100") == gpu_key("Tesla V100")
    assert gpu_key("nvidia-a100-80gb") != gpu_key("Tesla A100")


def _sku(page: dict[str, Any], description: str) -> dict[str, Any]:
    (found,) = [s for s in page["skus"] if s["description"] == description]
    result: dict[str, Any] = found
    return result


def test_two_skus_pricing_the_same_part_differently_are_rejected_not_overwritten(
    db: Database, rsps: responses.RequestsMock
) -> None:
    serve_compute(rsps)
    page = fixture("gcp", "skus_page1.json")
    rival = json.loads(json.dumps(_sku(page, "Nvidia L4 GPU running in Americas")))
    rival["skuId"] = "FFFF-0000-0001"
    rival["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]["nanos"] += 100_000_000
    twin = json.loads(json.dumps(_sku(page, "G2 Instance Core running in Americas")))
    twin["skuId"] = "FFFF-0000-0002"  # the same price again: no conflict
    page["skus"] += [rival, twin]
    serve_skus(rsps, page)
    result = collect(db)["gcp-prices"]

    assert result.status == "ok"
    assert "conflicting SKU ×1" in result.note and "conflicting gpu SKU for l4 ×1" in result.note
    names = {(name, kind) for name, kind, _, _ in prices(db)}
    assert ("g2-standard-8", "on-demand") not in names  # neither price is trusted
    assert ("g2-standard-8", "spot") in names


def test_a_sku_without_effective_time_is_rejected(db: Database, rsps: responses.RequestsMock) -> None:
    serve_compute(rsps)
    page = fixture("gcp", "skus_page1.json")
    del _sku(page, "Spot Preemptible Nvidia L4 GPU running in Americas")["pricingInfo"][0]["effectiveTime"]
    serve_skus(rsps, page)
    result = collect(db)["gcp-prices"]

    assert "no effective time ×1" in result.note
    names = {(name, kind) for name, kind, _, _ in prices(db)}
    assert ("g2-standard-8", "spot") not in names and ("g2-standard-8", "on-demand") in names
