"""Providers: where a job's placements run. Registered by kebab-case name (``local``, ``aws``,
``gcp``, ``azure``).

``get_provider(name, **options)`` builds one; the module behind a name is imported only then,
so listing names never imports a cloud SDK.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from spotopt.errors import ConfigError
from spotopt.providers.base import Provider

PROVIDERS: dict[str, str] = {
    "local": "spotopt.providers.local:LocalProvider",
    "aws": "spotopt.providers.aws:AwsProvider",
    "gcp": "spotopt.providers.gcp:GcpProvider",
    "azure": "spotopt.providers.azure:AzureProvider",
}


def get_provider(name: str, **options: Any) -> Provider:
    """The provider registered as ``name``, built with ``options``; unknown names get a suggestion."""
    if name not in PROVIDERS:
        close = difflib.get_close_matches(name, PROVIDERS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(f"provider {name!r} is unknown; {hint}use one of {', '.join(sorted(PROVIDERS))}")
    module, _, attr = PROVIDERS[name].partition(":")
    provider: Provider = getattr(importlib.import_module(module), attr)(**options)
    return provider
