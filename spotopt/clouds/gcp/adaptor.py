"""google-cloud-compute and google-cloud-billing clients for the GCP collectors and provider.

Credentials come from Application Default Credentials (``gcloud auth application-default
login``, ``GOOGLE_APPLICATION_CREDENTIALS`` or the metadata server). The Billing Catalog is
public and also accepts an API key (``SPOTOPT_GCP_API_KEY``), so prices can be collected
without a project. The billing client uses the REST transport: one HTTP stack for all GCP calls.
Each method below is exactly one HTTP request with the SDK's own retry off (``retry=None``; its
default retries 503 for up to 10 minutes), so the collectors' bounded retry is the only one.
"""

from __future__ import annotations

import os
from typing import Any

from spotopt.cloud_calls import MissingCredentials

API_KEY_ENV = "SPOTOPT_GCP_API_KEY"
CREDENTIALS_HINT = (
    "configure Application Default Credentials (gcloud auth application-default login or "
    "GOOGLE_APPLICATION_CREDENTIALS) and a project (GOOGLE_CLOUD_PROJECT)"
)
COMPUTE_ENGINE_SERVICE = "services/6F81-5844-456A"


class GcpClients:
    """``credentials``/``project`` are for tests; by default both come from ADC on first use."""

    def __init__(
        self, credentials: Any | None = None, project: str | None = None, api_key: str | None = None
    ) -> None:
        self._credentials = credentials
        self._project = project
        self._api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self._clients: dict[str, Any] = {}

    def _adc(self) -> Any:
        if self._credentials is None:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError

            try:
                creds, project = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/cloud-platform"]
                )
            except DefaultCredentialsError as exc:
                raise MissingCredentials("gcp", CREDENTIALS_HINT) from exc
            self._credentials = creds
            self._project = self._project or project
        return self._credentials

    def project(self) -> str:
        self._adc()
        project = self._project or os.environ.get("GOOGLE_CLOUD_PROJECT")
        if not project:
            raise MissingCredentials("gcp", "set GOOGLE_CLOUD_PROJECT (the project whose quotas apply)")
        return project

    def _compute(self, kind: str) -> Any:
        if kind not in self._clients:
            from google.cloud import compute_v1

            cls = {
                "machine": compute_v1.MachineTypesClient,
                "accel": compute_v1.AcceleratorTypesClient,
                "instances": compute_v1.InstancesClient,
                "operations": compute_v1.ZoneOperationsClient,
            }
            self._clients[kind] = cls[kind](credentials=self._adc())
        return self._clients[kind]

    def machine_types_page(self, page_token: str) -> Any:
        """One page of ``machineTypes.aggregatedList`` (scopes ``zones/<zone>`` → machine types)."""
        from google.cloud import compute_v1

        request = compute_v1.AggregatedListMachineTypesRequest(
            project=self.project(), max_results=500, page_token=page_token
        )
        return next(iter(self._compute("machine").aggregated_list(request=request, retry=None).pages))

    def accelerator_types_page(self, page_token: str) -> Any:
        """One page of ``acceleratorTypes.aggregatedList`` (which GPUs each zone offers)."""
        from google.cloud import compute_v1

        request = compute_v1.AggregatedListAcceleratorTypesRequest(
            project=self.project(), max_results=500, page_token=page_token
        )
        return next(iter(self._compute("accel").aggregated_list(request=request, retry=None).pages))

    def skus_page(self, page_token: str) -> Any:
        """One page of the Compute Engine SKUs of the Cloud Billing Catalog, prices in USD."""
        from google.cloud import billing_v1

        if "billing" not in self._clients:
            if self._api_key and self._credentials is None:
                client = billing_v1.CloudCatalogClient(
                    transport="rest", client_options={"api_key": self._api_key}
                )
            else:
                client = billing_v1.CloudCatalogClient(transport="rest", credentials=self._adc())
            self._clients["billing"] = client
        request = billing_v1.ListSkusRequest(
            parent=COMPUTE_ENGINE_SERVICE, currency_code="USD", page_size=5000, page_token=page_token
        )
        return next(iter(self._clients["billing"].list_skus(request=request, retry=None).pages))

    # -- the provider's calls (spotopt.clouds.gcp.provider) ------------------------------------------

    def insert_instance(self, zone: str, body: dict[str, Any], request_id: str) -> Any:
        """``instances.insert``: the zone ``Operation`` (``request_id`` makes a retry a no-op)."""
        from google.cloud import compute_v1

        return self._compute("instances").insert_unary(
            request=compute_v1.InsertInstanceRequest(
                project=self.project(),
                zone=zone,
                instance_resource=compute_v1.Instance(body),
                request_id=request_id,
            ),
            retry=None,
        )

    def get_instance(self, zone: str, name: str) -> Any:
        """``instances.get``; raises ``google.api_core.exceptions.NotFound`` for no such instance."""
        return self._compute("instances").get(project=self.project(), zone=zone, instance=name, retry=None)

    def delete_instance(self, zone: str, name: str, request_id: str) -> Any:
        """``instances.delete``: the zone ``Operation``; ``NotFound`` when it is already gone."""
        from google.cloud import compute_v1

        return self._compute("instances").delete_unary(
            request=compute_v1.DeleteInstanceRequest(
                project=self.project(), zone=zone, instance=name, request_id=request_id
            ),
            retry=None,
        )

    def wait_operation(self, zone: str, name: str) -> Any:
        """``zoneOperations.wait``: returns when the operation is DONE or after about 2 minutes."""
        return self._compute("operations").wait(project=self.project(), zone=zone, operation=name, retry=None)

    def zone_operations_page(self, zone: str, flt: str, page_token: str) -> Any:
        """One page of ``zoneOperations.list`` matching ``flt`` (kept by GCP for a limited time)."""
        from google.cloud import compute_v1

        request = compute_v1.ListZoneOperationsRequest(
            project=self.project(), zone=zone, filter=flt, max_results=500, page_token=page_token
        )
        return next(iter(self._compute("operations").list(request=request, retry=None).pages))

    def instances_page(self, flt: str, page_token: str) -> Any:
        """One page of ``instances.aggregatedList`` (scopes ``zones/<zone>``) matching ``flt``."""
        from google.cloud import compute_v1

        request = compute_v1.AggregatedListInstancesRequest(
            project=self.project(), filter=flt, max_results=500, page_token=page_token
        )
        return next(iter(self._compute("instances").aggregated_list(request=request, retry=None).pages))

    def offering_page(self, kind: str, flt: str, page_token: str) -> Any:
        """One page of the machine (``kind="machine"``) or accelerator (``"accel"``) types'
        aggregated list matching ``flt``: which zones offer a type."""
        from google.cloud import compute_v1

        cls = (
            compute_v1.AggregatedListMachineTypesRequest
            if kind == "machine"
            else compute_v1.AggregatedListAcceleratorTypesRequest
        )
        request = cls(project=self.project(), filter=flt, max_results=500, page_token=page_token)
        return next(iter(self._compute(kind).aggregated_list(request=request, retry=None).pages))
