"""Settings: one object, read from ``SPOTOPT_*`` environment variables.

Precedence for the database URL: ``--db URL`` on the command line, else ``SPOTOPT_DB_URL``,
else a SQLite file in the user's data directory (``platformdirs.user_data_dir("spotopt")``).
"""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic_settings import BaseSettings, SettingsConfigDict

from spotopt.errors import ConfigError


def default_db_url() -> str:
    """The embedded default: a SQLite file that needs no server and no set-up."""
    path = Path(platformdirs.user_data_dir("spotopt")) / "spotopt.sqlite"
    return f"sqlite:///{path}"


class Settings(BaseSettings):
    """Every user-facing setting. Each field is documented in the README's configuration table."""

    model_config = SettingsConfigDict(env_prefix="SPOTOPT_", extra="ignore")

    db_url: str | None = None
    """SQLAlchemy URL of the history database (``sqlite:///path`` or ``postgresql+psycopg://…``)."""

    auto_migrate: bool = True
    """Apply pending migrations on open for SQLite; PostgreSQL operators run ``spotopt db upgrade``."""

    def resolved_db_url(self, override: str | None = None) -> str:
        """``--db`` if given, else ``SPOTOPT_DB_URL``, else the default; ``--db ""`` is refused
        rather than quietly meaning the default database."""
        if override is not None and not override.strip():
            raise ConfigError("--db: the URL is empty; give sqlite:///PATH or postgresql://USER@HOST/DB")
        return override or self.db_url or default_db_url()

    def is_default_db(self, override: str | None = None) -> bool:
        """True when neither ``--db`` nor ``SPOTOPT_DB_URL`` names a database."""
        return not override and not self.db_url
