"""Settings: one object, read from ``SPOTOPT_*`` environment variables.

Precedence for the database URL: ``--db URL`` on the command line, else ``SPOTOPT_DB_URL``,
else a SQLite file in the user's data directory (``platformdirs.user_data_dir("spotopt")``).
"""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from spotopt.errors import ConfigError


def default_db_url() -> str:
    """The embedded default: a SQLite file that needs no server and no set-up."""
    path = Path(platformdirs.user_data_dir("spotopt")) / "spotopt.sqlite"
    return f"sqlite:///{path}"


class Settings(BaseSettings):
    """Every user-facing setting. Each field's docstring is its documentation: the settings reference
    (docs/reference/settings.md) is generated from them."""

    model_config = SettingsConfigDict(env_prefix="SPOTOPT_", extra="ignore")

    db_url: str | None = None
    """SQLAlchemy URL of the history database (``sqlite:///PATH`` or ``postgresql://USER@HOST/DB``);
    ``--db URL`` wins over it; unset: ``sqlite:///<user data dir>/spotopt.sqlite``."""

    auto_migrate: bool = True
    """On SQLite, apply pending migrations automatically (under a lock) when spotopt opens the
    database; PostgreSQL operators run ``spotopt db upgrade``."""

    # -- AWS provider and the instances' start-up script (docs/guides/clouds.md) ---------------
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

    bootstrap_python: str = "python3"
    """Interpreter on the image that creates ``bootstrap_venv`` when it does not exist yet."""

    bootstrap_venv: str = "/opt/spotopt/venv"
    """Virtualenv the job runs in (created if missing); its ``bin`` comes first on ``PATH``."""

    bootstrap_install: bool = True
    """Install on each instance the daemon's own wheel and dependency lock, shipped through the
    checkpoint store and checked by sha256 (``spotopt.clouds.common.artifacts``); false: the image
    already has this spotopt in ``bootstrap_venv``."""

    bootstrap_wheel: str | None = None
    """A ``.whl`` of the daemon's own distribution (same name and version) to ship; a requirement
    name is refused; unset: built from the installed distribution."""

    bootstrap_lock: str | None = None
    """A requirements file pinning every dependency with ``==`` and ``--hash=sha256:``, its versions
    the daemon's; unset: the lock the distribution ships for the store's extra
    (``data/locks/instance-<extra>.txt``)."""

    bootstrap_index_url: str | None = None
    """Index the instances install the locked requirements from (a private mirror); hashes are
    still required; unset: PyPI."""

    bootstrap_pip_spec: str | None = None
    """Retired (it let an index choose what instances run): any value is refused by ``check_bootstrap``."""

    bootstrap_workdir: str = "/opt/spotopt/work"
    """Directory the job's command runs in on the instance when the job names none."""

    bootstrap_shutdown: bool = True
    """Power the instance off when the job's command ends, so an idle instance stops costing (on
    AWS this terminates it)."""

    # -- GCP provider (spotopt/clouds/gcp/provider.py) ----------------------------------------------
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

    # -- Azure provider (spotopt/clouds/azure/provider.py) -------------------------------------------
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

    # -- the dashboard (docs/guides/dashboard.md) ---------------------------------------------
    ui_token: SecretStr | None = None
    """Token every request to ``spotopt ui`` must carry; required to serve on any address but
    loopback; unset: ``spotopt ui`` serves loopback only, with no token."""

    def require(self, name: str, what: str) -> str:
        """The value of the string setting ``name``; unset or blank is a ``ConfigError`` naming the
        setting, its environment variable and ``what`` it should hold, before any cloud call."""
        value = getattr(self, name)
        if value is None or not str(value).strip():
            raise ConfigError(f"{name} is not set: set SPOTOPT_{name.upper()} to {what}")
        return str(value).strip()

    def check_bootstrap(self) -> None:
        """The start-up script's settings can only install the daemon's own code; a one-line
        ``ConfigError`` naming the setting otherwise (checked before any cloud call)."""
        if self.bootstrap_pip_spec is not None and self.bootstrap_pip_spec.strip():
            raise ConfigError(
                f"bootstrap_pip_spec: {self.bootstrap_pip_spec!r} would install whatever an index serves "
                "under that name; unset SPOTOPT_BOOTSTRAP_PIP_SPEC: instances now install the daemon's own "
                "wheel and lock (SPOTOPT_BOOTSTRAP_WHEEL, SPOTOPT_BOOTSTRAP_LOCK)"
            )
        wheel = (self.bootstrap_wheel or "").strip()
        if wheel and not wheel.endswith(".whl"):
            raise ConfigError(
                f"bootstrap_wheel: {wheel!r} is a requirement, not a wheel file; instances install only the "
                "daemon's own distribution: give the path of its .whl or unset SPOTOPT_BOOTSTRAP_WHEEL"
            )

    def resolved_db_url(self, override: str | None = None) -> str:
        """``--db`` if given, else ``SPOTOPT_DB_URL``, else the default; ``--db ""`` is refused
        rather than quietly meaning the default database."""
        if override is not None and not override.strip():
            raise ConfigError("--db: the URL is empty; give sqlite:///PATH or postgresql://USER@HOST/DB")
        return override or self.db_url or default_db_url()

    def is_default_db(self, override: str | None = None) -> bool:
        """True when neither ``--db`` nor ``SPOTOPT_DB_URL`` names a database."""
        return not override and not self.db_url
