"""AWS's section of ``spotopt.settings.Settings``: a leaf that imports nothing of spotopt,
so that base module can compose it without the cloud's code (``.importlinter`` checks it)."""

from __future__ import annotations

from pydantic import BaseModel


class AwsSettings(BaseModel):
    """AWS: the provider's image, instance profile and network."""

    aws_image_id: str | None = None
    """AMI the AWS provider launches (``ami-…``, or ``resolve:ssm:/PARAMETER``: EC2 resolves an SSM
    parameter, one AMI per region); required to launch on AWS."""

    aws_instance_profile: str | None = None
    """Instance profile (name or ARN) whose role gives the instance its checkpoint-store access;
    required to launch on AWS."""

    aws_subnet_id: str | None = None
    """Subnet to launch into; it must be in the market's zone (optional: the default VPC's subnet of
    the market's zone otherwise)."""

    aws_security_group_ids: str | None = None
    """Comma-separated security group ids (optional: the VPC's default group otherwise)."""

    aws_key_name: str | None = None
    """EC2 key pair for ssh (optional: spotopt itself never logs in)."""

    aws_endpoint_url: str | None = None
    """EC2 endpoint override (tests point it at moto's server); unset means AWS's own endpoint."""
