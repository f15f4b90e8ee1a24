"""Settings: one object, read from ``SPOTOPT_*`` environment variables.

Precedence for the database URL: ``--db URL`` on the command line, else ``SPOTOPT_DB_URL``,
else a SQLite file in the user's data directory (``platformdirs.user_data_dir("spotopt")``).
"""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic_settings import BaseSettings, SettingsConfigDict


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
        return override or self.db_url or default_db_url()
