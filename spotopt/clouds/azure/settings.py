"""Azure's section of ``spotopt.settings.Settings``: a leaf that imports nothing of spotopt,
so that base module can compose it without the cloud's code (``.importlinter`` checks it)."""

from __future__ import annotations

from pydantic import BaseModel


class AzureSettings(BaseModel):
    """Azure: the provider's resource group, subnet, image and identity."""

    azure_resource_group: str | None = None
    """Resource group the Azure provider creates VMs and NICs in; required to launch on Azure."""

    azure_subnet_id: str | None = None
    """Resource id of the subnet the VMs' NICs join (``/subscriptions/…/virtualNetworks/V/subnets/S``);
    required to launch on Azure."""

    azure_image: str | None = None
    """VM image: a URN ``publisher:offer:sku:version`` or an image / gallery image version resource
    id; required to launch on Azure."""

    azure_identity_id: str | None = None
    """Resource id of the user-assigned managed identity the VMs (and the agent) run as: the
    agent's credentials for the store; required to launch on Azure."""

    azure_admin_username: str = "spotopt"
    """Linux admin user of the VMs."""

    azure_ssh_public_key: str | None = None
    """OpenSSH public key for the admin user (ssh-rsa of at least 2048 bits, or ED25519); unset: a
    throwaway ssh-rsa key nobody holds."""
