"""Initial schema: every service table (see aml_ray/store/models.py).

Revision ID: 0001_initial
Revises: (none)
Create Date: 2026-11-30 03:11:47.340063
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0001_initial'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('admin_actions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=100), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=64), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('credentials',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('ciphertext', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('rotated_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('leaderboard_keys',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('display_prefix', sa.String(length=8), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('leaderboard_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_leaderboard_keys_key_hash'), ['key_hash'], unique=True)

    op.create_table('systems',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('key_id', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('organization', sa.String(length=200), nullable=False),
    sa.Column('division', sa.String(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['key_id'], ['leaderboard_keys.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_id', 'name')
    )
    with op.batch_alter_table('systems', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_systems_key_id'), ['key_id'], unique=False)

    op.create_table('versions',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('system_id', sa.String(length=32), nullable=False),
    sa.Column('label', sa.String(length=100), nullable=False),
    sa.Column('track', sa.String(length=32), nullable=False),
    sa.Column('add_url', sa.String(length=2000), nullable=False),
    sa.Column('search_url', sa.String(length=2000), nullable=False),
    sa.Column('health_url', sa.String(length=2000), nullable=True),
    sa.Column('add_status_url', sa.String(length=2000), nullable=True),
    sa.Column('auth_scheme', sa.String(length=16), nullable=False),
    sa.Column('credential_id', sa.String(length=32), nullable=True),
    sa.Column('max_in_flight', sa.Integer(), nullable=False),
    sa.Column('requests_per_s', sa.Float(), nullable=True),
    sa.Column('timeout_s', sa.Float(), nullable=False),
    sa.Column('repository_url', sa.String(length=500), nullable=True),
    sa.Column('commit', sa.String(length=64), nullable=True),
    sa.Column('attribution', sa.Text(), nullable=True),
    sa.Column('method_changes', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['credential_id'], ['credentials.id'], ),
    sa.ForeignKeyConstraint(['system_id'], ['systems.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('system_id', 'label', 'track')
    )
    with op.batch_alter_table('versions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_versions_system_id'), ['system_id'], unique=False)

    op.create_table('access_requests',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('existing_key_id', sa.String(length=32), nullable=True),
    sa.Column('contact_name', sa.String(length=200), nullable=False),
    sa.Column('contact_email', sa.String(length=320), nullable=False),
    sa.Column('organization', sa.String(length=200), nullable=False),
    sa.Column('system_name', sa.String(length=200), nullable=False),
    sa.Column('version_label', sa.String(length=100), nullable=False),
    sa.Column('track', sa.String(length=32), nullable=False),
    sa.Column('division', sa.String(length=32), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('public_info', sa.Text(), nullable=False),
    sa.Column('endpoints', sa.JSON(), nullable=False),
    sa.Column('credential_id', sa.String(length=32), nullable=True),
    sa.Column('repository_url', sa.String(length=500), nullable=True),
    sa.Column('commit', sa.String(length=64), nullable=True),
    sa.Column('attribution', sa.Text(), nullable=True),
    sa.Column('method_changes', sa.Text(), nullable=True),
    sa.Column('health_summary', sa.String(length=100), nullable=True),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('decided_by', sa.String(length=100), nullable=True),
    sa.Column('decision_reason', sa.Text(), nullable=True),
    sa.Column('version_id', sa.String(length=32), nullable=True),
    sa.ForeignKeyConstraint(['credential_id'], ['credentials.id'], ),
    sa.ForeignKeyConstraint(['existing_key_id'], ['leaderboard_keys.id'], ),
    sa.ForeignKeyConstraint(['version_id'], ['versions.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('jobs',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('key_id', sa.String(length=32), nullable=False),
    sa.Column('version_id', sa.String(length=32), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('track', sa.String(length=32), nullable=False),
    sa.Column('run_label', sa.String(length=100), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('stage', sa.String(length=32), nullable=False),
    sa.Column('error_summary', sa.Text(), nullable=True),
    sa.Column('checklist', sa.JSON(), nullable=True),
    sa.Column('run_dir', sa.String(length=1000), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['key_id'], ['leaderboard_keys.id'], ),
    sa.ForeignKeyConstraint(['version_id'], ['versions.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_id', 'run_label')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_key_id'), ['key_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_version_id'), ['version_id'], unique=False)

    op.create_table('job_stages',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('stage', sa.String(length=16), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('done', sa.Integer(), nullable=False),
    sa.Column('total', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id', 'stage')
    )
    with op.batch_alter_table('job_stages', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_stages_job_id'), ['job_id'], unique=False)

    op.create_table('public_submissions',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('version_id', sa.String(length=32), nullable=False),
    sa.Column('track', sa.String(length=32), nullable=False),
    sa.Column('system_name', sa.String(length=200), nullable=False),
    sa.Column('organization', sa.String(length=200), nullable=False),
    sa.Column('version_label', sa.String(length=100), nullable=False),
    sa.Column('division', sa.String(length=32), nullable=False),
    sa.Column('overall', sa.Float(), nullable=True),
    sa.Column('coverage', sa.Float(), nullable=True),
    sa.Column('per_dataset', sa.JSON(), nullable=False),
    sa.Column('published_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.ForeignKeyConstraint(['version_id'], ['versions.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id'),
    sa.UniqueConstraint('version_id', 'track')
    )
    with op.batch_alter_table('public_submissions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_public_submissions_track'), ['track'], unique=False)

    op.create_table('quota_usage',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('key_id', sa.String(length=32), nullable=False),
    sa.Column('track', sa.String(length=32), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('edition', sa.String(length=32), nullable=False),
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('charged_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.ForeignKeyConstraint(['key_id'], ['leaderboard_keys.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id')
    )
    with op.batch_alter_table('quota_usage', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_quota_usage_key_id'), ['key_id'], unique=False)

    op.create_table('results',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('table', sa.JSON(), nullable=False),
    sa.Column('overall', sa.Float(), nullable=True),
    sa.Column('coverage', sa.Float(), nullable=True),
    sa.Column('per_dataset', sa.JSON(), nullable=False),
    sa.Column('facts', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id')
    )
    op.create_table('reviews',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('job_id', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('gate', sa.JSON(), nullable=False),
    sa.Column('decided_by', sa.String(length=100), nullable=True),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id')
    )


def downgrade() -> None:
    op.drop_table('reviews')
    op.drop_table('results')
    with op.batch_alter_table('quota_usage', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_quota_usage_key_id'))

    op.drop_table('quota_usage')
    with op.batch_alter_table('public_submissions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_public_submissions_track'))

    op.drop_table('public_submissions')
    with op.batch_alter_table('job_stages', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_stages_job_id'))

    op.drop_table('job_stages')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_version_id'))
        batch_op.drop_index(batch_op.f('ix_jobs_key_id'))

    op.drop_table('jobs')
    op.drop_table('access_requests')
    with op.batch_alter_table('versions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_versions_system_id'))

    op.drop_table('versions')
    with op.batch_alter_table('systems', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_systems_key_id'))

    op.drop_table('systems')
    with op.batch_alter_table('leaderboard_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_leaderboard_keys_key_hash'))

    op.drop_table('leaderboard_keys')
    op.drop_table('credentials')
    op.drop_table('admin_actions')
