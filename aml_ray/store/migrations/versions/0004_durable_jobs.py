"""Durable jobs: a job's lease (owner, expiry, attempts) for the database queue, and the answer
model and suite of a public row.

Revision ID: 0004_durable_jobs
Revises: 0003_stage_failed
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from aml_ray.store.models import UTCDateTime

revision = "0004_durable_jobs"
down_revision = "0003_stage_failed"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(64), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch.create_index("ix_jobs_status_created", ["status", "created_at"])
    with op.batch_alter_table("public_submissions") as batch:
        batch.add_column(sa.Column("answer_model", sa.String(200), nullable=True))
        batch.add_column(sa.Column("suite", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("public_submissions") as batch:
        batch.drop_column("suite")
        batch.drop_column("answer_model")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_status_created")
        batch.drop_column("attempts")
        batch.drop_column("lease_expires_at")
        batch.drop_column("lease_owner")
