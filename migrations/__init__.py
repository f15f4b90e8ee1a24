"""Alembic revisions of the spotopt schema (shipped in the wheel as ``spotopt.migrations``)."""
