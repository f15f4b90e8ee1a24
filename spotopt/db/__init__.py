"""The SQL history: models, engine/session, migrations and the queries that read it."""
