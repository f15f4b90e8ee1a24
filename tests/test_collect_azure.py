"""Azure collectors against ``responses`` and a fake TokenCredential."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import responses
from sqlalchemy import select

from spotopt.clouds.azure.adaptor import AzureClients
from spotopt.clouds.azure.collectors import eviction_upper_bound, gpu_of_size
from spotopt.db.engine import Database
from spotopt.db.models import InstanceType, Interruption, Market, PricePoint, Run
from spotopt.history.collect import CollectRequest, ScopeResult, run_collect
from tests.collect_fakes import (
    GRAPH_URL,
    NOW,
    RESOURCE_SKUS_URL,
    RETAIL_NEXT_URL,
    RETAIL_URL,
    Sleeps,
    add_azure_defaults,
    azure_clients,
    fixture,
    no_wait_retry,
    paged,
)


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def collect(
    db: Database, sleeps: Sleeps | None = None, clients: Any = None, **request: Any
) -> dict[str, ScopeResult]:
    now = request.pop("now", NOW)
    results = run_collect(
        db,
        CollectRequest(clouds=("azure",), **request),
        lambda cloud: clients or azure_clients(),
        retry=no_wait_retry(sleeps),
        now=now,
    )
    return {f"{r.collector}/{r.scope}": r for r in results}


def prices(db: Database, source: str) -> list[tuple[str, str, str, float]]:
    with db.session() as s:
        rows = s.execute(
            select(InstanceType.name, Market.kind, PricePoint.observed_at, PricePoint.usd_per_hour)
            .join(Market, Market.instance_type_id == InstanceType.id)
            .join(PricePoint, PricePoint.market_id == Market.id)
            .where(PricePoint.source == source)
            .order_by(InstanceType.name, Market.kind, PricePoint.observed_at)
        )
        return [(n, k, t.date().isoformat(), p) for n, k, t, p in rows]


def test_collect_all_azure_collectors(db: Database, rsps: responses.RequestsMock) -> None:
    add_azure_defaults(rsps)
    results = collect(db)
    assert {k: r.status for k, r in results.items()} == {
        "azure-catalog/global": "ok",
        "azure-prices/eastus": "ok",  # regions: where the subscription offers GPU sizes
        "azure-eviction-rates/global": "ok",
        "azure-spot-history/global": "ok",
    }
    catalog = results["azure-catalog/global"]
    assert catalog.unknown == ["Standard_NQ8_v1 (Standard_NQ8_v1)", "Standard_NX12ads_Q99_v9 (Q99)"]
    assert "malformed item ×1" in catalog.note  # vCPUs "many"
    with db.session() as s:
        nq = s.scalar(select(InstanceType).where(InstanceType.name == "Standard_NQ8_v1"))
        assert nq is not None and (nq.gpu_model, nq.gpu_count, nq.vcpus, nq.memory_gib) == (None, 2, 8, 56)
        evictions = s.execute(
            select(InstanceType.name, Interruption.region, Interruption.value, Interruption.raw)
            .join(InstanceType, InstanceType.id == Interruption.instance_type_id)
            .order_by(InstanceType.name)
        ).all()
    # Retail: Low Priority and Windows rejected, the D-series (no GPU) skipped, a bad price rejected.
    assert prices(db, "azure-prices") == [
        ("Standard_NC24ads_A100_v4", "on-demand", "2026-11-01", 3.673),
        ("Standard_NC24ads_A100_v4", "spot", "2026-11-01", 1.1019),
        ("Standard_NC4as_T4_v3", "on-demand", "2026-11-01", 0.526),
        ("Standard_NC4as_T4_v3", "spot", "2026-11-01", 0.1578),
    ]
    retail = results["azure-prices/eastus"]
    assert retail.rejected == 3 and "Low Priority ×1" in retail.note and "malformed item ×1" in retail.note
    # Resource Graph, paged with $skipToken; an unparsable bucket is rejected.
    assert evictions == [
        ("Standard_NC24ads_A100_v4", "eastus", 100.0, "20+"),
        ("Standard_NC4as_T4_v3", "eastus", 5.0, "0-5"),
    ]
    assert results["azure-eviction-rates/global"].rejected == 1
    # Linux spot history only; a negative price is rejected.
    assert prices(db, "azure-spot-history") == [
        ("Standard_NC4as_T4_v3", "spot", "2026-10-01", 0.1631),
        ("Standard_NC4as_T4_v3", "spot", "2026-11-01", 0.1578),
    ]
    graph_bodies = [json.loads(c.request.body) for c in rsps.calls if c.request.url.startswith(GRAPH_URL)]
    assert [b.get("options", {}).get("$skipToken") for b in graph_bodies][:2] == [None, "ev-2"]
    assert "standard_nc4as_t4_v3" in graph_bodies[0]["query"]
    assert all(
        c.request.headers.get("Authorization") == "Bearer fake-token"
        for c in rsps.calls
        if "management" in c.request.url
    )


def test_twice_over_the_same_prices_inserts_nothing(db: Database, rsps: responses.RequestsMock) -> None:
    add_azure_defaults(rsps)
    collect(db)
    before = prices(db, "azure-prices")
    again = collect(db, now=NOW + timedelta(hours=3))
    assert again["azure-prices/eastus"].inserted == 0
    assert again["azure-spot-history/global"].inserted == 0
    assert again["azure-eviction-rates/global"].inserted == 2  # a new hourly snapshot
    assert prices(db, "azure-prices") == before


def test_retail_prices_need_no_credentials_with_region(db: Database, rsps: responses.RequestsMock) -> None:
    add_azure_defaults(rsps)
    results = collect(db, clients=AzureClients(), regions=("eastus",))
    assert results["azure-prices/eastus"].status == "ok"
    for name in ("azure-catalog/global", "azure-eviction-rates/global"):
        assert results[name].status == "skipped"
        assert results[name].note.startswith("configure Azure credentials")
    assert len(prices(db, "azure-prices")) == 4  # the bundled catalog knows both sizes


def test_no_credentials_and_no_region_says_what_to_configure(db: Database) -> None:
    # Azure was asked for by name and every scope was skipped: that is a failure, not a quiet skip.
    results = collect(db, clients=AzureClients())
    assert {r.status for r in results.values()} == {"failed"}
    note = results["azure-prices/regions"].note
    assert note.startswith("configure Azure credentials") and "to collect on-demand and spot prices" in note
    assert note.endswith("(azure was asked for by name and collected nothing)")
    with db.session() as s:
        assert set(s.scalars(select(Run.status))) == {"failed"}


def test_credentials_the_cloud_rejects_fail_the_scope(db: Database, rsps: responses.RequestsMock) -> None:
    add_azure_defaults(rsps)
    rsps.replace(
        responses.GET,
        RESOURCE_SKUS_URL,
        status=401,
        json={"error": {"code": "InvalidAuthenticationToken", "message": "The access token is invalid."}},
    )
    sleeps = Sleeps()
    results = collect(db, sleeps, regions=("eastus",))
    catalog = results["azure-catalog/global"]
    assert catalog.status == "failed"
    assert catalog.note.startswith(
        "azure: compute.resourceSkus.list failed: credentials rejected: ClientAuthenticationError"
    )
    assert sleeps == [] and results["azure-prices/eastus"].status == "ok"
    with db.session() as s:
        run = s.scalar(select(Run).where(Run.source == "azure-catalog"))
        assert run is not None and run.status == "failed" and "credentials rejected" in (run.error or "")


def test_throttling_then_success_and_5xx_exhausting(db: Database, rsps: responses.RequestsMock) -> None:
    throttled = {"n": 0}

    def retail(request: Any) -> tuple[int, dict[str, str], str]:
        throttled["n"] += 1
        if throttled["n"] == 1:
            return 429, {"Retry-After": "1"}, "{}"
        return 200, {}, json.dumps(fixture("azure", "retail_page1.json"))

    rsps.add_callback(responses.GET, RETAIL_URL, callback=retail, content_type="application/json")
    rsps.get(RETAIL_NEXT_URL, json=fixture("azure", "retail_page2.json"))
    skus = paged("resource_skus_page1.json", "resource_skus_page2.json", "azure", "skiptoken=page2")
    rsps.add_callback(responses.GET, RESOURCE_SKUS_URL, callback=skus, content_type="application/json")
    rsps.post(GRAPH_URL, status=503, json={"error": {"code": "ServiceUnavailable", "message": "busy"}})
    sleeps = Sleeps()
    results = collect(db, sleeps)
    assert results["azure-prices/eastus"].status == "ok"
    assert len(prices(db, "azure-prices")) == 4
    graph = results["azure-eviction-rates/global"]
    assert graph.status == "failed" and "azure: resourcegraph.resources failed: still failing" in graph.note
    assert sleeps == [0.5, 0.5, 1.0, 0.5, 1.0]  # retail once; two graph collectors, 3 attempts each


def test_malformed_retail_page(db: Database, rsps: responses.RequestsMock) -> None:
    rsps.get(RETAIL_URL, json={"Message": "not a page"})
    results = collect(db, clients=AzureClients(), regions=("eastus",))
    retail = results["azure-prices/eastus"]
    assert (retail.status, retail.rejected) == ("ok", 1) and "malformed page" in retail.note


def test_empty_region(db: Database, rsps: responses.RequestsMock) -> None:
    rsps.get(RETAIL_URL, json={"Items": [], "NextPageLink": None, "Count": 0})
    results = collect(db, clients=AzureClients(), regions=("brazilsoutheast",))
    assert (
        results["azure-prices/brazilsoutheast"].status,
        results["azure-prices/brazilsoutheast"].records,
    ) == (
        "ok",
        0,
    )


@pytest.mark.parametrize(("bucket", "bound"), [("0-5", 5.0), ("10-15", 15.0), ("20+", 100.0), ("n/a", None)])
def test_eviction_upper_bound(bucket: str, bound: float | None) -> None:
    assert eviction_upper_bound(bucket) == bound


def test_gpu_of_size() -> None:
    assert gpu_of_size("Standard_NC24ads_A100_v4") == (None, "A100")  # 40 or 80 GB: ambiguous
    assert gpu_of_size("Standard_NC4as_T4_v3") == ("T4", "T4")
    assert gpu_of_size("Standard_NV6") == (None, "Standard_NV6")
