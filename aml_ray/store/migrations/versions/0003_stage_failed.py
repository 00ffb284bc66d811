"""Job stages count their failed units beside the done ones (progress says done vs failed).

Revision ID: 0003_stage_failed
Revises: 0002_job_conformance
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_stage_failed"
down_revision = "0002_job_conformance"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_stages") as batch:
        batch.add_column(sa.Column("failed", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("job_stages") as batch:
        batch.drop_column("failed")
