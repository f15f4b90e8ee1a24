"""The SQL history and what fills and reads it: collection runs, ingest, importers of dump files,
the bundled catalog's sync, the market snapshot at t and the stored throughput figures.

Layering: ``history`` sits above ``db`` (models, engine, queries, migrations) and the collectors
(which yield records and never touch the database); the decision layer reads through it.
"""
