"""The collector interface, its registry, and the one retry rule every cloud call goes through.

A collector reads one cloud API for one *scope* (a region, or ``global`` for sources that
publish one document for every region) and yields typed records; it never touches the
database. ``spotopt.collect`` runs each (collector, scope) as its own transaction with its own
watermark, so a region that fails loses nothing elsewhere.

Cloud clients come from a factory given to the constructor (``spotopt.adaptors``): the single
seam tests replace with offline fakes. Errors leave a collector in one of three shapes:
``MissingCredentials`` (nothing configured: skip and say what to configure),
``NotPermitted`` (credentials lack a permission: skip and say which), or ``CollectorError``
(the call failed for good, after retrying known transient codes only; credentials the cloud
rejects are such a failure, "credentials rejected", not a skip).
"""

from __future__ import annotations

import difflib
import os
import random
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, ClassVar, TypeVar

from spotopt.catalog import gpu_matches
from spotopt.errors import CollectorError, InputError
from spotopt.types import InstanceTypeSpec, Record, Rejection

T = TypeVar("T")

GLOBAL_SCOPE = "global"

# Codes (AWS error codes and HTTP statuses) that mean "try again later". Everything else is
# permanent: retrying a bad request or a missing permission only delays the error.
TRANSIENT_CODES = frozenset(
    {"Throttling", "ThrottlingException", "RequestLimitExceeded", "429", "500", "502", "503", "504"}
)
# Exception class names of the SDKs' "no credentials found" errors (matched by name so this
# module needs no SDK import).
_NO_CREDENTIALS = frozenset(
    {
        "NoCredentialsError",
        "PartialCredentialsError",
        "DefaultCredentialsError",
        "CredentialUnavailableError",
    }
)
# Credentials were configured and the cloud refused them (wrong or expired secret, revoked
# grant): a failure the user must fix, never a quiet skip. azure-core raises
# ``ClientAuthenticationError`` for an HTTP 401/403; without a status it comes from
# ``DefaultAzureCredential`` having found no credential that gives a token (nothing configured).
_AUTH_ERRORS = frozenset({"ClientAuthenticationError"})
_REJECTED_CLASSES = frozenset({"RefreshError"})  # google-auth: the token refresh was refused
_REJECTED_CODES = frozenset(
    {
        "401",
        "AuthFailure",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
        "ExpiredToken",
        "ExpiredTokenException",
    }
)
_NOT_PERMITTED = frozenset(
    {
        "UnauthorizedOperation",
        "AccessDenied",
        "AccessDeniedException",
        "AuthorizationFailed",
        "AuthorizationError",
        "403",
    }
)


class MissingCredentials(CollectorError):
    """The cloud's default credential chain found nothing; ``hint`` says what to configure."""

    def __init__(self, cloud: str, hint: str) -> None:
        super().__init__(cloud, "credentials", hint)
        self.hint = hint


class NotPermitted(CollectorError):
    """The credentials work but lack a permission for ``api``; the collector is skipped."""


def error_codes(exc: BaseException) -> set[str]:
    """The error code and HTTP status an SDK exception carries, as strings (empty if none).

    botocore ``ClientError`` has ``response["Error"]["Code"]`` and an HTTP status;
    google-api-core errors an int ``code``; azure-core errors ``status_code``;
    ``requests.HTTPError`` a ``response.status_code``.
    """
    codes: set[str] = set()
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        error = response.get("Error") or {}
        if error.get("Code"):
            codes.add(str(error["Code"]))
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if status:
            codes.add(str(status))
    elif response is not None and isinstance(getattr(response, "status_code", None), int):
        codes.add(str(response.status_code))
    for attr in ("code", "status_code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            codes.add(str(value))
    error_code = getattr(exc, "error_code", None)  # azure-core: "AuthorizationFailed", ...
    if isinstance(error_code, str) and error_code:
        codes.add(error_code)
    return codes


# Environment variables holding secrets the SDKs read. A cloud's error message can echo one (a
# token endpoint's reply, a request URL), and messages end up in ``runs.error``, the summary
# table and logs, so every message built from an exception goes through ``redact``.
SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_CLIENT_SECRET",
    "AZURE_CLIENT_CERTIFICATE_PASSWORD",
    "AZURE_PASSWORD",
    "SPOTOPT_GCP_API_KEY",
    "GOOGLE_API_KEY",
)
# Shorter values are not redacted: they would blank ordinary words, and no real secret is that short.
_MIN_SECRET_CHARS = 8
# Credentials that travel in URLs: an API key, OAuth token, SAS or presigned-URL signature.
_URL_SECRET = re.compile(
    r"([?&](?:key|api_key|access_token|sig|x-amz-signature|x-amz-security-token)=)[^&\s'\"]+",
    re.IGNORECASE,
)
REDACTED = "[redacted]"


