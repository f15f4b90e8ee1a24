"""GCP's section of ``spotopt.settings.Settings``: a leaf that imports nothing of spotopt,
so that base module can compose it without the cloud's code (``.importlinter`` checks it)."""

from __future__ import annotations

from pydantic import BaseModel


class GcpSettings(BaseModel):
    """GCP: the provider's project, image, service account and network."""

    gcp_project: str | None = None
    """Project the GCP provider launches in; unset: the ADC project or ``GOOGLE_CLOUD_PROJECT``."""

    gcp_image: str | None = None
    """Boot image of GCP instances (``projects/P/global/images/NAME`` or ``…/images/family/F``, e.g.
    ``projects/debian-cloud/global/images/family/debian-12``); required to launch on GCP."""

    gcp_service_account: str | None = None
    """Service account email the instances run as: the agent's only credentials for the store;
    required to launch on GCP."""

    gcp_network: str | None = None
    """VPC network of GCP instances (``global/networks/NAME``); unset: the default network."""

    gcp_subnetwork: str | None = None
    """Subnetwork (``regions/REGION/subnetworks/NAME``); needed for custom-mode networks."""

    gcp_external_ip: bool = True
    """Give instances an ephemeral external IP (their way to PyPI and the store without Cloud NAT);
    false needs Cloud NAT, or an image with spotopt and Private Google Access."""
