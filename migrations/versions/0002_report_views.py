"""Report views (price_intervals, latest_prices) and the indexes the reports' queries need.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 07:00:00

The views let psql, sqlite3, Grafana or Metabase read the history with spotopt's price
semantics: a price point holds from ``observed_at`` until the next point of the same market
(``valid_to`` NULL: still in effect). The same SQL runs on SQLite (≥ 3.25, window functions)
and PostgreSQL. When two sources observed a market at the same instant, the alphabetically
first source holds the interval and the other gets a zero-length one (``valid_from =
valid_to``), matching ``spotopt.db.queries``; time-weighted sums are unaffected.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_CATALOG_COLUMNS = """
    it.cloud AS cloud,
    m.region AS region,
    m.zone AS zone,
    it.name AS instance_type,
    m.kind AS market,
    it.gpu_model AS gpu_model,
    it.gpu_count AS gpu_count"""

PRICE_INTERVALS = f"""
CREATE VIEW price_intervals AS
SELECT
    p.market_id AS market_id,{_CATALOG_COLUMNS},
    p.observed_at AS valid_from,
    LEAD(p.observed_at) OVER (PARTITION BY p.market_id ORDER BY p.observed_at, p.source DESC) AS valid_to,
    p.usd_per_hour AS usd_per_hour,
    p.usd_per_hour / NULLIF(it.gpu_count, 0) AS usd_per_gpu_hour,
    p.source AS source
FROM price_points p
JOIN markets m ON m.id = p.market_id
JOIN instance_types it ON it.id = m.instance_type_id
"""

# One index seek per market on the primary key, instead of a window over the whole table.
LATEST_PRICES = f"""
CREATE VIEW latest_prices AS
SELECT
    m.id AS market_id,{_CATALOG_COLUMNS},
    p.observed_at AS observed_at,
    p.usd_per_hour AS usd_per_hour,
    p.usd_per_hour / NULLIF(it.gpu_count, 0) AS usd_per_gpu_hour,
    p.source AS source
FROM markets m
JOIN instance_types it ON it.id = m.instance_type_id
JOIN price_points p ON p.market_id = m.id
WHERE p.observed_at = (SELECT MAX(q.observed_at) FROM price_points q WHERE q.market_id = m.id)
  AND p.source = (
    SELECT MIN(r.source) FROM price_points r WHERE r.market_id = m.id AND r.observed_at = p.observed_at
  )
"""


def upgrade() -> None:
    # interruptions report: observations inside [since, until) across all instance types; the
    # unique constraint leads with instance_type_id, so without this every query scans the table.
    with op.batch_alter_table("interruptions", schema=None) as batch_op:
        batch_op.create_index("ix_interruptions_observed_at", ["observed_at"], unique=False)
    # interruptions report (survival): lifetimes started inside [since, until).
    with op.batch_alter_table("instance_lifetimes", schema=None) as batch_op:
        batch_op.create_index("ix_instance_lifetimes_started_at", ["started_at"], unique=False)
    op.execute(PRICE_INTERVALS)
    op.execute(LATEST_PRICES)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS latest_prices")
    op.execute("DROP VIEW IF EXISTS price_intervals")
    with op.batch_alter_table("instance_lifetimes", schema=None) as batch_op:
        batch_op.drop_index("ix_instance_lifetimes_started_at")
    with op.batch_alter_table("interruptions", schema=None) as batch_op:
        batch_op.drop_index("ix_interruptions_observed_at")