def redact(text: str) -> str:
    """``text`` without the values of ``SECRET_ENV`` and without credentials in URL parameters."""
    for name in SECRET_ENV:
        value = os.environ.get(name, "")
        if len(value) >= _MIN_SECRET_CHARS:
            text = text.replace(value, REDACTED)
    return _URL_SECRET.sub(rf"\1{REDACTED}", text)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return redact(f"{type(exc).__name__}: {first}")[:500]


@dataclass(frozen=True)
class Retry:
    """Bounded exponential backoff with full jitter, on ``TRANSIENT_CODES`` only.

    ``sleep`` and ``rng`` are injectable so tests neither wait nor depend on chance. With the
    defaults a call is tried 5 times over at most ~1 + 2 + 4 + 8 = 15 s of sleeping.
    """

    attempts: int = 5
    base_s: float = 1.0
    cap_s: float = 20.0
    sleep: Callable[[float], None] = time.sleep
    rng: Callable[[], float] = random.random

    def delay(self, attempt: int) -> float:
        """Sleep before retry number ``attempt`` (1-based): uniform in [0, min(cap, base·2^(n-1))]."""
        return self.rng() * min(self.cap_s, self.base_s * 2 ** (attempt - 1))

    def run(self, fn: Callable[[], T], cloud: str, api: str, region: str | None) -> T:
        """Call ``fn`` until it succeeds, a non-transient error occurs or attempts run out.

        Every failure leaves as a ``CollectorError`` subclass naming cloud, region and API call.
        """
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except CollectorError:
                raise
            except Exception as exc:
                names = {cls.__name__ for cls in type(exc).__mro__}
                codes = error_codes(exc)
                if names & _NO_CREDENTIALS or (names & _AUTH_ERRORS and not codes):
                    raise MissingCredentials(cloud, f"{api}: {_short(exc)}") from exc
                if names & (_AUTH_ERRORS | _REJECTED_CLASSES) or codes & _REJECTED_CODES:
                    raise CollectorError(cloud, api, f"credentials rejected: {_short(exc)}", region) from exc
                if codes & _NOT_PERMITTED:
                    raise NotPermitted(cloud, api, _short(exc), region) from exc
                if not codes & TRANSIENT_CODES:
                    raise CollectorError(cloud, api, _short(exc), region) from exc
                if attempt == self.attempts:
                    raise CollectorError(
                        cloud, api, f"still failing after {self.attempts} attempts: {_short(exc)}", region
                    ) from exc
                self.sleep(self.delay(attempt))
        raise AssertionError("unreachable: the loop returns or raises")


@dataclass(frozen=True)
class Context:
    """What one run asks of every collector.

    ``regions`` empty means every region the cloud offers; ``gpus`` empty means every GPU;
    ``catalog`` holds the instance types the history already knows for this cloud (bundled
    catalog plus earlier collector runs), keyed by name.
    """

    now: datetime
    regions: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    catalog: Mapping[str, InstanceTypeSpec] = field(default_factory=dict)
    retry: Retry = field(default_factory=Retry)

    def wants_region(self, region: str) -> bool:
        return not self.regions or region in self.regions

    def wants_gpu(self, gpu_model: str | None) -> bool:
        """True without ``--gpu``; with it, only types whose canonical GPU matches one of them."""
        return not self.gpus or any(gpu_matches(g, gpu_model) for g in self.gpus)


