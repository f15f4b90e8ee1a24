"""One error hierarchy. The CLI maps every ``SpotoptError`` to a message and an exit code."""

from __future__ import annotations


class SpotoptError(Exception):
    """Base of every error spotopt raises on purpose. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class ConfigError(SpotoptError):
    """A setting, URL or option is wrong; the message says which and how to fix it."""

    exit_code = 2


class InputError(SpotoptError):
    """A user-supplied file or value is malformed; the message names file, item and field."""

    exit_code = 2


class CollectorError(SpotoptError):
    """A cloud API call failed for good (after retries on transient codes)."""

    exit_code = 3

    def __init__(self, cloud: str, api: str, message: str, region: str | None = None) -> None:
        where = f"{cloud}/{region}" if region else cloud
        super().__init__(f"{where}: {api} failed: {message}")
        self.cloud = cloud
        self.api = api
        self.region = region


class DatabaseBusyError(SpotoptError):
    """Another process kept the database's write lock longer than spotopt waits for it."""

    exit_code = 3


class ProviderError(SpotoptError):
    """A provider action (launch, checkpoint, terminate) failed."""

    exit_code = 3


class CapacityUnavailableError(ProviderError):
    """The market had no capacity when we asked for it."""


class PolicyError(SpotoptError):
    """A policy could not produce an allocation (solver failure, bad input arrays)."""

    exit_code = 4


class InfeasibleError(PolicyError):
    """No allocation satisfies the constraints; ``hint`` explains which job or constraint."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(f"{message}\n{hint}" if hint else message)
        self.hint = hint


class BudgetExceededError(SpotoptError):
    """An action would spend more than the configured budget."""

    exit_code = 4


class SupersededError(SpotoptError):
    """A newer placement of the job holds the lease: this one must stop and write nothing."""

    exit_code = 5


def one_line(exc: BaseException) -> str:
    """An error as one line (a job's failure reason, a log field): our own errors by their
    message, others prefixed with their type, since ``KeyError: 'x'`` says more than ``'x'``."""
    text = " ".join(str(exc).split())
    return text if isinstance(exc, SpotoptError) and text else f"{type(exc).__name__}: {text}".rstrip(": ")
