"""How spotopt calls a cloud: the retry rule, error classification and secret redaction.

Adaptors (client factories), collectors and providers all call cloud APIs, and all of them must
retry the same transient codes with the same bounded backoff, tell "no credentials" from
"credentials rejected" from "not permitted" the same way, and never let a secret reach a message.
That rule lives here, below all of them: this module imports only ``spotopt.errors`` and no SDK
(errors are matched by class name and code), so importing it costs nothing and creates no cycle
(the adaptors used to import it from ``collectors.base``, the wrong way round).
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from spotopt.errors import CollectorError

T = TypeVar("T")

# Codes (AWS error codes, Google error reasons and HTTP statuses) that mean "try again later".
# Everything else is permanent: retrying a bad request or a missing permission only delays the
# error. Compute Engine answers a request-rate limit with HTTP 403 and the reason
# ``rateLimitExceeded`` ("wait until some requests complete and try your request again": Compute
# Engine docs, "Troubleshooting bulk instance creation" and "API rate limits"), so a reason of
# these wins over the 403 that would otherwise read as "not permitted".
TRANSIENT_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "rateLimitExceeded",
        "userRateLimitExceeded",
        "429",
        "500",
        "502",
        "503",
        "504",
    }
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
    google-api-core errors an int ``code`` and the JSON body's ``error.errors[].reason`` in
    ``errors``; azure-core errors ``status_code``; ``requests.HTTPError`` a
    ``response.status_code``.
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
    for error in getattr(exc, "errors", None) or []:  # google-api-core: "rateLimitExceeded", ...
        reason = error.get("reason") if isinstance(error, Mapping) else None
        if isinstance(reason, str) and reason:
            codes.add(reason)
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

    def run(
        self,
        fn: Callable[[], T],
        cloud: str,
        api: str,
        region: str | None,
        final: Callable[[BaseException], bool] = lambda exc: False,
    ) -> T:
        """Call ``fn`` until it succeeds, a non-transient error occurs or attempts run out.

        ``final(exc)`` true: the error is not retried even with a transient status (EC2 sends
        ``InsufficientInstanceCapacity`` as a server error, HTTP 500: retrying it five times only
        delays the planner's next market). Every failure leaves as a ``CollectorError`` subclass
        naming cloud, region and API call.
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
                if codes & _NOT_PERMITTED and not codes & TRANSIENT_CODES:
                    raise NotPermitted(cloud, api, _short(exc), region) from exc
                if not codes & TRANSIENT_CODES or final(exc):
                    raise CollectorError(cloud, api, _short(exc), region) from exc
                if attempt == self.attempts:
                    raise CollectorError(
                        cloud, api, f"still failing after {self.attempts} attempts: {_short(exc)}", region
                    ) from exc
                self.sleep(self.delay(attempt))
        raise AssertionError("unreachable: the loop returns or raises")
