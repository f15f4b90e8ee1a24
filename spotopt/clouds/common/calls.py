"""How a cloud provider calls its SDK: the collectors' retry rule, with provider errors.

``spotopt.cloud_calls.Retry`` retries throttling and 5xx with bounded jittered backoff and turns
every other failure into a ``CollectorError`` naming the call. A provider keeps that rule and
only changes what leaves: missing credentials stay ``MissingCredentials`` (the daemon skips the
cloud and says what to configure), a capacity shortfall becomes ``CapacityUnavailableError`` (the
planner tries the next market), anything else a ``ProviderError`` naming the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from spotopt.cloud_calls import MissingCredentials, Retry, error_codes
from spotopt.clouds.common.base import Billing, InstanceState, InstanceStatus, LaunchSpec
from spotopt.errors import CapacityUnavailableError, CollectorError, ProviderError
from spotopt.types import MarketKey

T = TypeVar("T")
NOT_FOUND = frozenset({"NotFound", "ResourceNotFoundError"})
"""The SDKs' "no such resource" errors (google-api-core, azure-core), matched by class name as
``spotopt.cloud_calls`` matches errors, so this module imports no SDK."""
ScriptRenderer = Callable[[LaunchSpec, MarketKey], str]
"""Renders one placement's start-up script: ``bootstrap.render_script`` for the provider's
cloud and settings by default; tests may pass a fixed script."""


def provider_call(
    retry: Retry,
    cloud: str,
    api: str,
    fn: Callable[[], T],
    capacity: Callable[[BaseException], str | None] = lambda exc: None,
    market: str = "",
    region: str | None = None,
) -> T:
    """``fn()`` under ``retry``. ``capacity(exc)`` names the capacity error an SDK exception
    carries (None if it is not one): such an error is never retried, whatever its HTTP status
    (``Retry.run``'s ``final``); ``market`` (``market_label``) goes in that message.
    ``region`` goes in every message (``aws/us-east-1: ec2.run_instances failed: …``) where the
    API is regional and the call alone does not say where it failed (EC2)."""
    try:
        return retry.run(fn, cloud, api, region, final=lambda exc: capacity(exc) is not None)
    except MissingCredentials:
        raise
    except CollectorError as exc:
        cause = exc.__cause__
        code = capacity(cause) if cause is not None else None
        if code is not None:
            raise CapacityUnavailableError(f"{market}: no capacity ({code}) from {api}: {exc}") from exc
        raise ProviderError(str(exc)) from exc


def none_if_missing(fn: Callable[[], T], codes: frozenset[str] = frozenset()) -> T | None:
    """``fn()``, or None when the resource it reads or deletes does not exist (HTTP 404).

    ``codes`` are error codes (``error_codes``) that also mean "no such resource", for an SDK
    whose not-found is a code on a generic error class (botocore ``ClientError`` with EC2's
    ``InvalidInstanceID.NotFound``, an HTTP 400)."""
    try:
        return fn()
    except Exception as exc:
        if {cls.__name__ for cls in type(exc).__mro__} & NOT_FOUND or error_codes(exc) & codes:
            return None
        raise


def after_delete(before: InstanceStatus, ended: dict[str, InstanceStatus]) -> InstanceStatus:
    """What ``terminate`` reports once the delete is done: ``TERMINATED`` for an instance that
    was live; one that had ended (job exit, preemption) keeps how it ended, remembered in
    ``ended`` because the cloud forgets a deleted instance (or records the delete as ours).
    Either way nothing of it bills any more."""
    if before.state.is_live:
        return InstanceStatus(before.instance, before.instance_id, InstanceState.TERMINATED, detail="deleted")
    ended[before.instance_id] = replace(before, leftover=Billing.NONE)
    return ended[before.instance_id]
