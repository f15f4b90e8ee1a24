"""The ``clouds`` provider: every placement goes to its market's cloud.

The executor holds one ``Provider``; real fleets span AWS, GCP and Azure. This provider routes:
``launch`` goes to ``market.cloud``'s provider, ``status``/``terminate`` to the cloud named in
the instance id, ``list_instances`` asks every cloud it serves.

Ids: the three clouds' ids look nothing alike (``i-…@region``, ``ZONE/NAME``, an Azure VM name)
and an Azure name could contain ``/`` or ``@``, so guessing the owner from the shape is fragile.
The id this provider hands out is ``<cloud>:<cloud's own id>`` (``aws:i-0abc@us-east-1``); the
cloud's id is kept verbatim after the first ``:``. An id without a known cloud prefix was not
made here: it is ``GONE`` (the contract's rule for unknown ids) and never terminated.

Each cloud's provider is built on first use (its SDK is imported only then) and checked
(``check()``: settings and credentials, no API call). A cloud that cannot be built is
remembered with its one-line reason (``problems``): the daemon leaves its markets out and says
why, instead of crashing. An id of such a cloud cannot be looked at; ``status`` raises
``ProviderError`` rather than answer ``GONE``, because "gone" would make the daemon relaunch
a job whose instance may still be running (and billing) there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from spotopt.cloud_calls import MissingCredentials
from spotopt.clouds.common.base import (
    Instance,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    Provider,
    sorted_instances,
)
from spotopt.clouds.registry import CLOUDS, MARKET_CLOUDS, load
from spotopt.errors import ConfigError, ProviderError
from spotopt.settings import Settings
from spotopt.types import MarketKey

Builder = Callable[[str, Settings, list[str]], Provider]
"""(cloud, settings, regions) → that cloud's provider, checked; raises ConfigError or
MissingCredentials when the cloud is not configured."""


def build_cloud(cloud: str, settings: Settings, regions: list[str]) -> Provider:
    """The provider of ``cloud``, its settings and credentials checked before any API call.
    AWS gets ``regions`` (where ``list_instances`` looks); GCP and Azure list project- or
    resource-group-wide. The start-up script's settings are checked first (they are every cloud's)."""
    settings.check_bootstrap()
    entry = CLOUDS.get(cloud)
    if entry is None or not entry.markets:
        raise ConfigError(f"cloud {cloud!r} is unknown; use one of {', '.join(MARKET_CLOUDS)}")
    provider_class = load(entry.provider)
    made = provider_class(settings, regions=regions) if entry.lists_by_region else provider_class(settings)
    made.check()  # every cloud's provider has one; the Provider protocol does not require it
    provider: Provider = made
    return provider


def split_id(instance_id: str) -> tuple[str, str] | None:
    """``cloud:id`` → (cloud, the cloud's own id); None for an id not made here."""
    cloud, sep, own = instance_id.partition(":")
    return (cloud, own) if sep and cloud in MARKET_CLOUDS and own else None


class CloudsProvider:
    """Routes each call to the provider of one cloud (see the module docstring).

    ``regions`` maps each cloud this provider serves to its markets' regions (the daemon reads
    them from the history); ``list_instances`` asks those clouds. ``build`` is for tests.
    """

    name = "clouds"
    runs_on_market = True

    def __init__(
        self,
        settings: Settings | None = None,
        regions: Mapping[str, Iterable[str]] | None = None,
        build: Builder = build_cloud,
    ) -> None:
        self.settings = settings or Settings()
        self.regions = {cloud: list(dict.fromkeys(r)) for cloud, r in (regions or {}).items()}
        self._build = build
        self._made: dict[str, Provider] = {}
        self.problems: dict[str, str] = {}
        """cloud → why its provider cannot be built (the ``MissingCredentials``/setting message)."""

    def usable(self, clouds: Iterable[str] | None = None) -> list[str]:
        """The clouds among ``clouds`` (default: those served) whose provider builds; the others
        land in ``problems``. Builds each at most once."""
        ok = []
        for cloud in clouds if clouds is not None else self.regions:
            try:
                self.cloud(cloud)
            except (ConfigError, MissingCredentials):
                continue
            ok.append(cloud)
        return ok

    def cloud(self, cloud: str) -> Provider:
        """The provider of ``cloud``, built on first use; a cloud that failed to build raises
        its reason again (ConfigError or MissingCredentials), without a second attempt."""
        if cloud in self._made:
            return self._made[cloud]
        if cloud in self.problems:
            raise ConfigError(self.problems[cloud])
        try:
            made = self._build(cloud, self.settings, self.regions.get(cloud, []))
        except MissingCredentials as exc:
            self.problems[cloud] = f"{cloud}: {exc.hint}"
            raise
        except ConfigError as exc:
            self.problems[cloud] = f"{cloud}: {exc}"
            raise
        self._made[cloud] = made
        return made

    # -- Provider ---------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance:
        instance = self.cloud(market.cloud).launch(spec, market, idempotency_key)
        return _prefixed(market.cloud, instance)

    def status(self, instance_id: str) -> InstanceStatus:
        return self._routed(instance_id, lambda provider, own: provider.status(own))

    def terminate(self, instance_id: str) -> InstanceStatus:
        return self._routed(instance_id, lambda provider, own: provider.terminate(own))

    def list_instances(self, job: str | None = None, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """spotopt's instances on every usable cloud served (or used) here."""
        found = []
        for cloud in self.usable([*self.regions, *(c for c in self._made if c not in self.regions)]):
            found += [_prefixed(cloud, i) for i in self._made[cloud].list_instances(job, tags)]
        return sorted_instances(found)

    # -- internals -----------------------------------------------------------------------------

    def _routed(self, instance_id: str, call: Callable[[Provider, str], InstanceStatus]) -> InstanceStatus:
        """``call`` on the owning cloud's provider with its own id; the answer under our id."""
        parts = split_id(instance_id)
        if parts is None:
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="not a clouds instance id")
        cloud, own = parts
        try:
            provider = self.cloud(cloud)
        except (ConfigError, MissingCredentials) as exc:
            raise ProviderError(f"instance {instance_id}: {self.problems.get(cloud, exc)}") from exc
        status = call(provider, own)
        instance = _prefixed(cloud, status.instance) if status.instance is not None else None
        return replace(status, instance=instance, instance_id=instance_id)


def _prefixed(cloud: str, instance: Instance) -> Instance:
    """The cloud's instance as this provider's (its id prefixed, ``provider`` = ``clouds``)."""
    return replace(instance, instance_id=f"{cloud}:{instance.instance_id}", provider=CloudsProvider.name)
