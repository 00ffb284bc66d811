"""Jobs keep each bundle's outcome (status, progress, scores, the cause of a failure) as they run.

Revision ID: 0006_job_bundles
Revises: 0005_page_delivery
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_job_bundles"
down_revision = "0005_page_delivery"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("bundles", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("bundles")
