"""initial run state

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

STATUSES = ('queued', 'running', 'succeeded', 'failed', 'cancelled')


def _status(name: str) -> sa.Enum:
    return sa.Enum(*STATUSES, name=name, native_enum=False, create_constraint=True, length=16)


revision: str = '0001'
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table('experiments',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('status', _status('experiment_status'), nullable=False),
    sa.Column('configs', sa.JSON(), nullable=False),
    sa.Column('seed', sa.BigInteger(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('request_hash', sa.String(length=64), nullable=False),
    sa.Column('out_dir', sa.String(length=1000), nullable=False),
    sa.Column('sweep_id', sa.String(length=40), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_experiments')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_experiments_idempotency_key'))
    )
    op.create_index(op.f('ix_experiments_status'), 'experiments', ['status'], unique=False)
    op.create_index(op.f('ix_experiments_sweep_id'), 'experiments', ['sweep_id'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('kind', sa.String(length=40), nullable=False),
    sa.Column('status', _status('job_status'), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs'))
    )
    op.create_index(op.f('ix_jobs_kind'), 'jobs', ['kind'], unique=False)

    op.create_table('scenario_runs',
    sa.Column('id', sa.String(length=60), nullable=False),
    sa.Column('experiment_id', sa.String(length=40), nullable=False),
    sa.Column('scenario', sa.String(length=20), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('status', _status('run_status'), nullable=False),
    sa.Column('lease_owner', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(), nullable=True),
    sa.Column('next_window', sa.Integer(), nullable=False),
    sa.Column('n_windows', sa.Integer(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=True),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.Column('compute_s', sa.Float(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('result_row', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'],
                            name=op.f('fk_scenario_runs_experiment_id_experiments'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_scenario_runs')),
    sa.UniqueConstraint('experiment_id', 'scenario', name=op.f('uq_scenario_runs_experiment_id'))
    )
    op.create_index(op.f('ix_scenario_runs_experiment_id'), 'scenario_runs', ['experiment_id'], unique=False)
    op.create_index(op.f('ix_scenario_runs_status'), 'scenario_runs', ['status'], unique=False)

    op.create_table('windows',
    sa.Column('run_id', sa.String(length=60), nullable=False),
    sa.Column('window', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('snapshot', sa.JSON(), nullable=False),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('frontier', sa.JSON(), nullable=True),
    sa.Column('worker', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['scenario_runs.id'],
                            name=op.f('fk_windows_run_id_scenario_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'window', name=op.f('pk_windows'))
    )


def downgrade() -> None:
    op.drop_table('windows')
    op.drop_index(op.f('ix_scenario_runs_status'), table_name='scenario_runs')
    op.drop_index(op.f('ix_scenario_runs_experiment_id'), table_name='scenario_runs')

    op.drop_table('scenario_runs')
    op.drop_index(op.f('ix_jobs_kind'), table_name='jobs')

    op.drop_table('jobs')
    op.drop_index(op.f('ix_experiments_sweep_id'), table_name='experiments')
    op.drop_index(op.f('ix_experiments_status'), table_name='experiments')

    op.drop_table('experiments')
