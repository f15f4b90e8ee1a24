"""Schema v1: catalog, markets, price points, interruptions, lifetimes, runs, watermarks, throughputs.

Revision ID: 0001
Revises:
Create Date: 2026-11-21 06:30:38.114970
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "instance_types",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cloud", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("gpu_model", sa.String(length=32), nullable=True),
        sa.Column("gpu_count", sa.Float(), nullable=True),
        sa.Column("gpu_memory_gib", sa.Float(), nullable=True),
        sa.Column("vcpus", sa.Integer(), nullable=True),
        sa.Column("memory_gib", sa.Float(), nullable=True),
        sa.Column("retired", sa.Boolean(), nullable=False),
        sa.Column("gpu_name_raw", sa.String(length=64), nullable=True),
        sa.Column("origin", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_types")),
        sa.UniqueConstraint("cloud", "name", name=op.f("uq_instance_types_cloud")),
    )
    with op.batch_alter_table("instance_types", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_instance_types_gpu_model"), ["gpu_model"], unique=False)

    op.create_table(
        "meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_meta")),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("inserted", sa.Integer(), nullable=False),
        sa.Column("duplicate", sa.Integer(), nullable=False),
        sa.Column("conflicting", sa.Integer(), nullable=False),
        sa.Column("rejected", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("rejections", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_source_started", ["source", "started_at"], unique=False)

    op.create_table(
        "throughputs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload", sa.String(length=128), nullable=False),
        sa.Column("gpu_model", sa.String(length=32), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("steps_per_s", sa.Float(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_throughputs")),
        sa.UniqueConstraint(
            "workload", "gpu_model", "gpu_count", "source", name=op.f("uq_throughputs_workload")
        ),
    )
    op.create_table(
        "watermarks",
        sa.Column("collector", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=255), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("collector", "scope", name=op.f("pk_watermarks")),
    )
    op.create_table(
        "interruptions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_type_id", sa.Integer(), nullable=False),
        sa.Column("region", sa.String(length=32), nullable=False),
        sa.Column("zone", sa.String(length=32), nullable=False),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("raw", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["instance_type_id"],
            ["instance_types.id"],
            name=op.f("fk_interruptions_instance_type_id_instance_types"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_interruptions")),
        sa.UniqueConstraint(
            "instance_type_id",
            "region",
            "zone",
            "kind",
            "observed_at",
            "source",
            name=op.f("uq_interruptions_instance_type_id"),
        ),
    )
    op.create_table(
        "markets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_type_id", sa.Integer(), nullable=False),
        sa.Column("region", sa.String(length=32), nullable=False),
        sa.Column("zone", sa.String(length=32), nullable=False),
        sa.Column("zone_id", sa.String(length=32), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["instance_type_id"],
            ["instance_types.id"],
            name=op.f("fk_markets_instance_type_id_instance_types"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_markets")),
        sa.UniqueConstraint(
            "instance_type_id", "region", "zone", "kind", name=op.f("uq_markets_instance_type_id")
        ),
    )
    op.create_table(
        "instance_lifetimes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("market_id", sa.Integer(), nullable=False),
        sa.Column("instance_ref", sa.String(length=128), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=16), nullable=True),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(
            ["market_id"], ["markets.id"], name=op.f("fk_instance_lifetimes_market_id_markets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_lifetimes")),
        sa.UniqueConstraint(
            "market_id", "instance_ref", "source", name=op.f("uq_instance_lifetimes_market_id")
        ),
    )
    with op.batch_alter_table("instance_lifetimes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_instance_lifetimes_market_id"), ["market_id"], unique=False)

    op.create_table(
        "price_points",
        sa.Column("market_id", sa.Integer(), nullable=False),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("usd_per_hour", sa.Float(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["market_id"], ["markets.id"], name=op.f("fk_price_points_market_id_markets")
        ),
        sa.PrimaryKeyConstraint("market_id", "observed_at", "source", name=op.f("pk_price_points")),
    )
    with op.batch_alter_table("price_points", schema=None) as batch_op:
        batch_op.create_index("ix_price_points_observed_at", ["observed_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("price_points", schema=None) as batch_op:
        batch_op.drop_index("ix_price_points_observed_at")

    op.drop_table("price_points")
    with op.batch_alter_table("instance_lifetimes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_instance_lifetimes_market_id"))

    op.drop_table("instance_lifetimes")
    op.drop_table("markets")
    op.drop_table("interruptions")
    op.drop_table("watermarks")
    op.drop_table("throughputs")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_source_started")

    op.drop_table("runs")
    op.drop_table("meta")
    with op.batch_alter_table("instance_types", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_instance_types_gpu_model"))

    op.drop_table("instance_types")
