"""Submitter delivery: an access request's status-token hash and its held, encrypted key;
benchmark proposals.

Revision ID: 0005_page_delivery
Revises: 0004_durable_jobs
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0005_page_delivery"
down_revision = "0004_durable_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "access_request_delivery",
        sa.Column("request_id", sa.String(32), sa.ForeignKey("access_requests.id"), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("key_ciphertext", sa.Text(), nullable=True),
        sa.Column("key_delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_access_request_delivery_token_hash", "access_request_delivery", ["token_hash"], unique=True)
    op.create_table(
        "benchmark_proposals",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("contact_name", sa.String(200), nullable=False),
        sa.Column("contact_email", sa.String(320), nullable=False),
        sa.Column("benchmark_name", sa.String(200), nullable=False),
        sa.Column("track", sa.String(32), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("dataset_context", sa.Text(), nullable=False),
        sa.Column("evaluation_goal", sa.Text(), nullable=False),
        sa.Column("metrics", sa.Text(), nullable=False),
        sa.Column("provenance", sa.Text(), nullable=False),
        sa.Column("source_url", sa.String(500), nullable=False),
        sa.Column("package", sa.Text(), nullable=False),
        sa.Column("license", sa.String(200), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("benchmark_proposals")
    op.drop_index("ix_access_request_delivery_token_hash", "access_request_delivery")
    op.drop_table("access_request_delivery")
