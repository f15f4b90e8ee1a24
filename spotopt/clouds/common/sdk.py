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
from spotopt.clouds.registry import CLOUDS, load


def require_sdk(cloud: str) -> None:
    """Import ``cloud``'s SDK now; if it is not installed, raise ``MissingCredentials`` with the
    ``pip install`` that fixes it, so the cloud is skipped like one without credentials."""
    for module in CLOUDS[cloud].sdk_modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingCredentials(
                cloud, f"install the {cloud} SDK ({module} is missing): {pip_install_hint(cloud)}"
            ) from None


def client_factory(cloud: str) -> Any:
    """The production client factory of ``cloud`` (``aws``, ``gcp`` or ``azure``); raises
    ``MissingCredentials`` naming the extra to install when the cloud's SDK is missing."""
    entry = CLOUDS.get(cloud)
    if entry is None or entry.clients is None:
        raise ValueError(f"no client factory for cloud {cloud!r}")
    require_sdk(cloud)
    return load(entry.clients)()
