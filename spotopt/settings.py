"""Settings: one object, read from ``SPOTOPT_*`` environment variables.

Each cloud's fields are a section in its own folder (``spotopt/clouds/<cloud>/settings.py``, a
leaf importing nothing of spotopt) that ``Settings`` inherits, so a field keeps one flat name
(``aws_image_id``, ``SPOTOPT_AWS_IMAGE_ID``) and one typed attribute. The sections are listed
here, not found through ``spotopt.clouds.registry``: a base class a type checker cannot see
would leave every ``settings.aws_…`` untyped.

Precedence for the database URL: ``--db URL`` on the command line, else ``SPOTOPT_DB_URL``,
else a SQLite file in the user's data directory (``platformdirs.user_data_dir("spotopt")``).
"""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from spotopt.clouds.aws.settings import AwsSettings
from spotopt.clouds.azure.settings import AzureSettings
from spotopt.clouds.gcp.settings import GcpSettings
from spotopt.errors import ConfigError


def default_db_url() -> str:
    """The embedded default: a SQLite file that needs no server and no set-up."""
    path = Path(platformdirs.user_data_dir("spotopt")) / "spotopt.sqlite"
    return f"sqlite:///{path}"


class Settings(BaseSettings, AwsSettings, GcpSettings, AzureSettings):
    """Shared by every cloud: the database, the instances' start-up script and the dashboard.

    With its clouds' sections (the base classes), every user-facing setting. Each field's docstring
    is its documentation: the settings reference (docs/reference/settings.md) is generated from
    them, a table per section."""

    model_config = SettingsConfigDict(env_prefix="SPOTOPT_", extra="ignore")

    db_url: str | None = None
    """SQLAlchemy URL of the history database (``sqlite:///PATH`` or ``postgresql://USER@HOST/DB``);
    ``--db URL`` wins over it; unset: ``sqlite:///<user data dir>/spotopt.sqlite``."""

    auto_migrate: bool = True
    """On SQLite, apply pending migrations automatically (under a lock) when spotopt opens the
    database; PostgreSQL operators run ``spotopt db upgrade``."""

    price_max_age_days: float = Field(default=7.0, gt=0, le=36500)
    """Days after which a market's newest price is *stale*: every listing shows a price's age and
    marks a stale one, and a stale price never wins over a fresh one in ``plan``, the what-if
    engine or the daemon (a market known only by stale prices is used, with a warning, only when
    a job has no fresh one)."""

    # -- the instances' start-up script (docs/guides/clouds.md) ------------------------------------
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

    # -- the dashboard (docs/guides/dashboard.md) ---------------------------------------------
    ui_token: SecretStr | None = None
    """Token every request to ``spotopt ui`` must carry; required to serve on any address but
    loopback; unset: ``spotopt ui`` serves loopback only, with no token."""

    # -- notifications (docs/guides/notifications.md) -----------------------------------------
    notify_webhook_url: str | None = None
    """URL the generic webhook POSTs each event to (JSON: ``id``, ``event``, ``job``, ``at``...);
    unset: no webhook."""

    notify_webhook_secret: SecretStr | None = None
    """Shared secret the webhook signs each body with: ``X-Spotopt-Signature: sha256=<hex
    HMAC-SHA256 of the raw body>``; unset: requests are not signed."""

    notify_webhook_events: str | None = None
    """Event kinds the webhook gets, separated by commas, ``*`` wildcards allowed
    (``job.failed,budget.*``); unset: all."""

    notify_webhook_jobs: str | None = None
    """Job names the webhook gets events of, separated by commas, ``*`` wildcards allowed; unset: all."""

    notify_slack_url: SecretStr | None = None
    """Slack incoming-webhook URL (a secret: whoever has it may post); unset: no Slack."""

    notify_slack_events: str | None = None
    """Event kinds Slack gets (as ``notify_webhook_events``); unset: all."""

    notify_slack_jobs: str | None = None
    """Job names Slack gets events of (as ``notify_webhook_jobs``); unset: all."""

    notify_smtp_host: str | None = None
    """SMTP server that e-mails each event; unset: no e-mail."""

    notify_smtp_port: int = Field(default=587, gt=0, lt=65536)
    """Port of ``notify_smtp_host`` (587: submission with STARTTLS)."""

    notify_smtp_starttls: bool = True
    """Upgrade the SMTP connection with STARTTLS before logging in (off only for a relay on
    localhost)."""

    notify_smtp_cafile: str | None = None
    """CA certificate file that signs the SMTP server's certificate; unset: the system's CAs."""

    notify_smtp_user: str | None = None
    """SMTP login; unset: send without logging in."""

    notify_smtp_password: SecretStr | None = None
    """SMTP password of ``notify_smtp_user``."""

    notify_smtp_from: str | None = None
    """Sender address of the e-mails (required with ``notify_smtp_host``)."""

    notify_smtp_to: str | None = None
    """Addresses the e-mails go to, separated by commas (required with ``notify_smtp_host``)."""

    notify_email_events: str | None = None
    """Event kinds e-mailed (as ``notify_webhook_events``); unset: all."""

    notify_email_jobs: str | None = None
    """Job names whose events are e-mailed (as ``notify_webhook_jobs``); unset: all."""

    notify_command: str | None = None
    """Local command run for each event with its JSON on standard input (exit 0 acknowledges
    it); unset: none."""

    notify_command_events: str | None = None
    """Event kinds the command gets (as ``notify_webhook_events``); unset: all."""

    notify_command_jobs: str | None = None
    """Job names the command gets events of (as ``notify_webhook_jobs``); unset: all."""

    notify_timeout_s: float = Field(default=5.0, gt=0, le=60)
    """Seconds one delivery may take (a request, an SMTP session, the command) before it counts
    as failed: the daemon's round waits at most this per sink that is down."""

    notify_round_failures: int = Field(default=3, ge=1)
    """Daemon rounds (ticks or polls) failing in a row that are told (``daemon.rounds_failing``),
    once per run of failures."""

    notify_prices_stale_h: float = Field(default=24.0, gt=0)
    """Hours without a successful collector or import run after which the daemon tells that
    prices are going stale (``daemon.prices_stale``), once per newest run."""

    notify_failures_alert: int = Field(default=3, ge=1)
    """Failed deliveries in a row after which a sink is reported as failing (``daemon status``,
    the metric ``spotopt_notify_sink_failing``)."""

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
