"""Where events go: a generic webhook, Slack's incoming webhook, e-mail over SMTP, a local command.

Each sink ``send``s one event's body (``outbox.body``) within ``timeout_s`` or raises
``DeliveryError``; ``down`` on it says the sink could not be reached at all, so the round sends
it nothing more (a sink that is down costs one timeout a round, not one per event). A sink
holds its secrets as ``SecretStr`` and never puts them, nor its URL (a Slack URL is a secret),
in an error: errors are stored in the database and shown by ``spotopt notify list``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import shlex
import smtplib
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any, Protocol

from pydantic import SecretStr

from spotopt.errors import SpotoptError, one_line
from spotopt.settings import Settings

SIGNATURE_HEADER = "X-Spotopt-Signature"
EVENT_ID_HEADER = "X-Spotopt-Event-Id"


class DeliveryError(SpotoptError):
    """A sink did not acknowledge an event; ``down``: it could not be reached at all."""

    def __init__(self, message: str, *, down: bool = False) -> None:
        super().__init__(message)
        self.down = down


@dataclass(frozen=True)
class Filter:
    """Which events a sink takes: kinds matching one of ``events`` (``fnmatch`` patterns such as
    ``job.*``; empty: all) of jobs whose name matches one of ``jobs`` (empty: all; the daemon's
    own events, with no job, pass any job filter)."""

    events: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()

    def wants(self, kind: str, job: str | None) -> bool:
        kind_ok = not self.events or any(fnmatch.fnmatchcase(kind, p) for p in self.events)
        job_ok = not self.jobs or job is None or any(fnmatch.fnmatchcase(job, p) for p in self.jobs)
        return kind_ok and job_ok


class Sink(Protocol):
    """One sink: its ``name`` (``webhook``, ``slack``, ``email``, ``command``: the delivery
    state's key), what it takes, and how it sends."""

    @property
    def name(self) -> str: ...

    @property
    def filter(self) -> Filter: ...

    def send(self, event: dict[str, Any], timeout_s: float) -> None: ...


def signature(secret: str, raw: bytes) -> str:
    """The ``X-Spotopt-Signature`` value: ``sha256=`` and the hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


def _post(url: str, raw: bytes, headers: dict[str, str], timeout_s: float, what: str) -> None:
    """POST ``raw`` as JSON; any 2xx acknowledges it. Errors name ``what``, never the URL."""
    request = urllib.request.Request(
        url, data=raw, method="POST", headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"{what} answered HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        said = one_line(reason) if isinstance(reason, BaseException) else str(reason)
        raise DeliveryError(f"{what} unreachable: {said}", down=True) from None


@dataclass(frozen=True)
class Webhook:
    """The generic webhook: the body as JSON, signed with the shared secret when one is set."""

    url: str
    secret: SecretStr | None
    filter: Filter = field(default_factory=Filter)
    name: str = "webhook"

    def send(self, event: dict[str, Any], timeout_s: float) -> None:
        raw = json.dumps(event, sort_keys=True).encode()
        headers = {EVENT_ID_HEADER: event["id"]}
        if self.secret is not None:
            headers[SIGNATURE_HEADER] = signature(self.secret.get_secret_value(), raw)
        _post(self.url, raw, headers, timeout_s, "the webhook")


def headline(event: dict[str, Any]) -> str:
    """One line a person reads: the event, its job and its reason or figures."""
    job = f" {event['job']}" if event.get("job") else ""
    facts = ", ".join(
        f"{name} {event[name]}"
        for name in ("reason", "percent", "total_usd", "saving_usd", "instance")
        if event.get(name) not in (None, "")
    )
    return f"spotopt: {event['event']}{job}" + (f": {facts}" if facts else "")


@dataclass(frozen=True)
class Slack:
    """Slack's incoming webhook: ``{"text": headline}``; the URL is the secret."""

    url: SecretStr
    filter: Filter = field(default_factory=Filter)
    name: str = "slack"

    def send(self, event: dict[str, Any], timeout_s: float) -> None:
        raw = json.dumps({"text": headline(event)}).encode()
        _post(self.url.get_secret_value(), raw, {EVENT_ID_HEADER: event["id"]}, timeout_s, "Slack")


@dataclass(frozen=True)
class Email:
    """E-mail over SMTP with STARTTLS (unless ``starttls`` is off, for a relay on localhost);
    logs in when a user is set. ``cafile``: the CA that signs the server's certificate (None: the
    system's)."""

    host: str
    port: int
    sender: str
    to: tuple[str, ...]
    user: str | None = None
    password: SecretStr | None = None
    starttls: bool = True
    cafile: str | None = None
    filter: Filter = field(default_factory=Filter)
    name: str = "email"

    def send(self, event: dict[str, Any], timeout_s: float) -> None:
        message = EmailMessage()
        message["Subject"] = headline(event)
        message["From"], message["To"] = self.sender, ", ".join(self.to)
        message["Message-ID"] = f"<{event['id']}@spotopt>"
        message.set_content(json.dumps(event, indent=2, sort_keys=True))
        try:
            with smtplib.SMTP(self.host, self.port, timeout=timeout_s) as smtp:
                if self.starttls:
                    smtp.starttls(context=ssl.create_default_context(cafile=self.cafile))
                if self.user:
                    password = self.password.get_secret_value() if self.password else ""
                    smtp.login(self.user, password)
                smtp.send_message(message)
        except smtplib.SMTPResponseException as exc:
            raise DeliveryError(f"the SMTP server answered {exc.smtp_code}") from None
        except (smtplib.SMTPException, OSError) as exc:
            raise DeliveryError(f"the SMTP server unreachable: {type(exc).__name__}", down=True) from None


@dataclass(frozen=True)
class Command:
    """A local command, run with the event's JSON on its standard input; exit 0 acknowledges."""

    argv: tuple[str, ...]
    filter: Filter = field(default_factory=Filter)
    name: str = "command"

    def send(self, event: dict[str, Any], timeout_s: float) -> None:
        try:
            done = subprocess.run(
                self.argv,
                input=json.dumps(event, sort_keys=True).encode(),
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DeliveryError(f"the command did not end within {timeout_s:g} s") from None
        except OSError as exc:
            raise DeliveryError(f"the command could not start: {one_line(exc)}", down=True) from None
        if done.returncode != 0:
            raise DeliveryError(f"the command exited with status {done.returncode}")


def _list(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def configured(settings: Settings) -> list[Sink]:
    """The sinks ``settings`` set up, in a fixed order (webhook, slack, email, command)."""
    s = settings
    found: list[Sink] = []
    if s.notify_webhook_url:
        found.append(
            Webhook(
                s.notify_webhook_url,
                s.notify_webhook_secret,
                Filter(_list(s.notify_webhook_events), _list(s.notify_webhook_jobs)),
            )
        )
    if s.notify_slack_url is not None:
        found.append(
            Slack(s.notify_slack_url, Filter(_list(s.notify_slack_events), _list(s.notify_slack_jobs)))
        )
    if s.notify_smtp_host:
        found.append(
            Email(
                s.notify_smtp_host,
                s.notify_smtp_port,
                s.require("notify_smtp_from", "the sender address of the e-mails"),
                _list(s.require("notify_smtp_to", "the addresses e-mails go to, separated by commas")),
                s.notify_smtp_user,
                s.notify_smtp_password,
                s.notify_smtp_starttls,
                s.notify_smtp_cafile,
                Filter(_list(s.notify_email_events), _list(s.notify_email_jobs)),
            )
        )
    if s.notify_command:
        found.append(
            Command(
                tuple(shlex.split(s.notify_command)),
                Filter(_list(s.notify_command_events), _list(s.notify_command_jobs)),
            )
        )
    return found


def by_name(sinks: Sequence[Sink], name: str) -> Sink | None:
    return next((sink for sink in sinks if sink.name == name), None)
