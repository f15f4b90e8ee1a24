"""azure-mgmt-compute / -network / -resourcegraph clients and the public Retail Prices API.

Credentials come from ``DefaultAzureCredential`` (environment, workload or managed identity,
Azure CLI login …) and the subscription from ``AZURE_SUBSCRIPTION_ID``. The Retail Prices API
needs neither. SDK retries are off (``retry_total=0``): the collectors' bounded retry decides.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from spotopt.cloud_calls import MissingCredentials
from spotopt.clouds.common.http import HttpJson

CREDENTIALS_HINT = (
    "configure Azure credentials (az login, AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET or a "
    "managed identity) and set AZURE_SUBSCRIPTION_ID"
)
RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"
RETAIL_API_VERSION = "2023-01-01-preview"


class AzureClients:
    """``credential``/``subscription_id`` are for tests; by default both come from the environment."""

    def __init__(
        self,
        credential: Any | None = None,
        subscription_id: str | None = None,
        http: HttpJson | None = None,
    ) -> None:
        self._credential = credential
        self._subscription = subscription_id
        self._clients: dict[str, Any] = {}
        self.http = http or HttpJson()

    def _auth(self) -> tuple[Any, str]:
        subscription = self._subscription or os.environ.get("AZURE_SUBSCRIPTION_ID")
        if not subscription:
            raise MissingCredentials("azure", CREDENTIALS_HINT)
        if self._credential is None:
            from azure.identity import DefaultAzureCredential

            self._credential = DefaultAzureCredential()
        return self._credential, subscription

    def compute(self) -> Any:
        if "compute" not in self._clients:
            from azure.mgmt.compute import ComputeManagementClient

            credential, subscription = self._auth()
            self._clients["compute"] = ComputeManagementClient(credential, subscription, retry_total=0)
        return self._clients["compute"]

    def network(self) -> Any:
        if "network" not in self._clients:
            from azure.mgmt.network import NetworkManagementClient

            credential, subscription = self._auth()
            self._clients["network"] = NetworkManagementClient(credential, subscription, retry_total=0)
        return self._clients["network"]

    def subscription(self) -> str:
        return self._auth()[1]

    # -- the provider's calls (spotopt.clouds.azure.provider) -----------------------------------------
    # Bodies sent and answers returned are the ARM REST JSON (``rest_json``), whatever SDK
    # version is installed. Each ``begin_*`` is one long-running operation: the PUT or DELETE,
    # then the ``Azure-AsyncOperation`` status polled every ``poll_s`` seconds until it ends.

    def create_nic(self, group: str, name: str, body: dict[str, Any], poll_s: float) -> dict[str, Any]:
        poller = self.network().network_interfaces.begin_create_or_update(
            group, name, body, polling_interval=poll_s
        )
        return rest_json(poller.result())

    def get_nic(self, group: str, name: str) -> dict[str, Any]:
        """The NIC; ``ResourceNotFoundError`` if none."""
        return rest_json(self.network().network_interfaces.get(group, name))

    def delete_nic(self, group: str, name: str, poll_s: float) -> None:
        self.network().network_interfaces.begin_delete(group, name, polling_interval=poll_s).result()

    def list_nics(self, group: str) -> list[dict[str, Any]]:
        """Every NIC of the resource group (all pages)."""
        return [rest_json(nic) for nic in self.network().network_interfaces.list(group)]

    def create_vm(self, group: str, name: str, body: dict[str, Any], poll_s: float) -> dict[str, Any]:
        poller = self.compute().virtual_machines.begin_create_or_update(
            group, name, body, polling_interval=poll_s
        )
        return rest_json(poller.result())

    def get_vm(self, group: str, name: str) -> dict[str, Any]:
        """The VM with its instance view (power state); ``ResourceNotFoundError`` if none."""
        return rest_json(self.compute().virtual_machines.get(group, name, expand="instanceView"))

    def delete_vm(self, group: str, name: str, poll_s: float) -> None:
        self.compute().virtual_machines.begin_delete(group, name, polling_interval=poll_s).result()

    def list_vms(self, group: str) -> list[dict[str, Any]]:
        """Every VM of the resource group (all pages)."""
        return [rest_json(vm) for vm in self.compute().virtual_machines.list(group)]

    def resource_skus_page(self, location: str | None, token: str | None) -> tuple[list[Any], str | None]:
        """One page of ``resourceSkus.list`` (optionally for one location) and the next-page token."""
        flt = f"location eq '{location}'" if location else None
        pages = self.compute().resource_skus.list(filter=flt).by_page(continuation_token=token)
        items = list(next(pages))
        return items, pages.continuation_token

    def resource_graph(self, query: str, skip_token: str | None) -> Any:
        """One page of an Azure Resource Graph query over the caller's subscriptions."""
        from azure.mgmt.resourcegraph.models import QueryRequest, QueryRequestOptions

        if "graph" not in self._clients:
            from azure.mgmt.resourcegraph import ResourceGraphClient

            credential, _ = self._auth()
            self._clients["graph"] = ResourceGraphClient(credential, retry_total=0)
        options = QueryRequestOptions(result_format="objectArray", top=1000, skip_token=skip_token)
        return self._clients["graph"].resources(QueryRequest(query=query, options=options))

    def retail_page(self, url: str | None, flt: str) -> dict[str, Any]:
        """One page of the Retail Prices API: the first for ``flt``, or the ``NextPageLink`` ``url``."""
        if url is None:
            body, _ = self.http.get(RETAIL_PRICES_URL, {"api-version": RETAIL_API_VERSION, "$filter": flt})
        else:
            body, _ = self.http.get(url)
        if not isinstance(body, dict):
            raise ValueError("Retail Prices response is not a JSON object")
        return body


def rest_json(model: Any) -> dict[str, Any]:
    """An azure-mgmt answer as the ARM REST JSON (``{"name", "tags", "properties": {…}}``).

    The TypeSpec-generated models of the newer SDKs (azure-mgmt-compute 38, azure-mgmt-network
    31 and later) are mutable mappings of that JSON (``as_dict()``); the msrest models of the
    older ones are objects with snake_case attributes that ``serialize(keep_readonly=True)``
    turns into it (read-only fields such as ``id``, ``name`` and ``provisioningState`` kept).
    Reading one shape only would break on half of the versions the ``azure`` extra allows."""
    if isinstance(model, dict):
        return model
    if isinstance(model, Mapping):
        return dict(model.as_dict()) if hasattr(model, "as_dict") else dict(model)
    serialized: dict[str, Any] = model.serialize(keep_readonly=True)
    return serialized
