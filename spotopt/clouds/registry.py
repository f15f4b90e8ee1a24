"""The one registry of clouds: each cloud is one ``Cloud`` entry naming what lives in its folder.

A cloud's code lives in ``spotopt/clouds/<cloud>/`` (its SDK adaptor, provider, billing rule,
notice poller, collectors and settings section); this module says, per cloud, where each piece is
and what differs between clouds (the start-up script's delivery, the metadata service, the SDK
modules and the billing rule). The settings section is the one piece named elsewhere: a base class
of ``spotopt.settings.Settings``, which a type checker must see.
Adding a cloud is that folder and one ``CLOUDS.add`` line here (docs/guides/add-a-cloud.md).

Importing this module stays cheap: it must not import a cloud SDK, the database or a provider
(the agent imports it on the instance to choose its notice poller). Providers, client factories
pollers and billing rules are named by ``"module:attribute"``, collector modules by name, and
imported only when used, so this module imports nothing of a cloud's folder (the shared code of
``spotopt.clouds.common`` imports it, the folders import that: no cycle).

Providers are registered by the same kebab-case names (``get_provider``), plus ``clouds``, which
routes each placement to its market's cloud (``spotopt.clouds.common.router``). Collectors are
registered by their own names in ``COLLECTORS``, here rather than beside their interface
(``spotopt.collectors.base``), because loading them means knowing the clouds.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spotopt.errors import ConfigError
from spotopt.registry import Registry

if TYPE_CHECKING:
    from spotopt.clouds.common.base import Provider
    from spotopt.collectors.base import Collector

BillingRule = Callable[[float, bool], float]
"""(seconds the instance ran, whether the cloud interrupted it) → the seconds the cloud bills."""


@dataclass(frozen=True, slots=True)
class CloudScript:
    """What differs per cloud: how the start-up script is delivered and run, its size limit,
    and ``identity_setting``: the setting that names which of the instance's identities reads
    the checkpoint store (Azure's user-assigned managed identity); None where an instance has
    one identity (AWS's instance profile, GCP's service account)."""

    delivered_as: str
    runs: str
    limit_bytes: int
    identity_setting: str | None = None


@dataclass(frozen=True, slots=True)
class Cloud:
    """One cloud, as the rest of spotopt sees it.

    ``markets``: the cloud sells markets recorded in the price history (``local`` does not).
    ``provider``: its ``Provider`` class, ``"module:Class"``; ``lists_by_region`` when it takes the
    regions to list instances in (AWS; GCP and Azure list project- or resource-group-wide).
    ``clients`` and ``sdk_modules``: its adaptor's client factory and the modules its SDK extra
    installs (``pip install "spotopt-gpu[<cloud>]"``). ``billed_seconds``: its billing rule
    (a ``BillingRule``, ``"module:function"``). ``collectors``: the modules whose import registers
    its collectors (``register_collector``), in run order: catalogs first, prices use what they learn.
    ``notice_poller``, ``metadata_url``, ``dmi_vendor``: the agent's poller class, the metadata
    service it asks by default, and the DMI vendor string that tells the agent it runs there.
    ``script``: how the cloud delivers the instances' start-up script. None: the cloud has none.
    """

    markets: bool
    provider: str
    lists_by_region: bool = False
    clients: str | None = None
    sdk_modules: tuple[str, ...] = ()
    billed_seconds: str | None = None
    collectors: tuple[str, ...] = ()
    notice_poller: str | None = None
    metadata_url: str | None = None
    dmi_vendor: str | None = None
    script: CloudScript | None = None


CLOUDS: Registry[Cloud] = Registry("cloud", "clouds")
CLOUDS.add(
    "aws",
    Cloud(
        markets=True,
        provider="spotopt.clouds.aws.provider:AwsProvider",
        lists_by_region=True,
        clients="spotopt.clouds.aws.adaptor:AwsClients",
        sdk_modules=("boto3", "botocore", "requests"),
        billed_seconds="spotopt.clouds.aws.billing:billed_seconds",
        collectors=("spotopt.clouds.aws.collectors", "spotopt.clouds.aws.advisor"),
        notice_poller="spotopt.clouds.aws.notices:AwsImdsPoller",
        metadata_url="http://169.254.169.254",
        dmi_vendor="amazon",
        script=CloudScript(
            "EC2 user data",
            "cloud-init runs it once, as root, at first boot; output: /var/log/cloud-init-output.log",
            16 * 1024,
        ),
    ),
)
CLOUDS.add(
    "gcp",
    Cloud(
        markets=True,
        provider="spotopt.clouds.gcp.provider:GcpProvider",
        clients="spotopt.clouds.gcp.adaptor:GcpClients",
        sdk_modules=("google.auth", "google.cloud.compute_v1", "google.cloud.billing_v1"),
        billed_seconds="spotopt.clouds.gcp.billing:billed_seconds",
        collectors=("spotopt.clouds.gcp.collectors",),
        notice_poller="spotopt.clouds.gcp.notices:GcpMetadataPoller",
        metadata_url="http://metadata.google.internal",
        dmi_vendor="google",
        script=CloudScript(
            "GCE startup-script metadata",
            "the guest agent runs it as root at every boot; output: serial console and journal",
            256 * 1024,
        ),
    ),
)
CLOUDS.add(
    "azure",
    Cloud(
        markets=True,
        provider="spotopt.clouds.azure.provider:AzureProvider",
        clients="spotopt.clouds.azure.adaptor:AzureClients",
        sdk_modules=(
            "azure.identity",
            "azure.mgmt.compute",
            "azure.mgmt.network",
            "azure.mgmt.resourcegraph",
            "requests",
        ),
        billed_seconds="spotopt.clouds.azure.billing:billed_seconds",
        collectors=("spotopt.clouds.azure.collectors",),
        notice_poller="spotopt.clouds.azure.notices:AzureScheduledEventsPoller",
        metadata_url="http://169.254.169.254",
        dmi_vendor="microsoft",
        script=CloudScript(
            "Azure custom data",
            "a #! script, so cloud-init runs it once, as root, at first boot; "
            "output: /var/log/cloud-init-output.log",
            65535,
            identity_setting="azure_identity_id",
        ),
    ),
)
CLOUDS.add("local", Cloud(markets=False, provider="spotopt.clouds.local.provider:LocalProvider"))

MARKET_CLOUDS: tuple[str, ...] = tuple(name for name, cloud in CLOUDS.items() if cloud.markets)
"""The clouds whose markets the history records (``aws``, ``gcp``, ``azure``), in listing order."""

CLOUD_SCRIPTS: Mapping[str, CloudScript] = {
    name: cloud.script for name, cloud in CLOUDS.items() if cloud.script is not None
}
"""cloud → how its instances get the start-up script (``spotopt.clouds.common.bootstrap``)."""

PROVIDERS: dict[str, str] = {name: cloud.provider for name, cloud in CLOUDS.items()} | {
    "clouds": "spotopt.clouds.common.router:CloudsProvider"
}
"""Provider name → ``"module:Class"``: every cloud's, and ``clouds`` (the router)."""


def _import_collectors() -> None:
    """Import every cloud's collector modules (they register themselves). No SDK is imported:
    clients come from the adaptors at run time."""
    for cloud in CLOUDS.values():
        for module in cloud.collectors:
            importlib.import_module(module)


COLLECTORS: Registry[type[Collector]] = Registry("collector", "collectors", load=_import_collectors)
"""Every cloud's collectors by name, in run order within a cloud (``spotopt collect``)."""


def register_collector(cls: type[Collector]) -> type[Collector]:
    """Class decorator: make ``cls`` known by its ``name``."""
    return COLLECTORS.add(cls.name, cls)


def for_cloud(cloud: str) -> list[type[Collector]]:
    """The collectors of ``cloud`` in run order (catalogs first: prices use what they learn)."""
    return [c for c in COLLECTORS.values() if c.cloud == cloud]


def load(target: str) -> Any:
    """The attribute a ``"module:attribute"`` name points at, its module imported now."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def get_provider(name: str, **options: Any) -> Provider:
    """The provider registered as ``name``, built with ``options``; unknown names get a suggestion."""
    if name not in PROVIDERS:
        close = difflib.get_close_matches(name, PROVIDERS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"provider {name!r} is unknown; {hint}use one of {', '.join(sorted(PROVIDERS))}")
    provider: Provider = load(PROVIDERS[name])(**options)
    return provider