class Collector(ABC):
    """Reads one API of one cloud for one scope and yields records.

    Subclasses set ``name`` (kebab-case; also the ``source`` of what they write and the
    watermark key), ``cloud``, ``collects`` (what, for notes and the README) and ``needs``
    (what to configure, for "configure X to collect Y"). ``only_changes`` asks the
    orchestrator to store a price only when it differs from this collector's last stored price
    of the market (for snapshot APIs that report the current price each time).
    """

    name: ClassVar[str]
    cloud: ClassVar[str]
    collects: ClassVar[str]
    needs: ClassVar[str]
    only_changes: ClassVar[bool] = False
    global_scope: ClassVar[bool] = False
    keyed_watermarks: ClassVar[bool] = False
    """The collector also keeps a watermark per key within its scope (stored as scope
    ``<scope>/<key>``): for APIs queried per item, where a run may cover only some items."""

    def __init__(self, clients: Any, scope: str, ctx: Context) -> None:
        self.clients = clients
        self.scope = scope
        self.ctx = ctx
        self.until: datetime | None = ctx.now
        """The new watermark once ``collect`` has run to the end: data up to here is stored
        (None: the run did not cover the whole scope, so the scope's watermark stays)."""
        self.since_by_key: dict[str, datetime] = {}
        """With ``keyed_watermarks``: the stored watermark of each key (empty under ``--since``)."""
        self.until_by_key: dict[str, datetime] = {}
        """With ``keyed_watermarks``: key → new watermark, set once ``collect`` has run to the end."""
        self.zone_ids: dict[tuple[str, str], str] = {}
        """(region, zone name) → zone ID learnt while collecting (AWS AZ IDs)."""
        self.notes: list[str] = []

    @property
    def region(self) -> str | None:
        return None if self.scope == GLOBAL_SCOPE else self.scope

    @classmethod
    def scopes(cls, clients: Any, ctx: Context) -> list[str]:
        """The scopes one run covers: ``global``, or the requested regions by default."""
        if cls.global_scope:
            return [GLOBAL_SCOPE]
        if ctx.regions:
            return list(ctx.regions)
        return cls.default_regions(clients, ctx)

    @classmethod
    def default_regions(cls, clients: Any, ctx: Context) -> list[str]:
        """Every region the cloud offers to the caller; a collector that cannot list them needs --region."""
        raise InputError(f"{cls.name} cannot list its regions: pass --region R")

    @abstractmethod
    def collect(self, since: datetime | None) -> Iterator[Record]:
        """Yield the records of this scope observed since ``since`` (None: as far back as useful).

        Idempotent: records carry their source's own times where it has them, so collecting an
        overlapping window again yields records the history already holds (ignored on insert).
        """

    def call(self, api: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``: one API request under the retry rule, errors naming this
        collector's cloud and region and ``api``."""
        return self.ctx.retry.run(partial(fn, *args, **kwargs), self.cloud, api, self.region)

    def parsed(self, parse: Callable[..., T], *args: Any) -> T | Rejection:
        """``parse(*args)``: a malformed item becomes a counted rejection, not a failed scope."""
        try:
            return parse(*args)
        except InputError as exc:
            return Rejection(str(exc)[:300], "malformed item")

    def next_token(self, api: str, seen: set[str], token: str | None) -> str | None:
        """``token`` if it leads to a page not read yet; a server that hands back a token it gave
        before would make the collector loop forever, so that is an error naming the call."""
        if not token:
            return None
        if token in seen:
            raise CollectorError(self.cloud, api, "pagination repeated a page token", self.region)
        seen.add(token)
        return token

    def memo(self, key: tuple[str, ...], compute: Callable[[], T]) -> T:
        """``compute()`` once per client factory: the collectors of one run share listings
        (a region's GPU types, a cloud's SKU list) instead of fetching them again."""
        store: dict[tuple[str, ...], Any] = self.clients.__dict__.setdefault("_spotopt_memo", {})
        if key not in store:
            store[key] = compute()
        result: T = store[key]
        return result


def hour(at: datetime) -> datetime:
    """``at`` rounded down to the hour: the time stamp of snapshot data without its own time,
    so collecting twice within an hour stores one observation."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


REGISTRY: dict[str, type[Collector]] = {}


def register(cls: type[Collector]) -> type[Collector]:
    """Class decorator: make ``cls`` known by its ``name``."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise AssertionError(f"two collectors named {cls.name}")
    REGISTRY[cls.name] = cls
    return cls


def load_all() -> dict[str, type[Collector]]:
    """Import every collector module (they register themselves) and return the registry.

    Importing the modules imports no SDK: clients come from the adaptors at run time.
    """
    from spotopt.collectors import aws, aws_advisor, azure, gcp  # noqa: F401

    return REGISTRY


def get_collector(name: str) -> type[Collector]:
    """The collector registered as ``name``; an unknown name gets a "did you mean" error."""
    registry = load_all()
    if name in registry:
        return registry[name]
    close = difflib.get_close_matches(name, list(registry), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise InputError(f"no collector named {name!r}{hint} (known: {', '.join(sorted(registry))})")


def for_cloud(cloud: str) -> list[type[Collector]]:
    """The collectors of ``cloud`` in run order (catalogs first: prices use what they learn)."""
    return [c for c in load_all().values() if c.cloud == cloud]
