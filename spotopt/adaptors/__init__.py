"""Lazy imports of the cloud SDKs and client factories (the single seam tests replace).

Importing ``spotopt`` (or running reports and policies) must not import boto3, google-cloud or
azure: each adaptor imports its SDK on first use. Credentials come only from each SDK's default
chain and are never stored or logged by spotopt.
"""

from __future__ import annotations

import importlib
from typing import Any

from spotopt import pip_install_hint
from spotopt.cloud_calls import MissingCredentials

# The modules each cloud's adaptor imports, installed by the extra of the same name
# (``pip install "spotopt-gpu[aws]"``); the collectors need all of them.
SDK_MODULES = {
    "aws": ("boto3", "botocore", "requests"),
    "gcp": ("google.auth", "google.cloud.compute_v1", "google.cloud.billing_v1"),
    "azure": (
        "azure.identity",
        "azure.mgmt.compute",
        "azure.mgmt.network",
        "azure.mgmt.resourcegraph",
        "requests",
    ),
}


def require_sdk(cloud: str) -> None:
    """Import ``cloud``'s SDK now; if it is not installed, raise ``MissingCredentials`` with the
    ``pip install`` that fixes it, so the cloud is skipped like one without credentials."""
    for module in SDK_MODULES[cloud]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingCredentials(
                cloud, f"install the {cloud} SDK ({module} is missing): {pip_install_hint(cloud)}"
            ) from None


def client_factory(cloud: str) -> Any:
    """The production client factory of ``cloud`` (``aws``, ``gcp`` or ``azure``); raises
    ``MissingCredentials`` naming the extra to install when the cloud's SDK is missing."""
    if cloud in SDK_MODULES:
        require_sdk(cloud)
    if cloud == "aws":
        from spotopt.adaptors.aws import AwsClients

        return AwsClients()
    if cloud == "gcp":
        from spotopt.adaptors.gcp import GcpClients

        return GcpClients()
    if cloud == "azure":
        from spotopt.adaptors.azure import AzureClients

        return AzureClients()
    raise ValueError(f"no client factory for cloud {cloud!r}")
