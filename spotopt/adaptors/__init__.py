"""Lazy imports of the cloud SDKs and client factories (the single seam tests replace).

Importing ``spotopt`` (or running reports and policies) must not import boto3, google-cloud or
azure: each adaptor imports its SDK on first use. Credentials come only from each SDK's default
chain and are never stored or logged by spotopt.
"""

from __future__ import annotations

from typing import Any


def client_factory(cloud: str) -> Any:
    """The production client factory of ``cloud`` (``aws``, ``gcp`` or ``azure``)."""
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
